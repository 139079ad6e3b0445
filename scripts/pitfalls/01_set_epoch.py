"""Pitfall 1: forgetting sampler.set_epoch(epoch).

DistributedSampler shuffles with a seed derived from (seed, epoch). Without set_epoch the epoch
stays 0, so every epoch replays exactly the same order on every rank.
"""

import argparse

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from distrinews_course.demo import finish, gather, result, start, write_json

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed", "both"], default="both")
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--n", type=int, default=16, help="samples; each one is its own index, so the order shows")
p.add_argument("--out", default="outputs/pitfalls/01_set_epoch.json")
args = p.parse_args()

ctx = start()
dataset = TensorDataset(torch.arange(args.n))


def epoch_orders(call_set_epoch: bool) -> list:
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    orders = []
    for epoch in range(args.epochs):
        if call_set_epoch:
            sampler.set_epoch(epoch)  # THE FIX: a new permutation each epoch
        orders.append(torch.cat([x for (x,) in loader]).tolist())
    return orders


report = {}
for mode in (["broken", "fixed"] if args.mode == "both" else [args.mode]):
    mine = epoch_orders(call_set_epoch=(mode == "fixed"))
    distinct = len({tuple(o) for o in mine})
    result(ctx, mode=mode, distinct_orders=f"{distinct}/{args.epochs}", epoch0=mine[0], epoch1=mine[1])
    per_rank = gather(mine)
    report[mode] = {
        "orders_per_rank": per_rank,
        "distinct_orders_per_rank": [len({tuple(o) for o in orders}) for orders in per_rank],
        # every epoch still covers every sample exactly once across the ranks
        "each_epoch_covers_all": all(sorted(sum((orders[e] for orders in per_rank), [])) == list(range(args.n))
                                     for e in range(args.epochs)),
    }
write_json(args.out, {"world_size": ctx.world, "epochs": args.epochs, "n": args.n, **report}, ctx.rank)
finish()
