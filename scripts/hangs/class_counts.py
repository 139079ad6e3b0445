"""A collective whose shape differs between ranks: class counts from torch.bincount.

Each step, every rank counts the classes in its batch and the ranks all-reduce the counts, to log the class balance
of the global batch. torch.bincount returns as many counts as the largest label it SAW, plus one: a batch with no
example of the last class (a rare class; here rank 1's batch at --rare_step) gives a shorter tensor on that rank.
The ranks then all-reduce tensors of different shapes: gloo mixes them up and then waits for ever, NCCL may read past
the end. TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective's shapes across the ranks before it runs. (The script
averages its gradients itself, as chapter 03 does: torch 2.13's DDP crashes in its constructor under DETAIL on gloo.)
Fix: torch.bincount(labels, minlength=CLASSES): the same shape on every rank, whatever the batch holds.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F

from distrinews_course.demo import finish, result, start

CLASSES = 4
p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed"], required=True)
p.add_argument("--steps", type=int, default=6)
p.add_argument("--rare_step", type=int, default=3, help="the step whose batch on rank 1 lacks the last class")
p.add_argument("--ddp_timeout", type=float, default=30, help="seconds a collective may wait before it fails")
args = p.parse_args()

ctx = start(timeout_s=args.ddp_timeout)
torch.manual_seed(0)
model = torch.nn.Linear(16, CLASSES)                   # the same initial weights on every rank (same seed)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.steps):
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * step + ctx.rank))
    y = torch.arange(8) % CLASSES                      # every class, twice...
    if ctx.rank == 1 and step == args.rare_step:
        y[y == CLASSES - 1] = 0                        # ...but this batch has none of the last class
    F.cross_entropy(model(x), y).backward()
    for p in model.parameters():                       # average the gradients over the ranks, as DDP would
        dist.all_reduce(p.grad)
        p.grad /= ctx.world
    opt.step()
    opt.zero_grad()
    if args.mode == "broken":
        counts = torch.bincount(y)                     # BUG: as long as the largest label in THIS batch, plus one
    else:
        counts = torch.bincount(y, minlength=CLASSES)  # THE FIX: CLASSES counts on every rank
    dist.all_reduce(counts)                            # the global batch's class balance, for the log
    result(ctx, step=step, counts=counts.tolist())
result(ctx, mode=args.mode, finished=True)
finish()
