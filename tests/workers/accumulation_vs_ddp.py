"""Run under torchrun with 2 gloo ranks: chapter 04's exercise 2, the reference and each wrong answer, under a REAL
DDP, recording which micro-batch's backward all-reduced (a communication hook counts) and how many optimizer steps
ran. Rank 0 writes {name: {"synced": [...], "steps": n}} to argv[1]; tests/test_pitfall_exercises.py holds the
checker's stand-in DDP to the same record."""

import importlib.util
import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from accumulation_mutants import MUTANTS  # this folder: torchrun puts the script's folder on sys.path
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.pitfall_exercises import CountingSGD, _micro_batches

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("answers_04", ROOT / "notebooks" / "answers" / "04_pitfalls.py")
answers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(answers)

torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
record = {}
for fn in [answers.accumulate_step, *MUTANTS]:
    for k in (4, 1):
        torch.manual_seed(0)
        events = []  # "forward" per forward, "allreduce" per bucket all-reduced

        class Recorded(DDP):
            def forward(self, *args, **kwargs):
                events.append("forward")
                return super().forward(*args, **kwargs)

        def counting(state, bucket):
            events.append("allreduce")
            return default_hooks.allreduce_hook(None, bucket)

        model = Recorded(torch.nn.Linear(6, 3))
        model.register_comm_hook(None, counting)
        optimizer = CountingSGD(model.parameters(), 0.5)
        fn(model, optimizer, _micro_batches(k, 4, seed=dist.get_rank()), torch.nn.functional.cross_entropy)
        # per forward: whether an all-reduce came before the next forward (its backward synced)
        synced, current = [], None
        for event in events:
            if event == "forward":
                if current is not None:
                    synced.append(current)
                current = False
            elif current is not None:
                current = True
        synced.append(bool(current))
        record[f"{fn.__name__}/{k}"] = {"synced": synced, "steps": optimizer.steps}
        del model
dist.barrier()
if dist.get_rank() == 0:
    Path(sys.argv[1]).write_text(json.dumps(record, indent=1))
dist.destroy_process_group()
