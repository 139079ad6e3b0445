"""Run the course's training scripts UNCHANGED, many times in ONE torchrun launch, and time a window of
their optimizer steps (distrinews_lib.bench.harness). The measuring tool of chapters 05 and 09.

    torchrun --nproc_per_node=2 scripts/bench_runs.py RESULTS.json RUNS.json

RUNS.json maps a name to a run: {"world": 1 or N, "warmup": W, "steps": S, "flags": [...]}, and optionally
"hook" (fp16, bf16 or powersgd: one of torch's gradient compression hooks) and "straggler_ms" (the last
rank sleeps that long after each optimizer step). A run with "world": 1 is scripts/train_single.py on
rank 0 alone (the other ranks wait: one device); any other run is scripts/train_ddp.py on every rank,
with every gradient bucket's all-reduce timed and every byte sent counted.
"""
import json
import sys
import time

import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

from distrinews_lib.bench import harness, throughput

results_path, runs = sys.argv[1], json.loads(open(sys.argv[2]).read())
results = {}
with harness.shared_process_group():
    rank, world = dist.get_rank(), dist.get_world_size()
    for name, run in runs.items():
        window = None
        if run["world"] == 1:
            if rank == 0:
                with harness.alone():
                    window = harness.run("scripts/train_single.py", run["flags"], warmup=run["warmup"], steps=run["steps"])
            dist.barrier()
        else:
            slow = rank == world - 1 and run.get("straggler_ms")
            hook = register_optimizer_step_post_hook(lambda *_: time.sleep(run["straggler_ms"] / 1000)) if slow else None
            window = harness.run("scripts/train_ddp.py", run["flags"], warmup=run["warmup"], steps=run["steps"],
                                 comm=True, hook=run.get("hook"))
            if hook:
                hook.remove()
        everyone = [None] * world
        dist.all_gather_object(everyone, window.result() if window else None)
        ranks = [r for r in everyone if r]
        if rank == 0:
            total = throughput.over_ranks(ranks)  # the run lasts as long as its slowest rank; samples add up
            results[name] = {**run, "ranks": ranks, **{k: total[k] for k in ("seconds", "samples", "samples_per_s")}}
            print(f"[bench_runs] {name}: {total['samples']} samples in {total['seconds']:.2f} s = "
                  f"{total['samples_per_s']:.0f} samples/s", flush=True)
    if rank == 0:
        with open(results_path, "w") as f:
            json.dump(results, f, indent=1)
