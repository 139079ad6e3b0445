"""distrinews_lib: the plumbing behind the DistriNews course's training scripts, its server and a learner's own script.

The DDP ideas stay in the course's scripts; this package holds what is not the lesson. Its layout is its
architecture. The core is what the training scripts import: plan.py (every run-wide decision, made once), the
packages training/, data/ and models/, checkpoint.py and checkpoint_format.py, and under them errors.py, files.py,
hub.py, machine.py, devices.py and process_group/ (a process in torch's process group, one concern a module: setup,
ranks, collectives, ending; distributed.py hands them to a script in one import). Beside the core and depending on
it: serving/ (the HTTP server, which imports nothing of training/ or process_group/) and lm/ (language modelling as a
task), which the core loads at one place, tasks.py, and only for a run that asks for --task clm or mlm. Every other
option is loaded the same way, where it is chosen: the hub's datasets, synthetic data, a CSV with a header, the hash
tokenizer, the custom model, a pretrained one, bf16 emulated on a CPU, the trackers, an experiment's record, a
checkpoint read back (tests/test_run_imports.py lists what a default run imports). The course's own machinery
(checkers, races, cost models, site, launchers) and the benchmarks' are another package, distrinews_course, which
imports this one and is never imported by it.
"""

__version__ = "0.1.0"
