"""A rank dies in the middle of a step: one record of its shard cannot be parsed.

The other ranks wait for its gradients in the step's all-reduce. On gloo the dead rank's closed connection fails
them at once; on NCCL they can wait for the whole timeout. torchrun then stops every rank and names the one that
failed first, the "Root Cause"; with @record on main(), that rank's traceback is written to an error file torchrun
prints and keeps.
Fix: the loader skips a record it cannot parse (and counts it), on whichever rank meets it: the step goes on.
"""

import argparse
import os
import signal

import torch
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.demo import finish, result, start

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed"], required=True)
p.add_argument("--dead_rank", type=int, default=1, help="the rank whose shard holds the corrupt record")
p.add_argument("--bad_step", type=int, default=2, help="the step that reads it")
p.add_argument("--steps", type=int, default=5)
p.add_argument("--killed", action="store_true", help="the rank is killed (as by the OOM killer) instead of raising")
p.add_argument("--ddp_timeout", type=float, default=30, help="seconds a collective may wait before it fails")
args = p.parse_args()


def read_batch(step, rank):
    """8 records 'x1,...,x16;label' of this rank's shard, parsed into tensors."""
    g = torch.Generator().manual_seed(100 * step + rank)
    lines = [",".join(f"{v:.3f}" for v in torch.randn(16, generator=g).tolist()) + f";{i % 4}" for i in range(8)]
    if rank == args.dead_rank and step == args.bad_step:
        lines[5] = lines[5][:40]                         # a record cut short on the disk
        if args.killed:
            os.kill(os.getpid(), signal.SIGKILL)         # or: the kernel's out-of-memory killer ends the rank
    rows, labels, skipped = [], [], 0
    for line in lines:
        try:
            values, label = line.split(";")
            rows.append([float(v) for v in values.split(",")])
            labels.append(int(label))
        except ValueError:
            if args.mode == "broken":
                raise                                    # BUG: one bad record kills this rank mid-step
            skipped += 1                                 # THE FIX: skip it, and say how many were skipped
    return torch.tensor(rows), torch.tensor(labels), skipped


@record  # torchrun's error file: the traceback of the rank that failed first
def main():
    ctx = start(timeout_s=args.ddp_timeout)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(args.steps):
        x, y, skipped = read_batch(step, ctx.rank)
        F.cross_entropy(model(x), y).backward()          # DDP all-reduces the gradients: every rank must be here
        opt.step()
        opt.zero_grad()
        result(ctx, step=step, skipped=skipped)
    result(ctx, mode=args.mode, finished=True)
    del model
    finish()


main()
