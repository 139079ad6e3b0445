"""Pitfall 2: a DDP run without DistributedSampler.

A plain DataLoader gives EVERY rank the WHOLE dataset. Each rank does as many steps as one
process would, the ranks average gradients of the same samples, and N GPUs finish an epoch no
sooner than one: N-fold duplicated work. DistributedSampler gives each rank a disjoint 1/N shard.
"""

import argparse
from collections import Counter

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from distrinews_course.demo import finish, gather, result, start, write_json

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed", "both"], default="both")
p.add_argument("--n", type=int, default=48)
p.add_argument("--batch_size", type=int, default=8)
p.add_argument("--out", default="outputs/pitfalls/02_no_sampler.json")
args = p.parse_args()

ctx = start()
dataset = TensorDataset(torch.arange(args.n))

report = {}
for mode in (["broken", "fixed"] if args.mode == "both" else [args.mode]):
    if mode == "broken":
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)  # BUG: every rank gets all samples
    else:
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)             # THE FIX: a 1/N shard each
        sampler.set_epoch(0)
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    seen, steps = [], 0
    for (x,) in loader:  # one epoch; a real loop would do forward/backward here
        seen += x.tolist()
        steps += 1
    result(ctx, mode=mode, samples_seen=len(seen), steps=steps)
    everyone = gather({"seen": seen, "steps": steps})
    counts = Counter(i for r in everyone for i in r["seen"])
    report[mode] = {
        "samples_per_rank": [len(r["seen"]) for r in everyone],
        "steps_per_rank": [r["steps"] for r in everyone],
        "total_processed": sum(counts.values()),
        "distinct_samples": len(counts),
        "duplication": sum(counts.values()) / len(counts),  # 1.0 = each sample once per epoch
    }
write_json(args.out, {"world_size": ctx.world, "n": args.n, "batch_size": args.batch_size,
                      "single_process_steps": -(-args.n // args.batch_size), **report}, ctx.rank)
finish()
