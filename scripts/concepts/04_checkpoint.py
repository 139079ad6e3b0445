"""Concept 4: a checkpoint in distributed training. Every rank holds the same weights, so ONE rank saves: rank 0
writes the UNWRAPPED model (no `module.` prefix: it loads into a plain model), the optimizer state and the epoch,
atomically; the others wait at a barrier. Every rank loads with map_location: its own device."""

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.demo import finish, gather, start, write_json
from distrinews_lib.checkpoint import unwrap
from distrinews_lib.distributed import max_param_difference

p = argparse.ArgumentParser()
p.add_argument("--path", default="outputs/concepts/04_checkpoint.pt")
p.add_argument("--out", default="outputs/concepts/04_checkpoint.json")
args = p.parse_args()
ctx = start(timeout_s=60)


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(ctx.device)


torch.manual_seed(ctx.rank)  # deliberately different starting weights: DDP broadcasts rank 0's at wrap time
model = make_model()
before_wrap = max_param_difference(model)          # > 0: each rank's own seed gave it other weights
ddp = DDP(model, device_ids=ctx.device_ids)
at_wrap = max_param_difference(ddp)                # 0.0: the wrap made every rank's copy equal to rank 0's
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
for step in range(3):  # a little training, different data per rank
    x, y = torch.randn(8, 16, device=ctx.device), torch.randint(0, 4, (8,), device=ctx.device)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()
    opt.zero_grad()

path = Path(args.path)
if ctx.rank == 0:                                  # ONE writer
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": unwrap(ddp).state_dict(),  # unwrapped: keys without "module."
                "optimizer": opt.state_dict(), "epoch": 1}, tmp)
    os.replace(tmp, path)                          # atomic: the old file or the new one, never half
    print(f"[rank 0] saved {path}", flush=True)
dist.barrier()                                     # everyone else waits here until the file exists

ckpt = torch.load(path, map_location=ctx.device, weights_only=True)  # on THIS rank's device
fresh = make_model()
fresh.load_state_dict(ckpt["model"])               # strict: every key must match
loaded_apart = max_param_difference(fresh)         # before any wrap: did every rank load the same weights?
resumed = DDP(fresh, device_ids=ctx.device_ids)
torch.optim.AdamW(resumed.parameters(), lr=1e-2).load_state_dict(ckpt["optimizer"])
same = all(torch.equal(a, b) for a, b in zip(fresh.parameters(), unwrap(ddp).parameters()))
report = dict(rank=ctx.rank, device=str(ctx.device), loaded_on=str(ckpt["model"]["0.weight"].device), identical=same,
              before_wrap=before_wrap, at_wrap=at_wrap, loaded_apart=loaded_apart)
write_json(args.out, {"keys": list(ckpt["model"]), "epoch": ckpt["epoch"], "ranks": gather(report)}, ctx.rank)
del ddp, resumed  # free the DDP models (they hold the group and in-flight work) before the group goes
finish()
