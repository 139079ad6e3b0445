"""Pitfall 3: printing (and logging) on every rank.

Each rank runs the same script, so a bare print() appears N times, interleaved, and each copy
shows that rank's LOCAL loss: N different numbers for "the" loss of one epoch. Fix: all-reduce
the number you report, then print on rank 0 only.
"""

import argparse

import torch
import torch.distributed as dist

from distrinews_course.demo import finish, start

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed", "both"], default="both")
p.add_argument("--epochs", type=int, default=3)
args = p.parse_args()

ctx = start()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1).to(ctx.device)  # the same model on every rank, as DDP makes it

for mode in (["broken", "fixed"] if args.mode == "both" else [args.mode]):
    torch.manual_seed(1 + ctx.rank)  # each rank draws its own data, the same in both modes: the losses compare
    for epoch in range(args.epochs):
        x = torch.randn(32, 8, device=ctx.device)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).detach()
        if mode == "broken":
            print(f"[broken] epoch {epoch} loss {loss.item():.4f}", flush=True)  # BUG: every rank prints its own loss
        else:
            dist.all_reduce(loss)             # THE FIX, part 1: the global mean...
            loss /= ctx.world
            if ctx.rank == 0:                 # THE FIX, part 2: on rank 0 only (distrinews_lib.distributed.print0)
                print(f"[fixed] epoch {epoch} loss {loss.item():.4f}", flush=True)  # THE FIX: printed once
    dist.barrier()  # keep the two demos apart in the output
finish()
