"""Concept 3: a straggler. What happens when one GPU (rank) is slower?

DDP's backward ends only when every bucket is all-reduced, and an all-reduce completes only
when EVERY rank has contributed. So the fast ranks sit idle inside backward() until the slowest
rank arrives: each step takes as long as the slowest rank's step. Here the last rank sleeps
--delay seconds per step (think: a slower GPU, a busy data loader, thermal throttling).
"""

import argparse
import statistics
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.demo import finish, gather, start, write_json

p = argparse.ArgumentParser()
p.add_argument("--delay", type=float, default=0.4, help="seconds the slow rank sleeps per step")
p.add_argument("--steps", type=int, default=3)
p.add_argument("--out", default="outputs/concepts/03_straggler.json")
args = p.parse_args()

ctx = start(timeout_s=60)
device = ctx.device
slow = ctx.rank == ctx.world - 1

torch.manual_seed(0)
ddp = DDP(torch.nn.Linear(64, 64).to(device), device_ids=ctx.device_ids)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)


def sync():
    if device.type == "cuda":
        torch.cuda.synchronize(device)


rows = []
for step in range(args.steps + 1):  # step 0: warm-up, not timed
    t0 = time.perf_counter()
    loss = ddp(torch.randn(16, 64, device=device)).pow(2).mean()
    if slow and step > 0:
        time.sleep(args.delay)          # the straggler's extra work
    sync()
    t1 = time.perf_counter()
    loss.backward()                     # gradient all-reduce: waits for every rank
    sync()
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad()
    if step > 0:
        rows.append({"compute_s": t1 - t0, "backward_s": t2 - t1, "step_s": time.perf_counter() - t0})

summary = {k: statistics.median(r[k] for r in rows) for k in rows[0]}  # the median step of the timed ones
everyone = gather({"rank": ctx.rank, "slow": slow, **summary})
write_json(args.out, {"delay": args.delay, "world_size": ctx.world, "ranks": everyone}, ctx.rank)
del ddp  # free DDP (it holds the group and in-flight work) before the group goes
finish()
