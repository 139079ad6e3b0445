"""Rank 0 saves a checkpoint while the other ranks wait for it at a barrier, for longer than the group's timeout.

Saving on rank 0 only is right (one writer), and so is making the others wait for the file. But a barrier is a
collective: it fails after the process group's timeout (30 minutes on gloo by default, 10 on NCCL), and a large
checkpoint on a slow disk, or an evaluation on rank 0, can take longer. The waiting ranks die of a timeout that names
nobody, while rank 0 was fine, only slow (torchtune #2093, LlamaFactory #7396).
Fix: the wait for the save gets a group of its own, with a timeout that fits the save.
--mode monitored: the same wait as dist.monitored_barrier, which names the rank that did not arrive (gloo only).
"""

import argparse
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.demo import finish, result, start

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed", "monitored"], required=True)
p.add_argument("--save_s", type=float, default=6, help="how long rank 0's save takes")
p.add_argument("--ddp_timeout", type=float, default=30, help="seconds a collective may wait before it fails")
p.add_argument("--path", default="outputs/hangs/slow_save.pt")
args = p.parse_args()


def save_checkpoint(model, path, seconds):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.module.state_dict(), path)
    time.sleep(seconds)                                # a slow network disk: the sleep stands for it


ctx = start(timeout_s=args.ddp_timeout)
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    F.cross_entropy(model(torch.randn(8, 16)), torch.arange(8) % 4).backward()
    opt.step()
    opt.zero_grad()
save_wait = dist.new_group(timeout=timedelta(seconds=3 * args.save_s))  # FIX: a wait as long as the save needs
t0 = time.perf_counter()
if ctx.rank == 0:
    save_checkpoint(model, args.path, args.save_s)     # rank 0 writes; the others wait for it
if args.mode == "broken":
    dist.barrier()                                     # BUG: waits only as long as the group's timeout
elif args.mode == "monitored":
    dist.monitored_barrier(timeout=timedelta(seconds=args.ddp_timeout))  # names the rank that did not arrive
else:
    dist.barrier(group=save_wait)                      # THE FIX: waits as long as the save takes
result(ctx, mode=args.mode, finished=True, waited_s=f"{time.perf_counter() - t0:.1f}")
del model
finish()
