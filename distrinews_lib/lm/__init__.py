"""Language modelling on the course's DDP plumbing, beside the core (which loads it only for an LM run): --task clm (a
small GPT-2 predicting the next token) and --task mlm (a DistilBERT filling in masked tokens). task.py holds the two
tasks (their model, loss and evaluation), data.py the blocks, the vocabulary and the masking, inference.py loading a
checkpoint and generating text. distrinews_lib/tasks.py registers them beside classification: the core's one import
of them, made when --task asks for one."""
