"""Under torchrun with 2 gloo ranks: perplexity is exact under DDP, and the ranks' masks differ at every step.
Rank 0 writes a JSON of what it measured for tests/test_lm.py."""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from distrinews_lib.data import sources, tokenization
from distrinews_lib.data.tokenization import tiny_tokenizer
from distrinews_lib.lm import data as lm
from distrinews_lib.lm.task import LM_TASKS, MLM
from distrinews_lib.training import evaluation

out = sys.argv[1]
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
try:
    wp = tiny_tokenizer()
    splits = sources.load_embedded()
    ids = [x[1:-1] for x in tokenization.tokenize_texts(splits.test_texts[:300], wp, 64, use_cache=False)]
    voc = lm.VocabSubset.from_corpus(wp, ids, 512)
    blocks = lm.BlockDataset(lm.pack([voc.encode(x) for x in ids], 16, voc.sep_token_id)[:101])  # odd: the sampler pads
    result = {"blocks": len(blocks)}
    for name, task in LM_TASKS.items():  # clm, mlm
        model, _ = task.build_model(voc, 16, seed=0)
        sampler = DistributedSampler(blocks, num_replicas=world, rank=rank, shuffle=False)
        loader = DataLoader(
            blocks, batch_size=8, sampler=sampler, collate_fn=lm.LMCollator(task, voc, seed=5, fixed_epoch=0)
        )
        ddp = evaluation.evaluate(model, loader, device=torch.device("cpu"), task=task)
        if rank == 0:  # the same weights, one process, the whole set
            whole = DataLoader(blocks, batch_size=13, collate_fn=lm.LMCollator(task, voc, seed=5, fixed_epoch=0))
            # gather=False: rank 0 alone, no collective. (Patching is_initialized no longer reached the gather, so
            # rank 0's extra all_gathers met rank 1's next ones: a collective mismatch, or wrong data silently.)
            single = evaluation.evaluate(model, whole, device=torch.device("cpu"), task=task, gather=False)
            result[name] = {"ddp": ddp.__dict__, "single": single.__dict__}
    # masks at the same step on both ranks, over two epochs, in training order
    train_sampler = DistributedSampler(blocks, num_replicas=world, rank=rank, shuffle=True, seed=3)
    collate = lm.LMCollator(MLM, voc, seed=5, sampler=train_sampler)
    masks = []
    for epoch in (1, 2):
        train_sampler.set_epoch(epoch)
        for batch in DataLoader(blocks, batch_size=8, sampler=train_sampler, collate_fn=collate):
            masks.append([batch["index"].tolist(), (batch["labels"] != lm.IGNORE).int().tolist()])
    everyone = [None] * world
    dist.all_gather_object(everyone, masks)
    if rank == 0:
        result["masks"] = everyone
        with open(out, "w") as f:
            json.dump(result, f)
    dist.barrier()
finally:
    dist.destroy_process_group()
