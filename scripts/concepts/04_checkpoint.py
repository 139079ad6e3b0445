"""Concept 4: a checkpoint in distributed training. Every rank holds the same weights, so ONE rank saves: rank 0
writes the UNWRAPPED model (no `module.` prefix: it loads into a plain model), the optimizer state and the epoch,
atomically; the others wait at a barrier. Every rank loads with map_location: its own device."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.checkpoint_watch import Apart, report, train_a_little
from distrinews_course.demo import finish, start
from distrinews_lib.checkpoint import unwrap

ctx, path = start(timeout_s=60), "outputs/concepts/04_checkpoint.pt"
apart = Apart()  # apart(name, model): how far every rank's weights are from rank 0's, noted for the notebook
make_model = lambda: torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))  # noqa: E731

torch.manual_seed(ctx.rank)  # deliberately different starting weights: DDP broadcasts rank 0's at wrap time
model = make_model().to(ctx.device)
apart("before_wrap", model)                        # > 0: each rank's own seed gave it other weights
ddp = DDP(model, device_ids=ctx.device_ids)
apart("at_wrap", ddp)                              # 0.0: the wrap made every rank's copy equal to rank 0's
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
train_a_little(ddp, opt, steps=3)                  # different data per rank: the weights move

if ctx.rank == 0:                                  # ONE writer
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save({"model": unwrap(ddp).state_dict(),  # unwrapped: keys without "module."
                "optimizer": opt.state_dict(), "epoch": 1,
                "writer": {"rank": ctx.rank, "pid": os.getpid()}}, path + ".tmp")  # who wrote it
    os.replace(path + ".tmp", path)                # atomic: the old file or the new one, never half
    print(f"[rank {ctx.rank}] saved {path}", flush=True)
dist.barrier()                                     # everyone else waits here until the file exists

ckpt = torch.load(path, map_location=ctx.device, weights_only=True)  # on THIS rank's device
fresh = make_model().to(ctx.device)
fresh.load_state_dict(ckpt["model"])               # strict: every key must match
apart("loaded_apart", fresh)                       # before any wrap: did every rank load the same weights?
resumed = DDP(fresh, device_ids=ctx.device_ids)
opt2 = torch.optim.AdamW(resumed.parameters(), lr=1e-2)  # the optimizer training goes on with...
opt2.load_state_dict(ckpt["optimizer"])            # ...gets back its step count and moments: resumed, not restarted
report("outputs/concepts/04_checkpoint.json", ctx, ckpt, apart, trained=ddp, loaded=fresh, optimizers=(opt, opt2))
del ddp, resumed  # free the DDP models (they hold the group and in-flight work) before the group goes
finish()
