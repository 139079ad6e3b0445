"""Concept 4: saving and loading a checkpoint in distributed training.

Every rank holds the same weights (DDP keeps them in sync), so ONE rank saves: rank 0 writes the
UNWRAPPED model (no `module.` prefix, so it loads into a plain model for inference) together with
the optimizer state and the epoch to resume from; it writes to a temporary file and renames it,
so a crash never leaves half a checkpoint. The others wait at a barrier, so nobody reads the file
before it exists. Loading uses map_location: a tensor saved from cuda:0 would otherwise be loaded
back onto cuda:0 by every rank (or fail on a machine without that GPU).
"""

import argparse
import os
import sys
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
rank, device = ctx.rank, ctx.device


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


torch.manual_seed(rank)  # deliberately different starting weights: DDP broadcasts rank 0's at wrap time
ddp = DDP(make_model().to(device), device_ids=ctx.device_ids)
at_wrap = max_param_difference(ddp)                  # 0.0: the wrap made every rank's copy equal to rank 0's
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
for step in range(3):  # a little training, different data per rank
    x, y = torch.randn(8, 16, device=device), torch.randint(0, 4, (8,), device=device)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    opt.step()
    opt.zero_grad()

path = Path(args.path)
if rank == 0:                                        # ONE writer
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": unwrap(ddp).state_dict(),   # unwrapped: keys without "module."
                "optimizer": opt.state_dict(), "epoch": 1}, tmp)
    os.replace(tmp, path)                            # atomic: the old file or the new one, never half
    sys.stdout.write(f"[rank 0] saved {path}\n")
dist.barrier()                                       # everyone else waits here until the file exists

# Resume on every rank: map_location puts the tensors on THIS rank's device.
ckpt = torch.load(path, map_location=device, weights_only=True)
fresh = make_model().to(device)
fresh.load_state_dict(ckpt["model"])                 # strict: every key must match
resumed = DDP(fresh, device_ids=ctx.device_ids)
opt2 = torch.optim.AdamW(resumed.parameters(), lr=1e-2)
opt2.load_state_dict(ckpt["optimizer"])
same = all(torch.equal(a, b) for a, b in zip(unwrap(resumed).parameters(), unwrap(ddp).parameters()))
diff = max_param_difference(resumed)
sys.stdout.write(f"[rank {rank}] loaded on {device}: identical to the trained model: {same}; "
                 f"resume at epoch {ckpt['epoch']}\n")
everyone = gather({"rank": rank, "device": str(device), "identical": same,
                   "loaded_tensor_device": str(next(iter(ckpt["model"].values())).device),
                   "max_param_difference_across_ranks": diff, "max_param_difference_after_wrap": at_wrap})
write_json(args.out, {"world_size": ctx.world, "keys": list(ckpt["model"]), "epoch": ckpt["epoch"],
                      "ranks": everyone}, rank)
del ddp, resumed  # free the DDP models (they hold the group and in-flight work) before the group goes
finish()
