"""One slow rank: rank 1 reads its batches from a slower disk (--read_ms longer than the others).

Nothing hangs and nothing fails. Each step ends in an all-reduce, which completes when the LAST rank arrives: the
fast ranks wait for rank 1 at every step, and the whole job runs at rank 1's speed. No timeout fires, so no tool
that waits for one says anything; what shows it is when each rank arrives at each collective.
Fix: the batches are read ahead, several at a time, in background threads (as a DataLoader's workers do): a slow read
overlaps the reads after it and the step's compute.
"""

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.demo import finish, result, start

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed"], required=True)
p.add_argument("--steps", type=int, default=16)
p.add_argument("--read_ms", type=float, default=80, help="how much longer each of rank 1's reads takes")
p.add_argument("--readers", type=int, default=8, help="fixed: batches read ahead at a time")
p.add_argument("--ddp_timeout", type=float, default=30, help="seconds a collective may wait before it fails")
args = p.parse_args()


def read_batch(step, rank):
    time.sleep((5 + (args.read_ms if rank == 1 else 0)) / 1000)  # the disk: rank 1's is slower
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(512, 512, generator=g), torch.randint(0, 4, (512,), generator=g)


ctx = start(timeout_s=args.ddp_timeout)
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
if args.mode == "broken":
    batches = (read_batch(step, ctx.rank) for step in range(args.steps))   # BUG: each read inside its step
else:
    ahead = ThreadPoolExecutor(args.readers)                                # THE FIX: reads run ahead, in threads
    batches = (f.result() for f in [ahead.submit(read_batch, s, ctx.rank) for s in range(args.steps)])
t0 = time.perf_counter()
for x, y in batches:
    F.cross_entropy(model(x), y).backward()            # DDP all-reduces the gradients: it waits for the last rank
    opt.step()
    opt.zero_grad()
result(ctx, mode=args.mode, finished=True, step_ms=f"{1000 * (time.perf_counter() - t0) / args.steps:.1f}")
del model
finish()
