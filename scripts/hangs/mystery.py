"""A training job that hangs near its end, on 3 ranks. Chapter 12's exercise: find the rank and the collective with
the tools, from what they show while it hangs, before you read this file."""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.demo import finish, result, start

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=8)
p.add_argument("--target", type=float, default=0.58, help="stop once the validation loss is below this")
p.add_argument("--ddp_timeout", type=float, default=30, help="seconds a collective may wait before it fails")
args = p.parse_args()

ctx = start(timeout_s=args.ddp_timeout)
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.5)
truth = torch.randn(16, 4, generator=torch.Generator().manual_seed(7))
data = torch.Generator().manual_seed(ctx.rank)


def shard(n, noise):
    x = torch.randn(n, 16, generator=data)
    return x, (x @ truth + noise * torch.randn(n, 4, generator=data)).argmax(1)


noise = [1.5, 0.3, 1.0][ctx.rank % 3]                  # how clean each rank's shard is
train, val = [shard(32, noise) for _ in range(4)], shard(256, noise)
for epoch in range(args.epochs):
    for x, y in train:
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        val_loss = F.cross_entropy(model(val[0]), val[1]).item()
    if val_loss < args.target:
        result(ctx, stopped_early_at_epoch=epoch)
        break
dist.barrier()                                         # everyone done: rank 0 saves
if ctx.rank == 0:
    torch.save(model.module.state_dict(), "outputs/hangs/mystery.pt")
result(ctx, finished=True)
del model
finish()
