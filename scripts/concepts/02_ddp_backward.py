"""Concept 2: what DistributedDataParallel does in backward().

DDP groups the gradients into buckets (about bucket_cap_mb each, in the reverse order of the
layers, because backward computes the last layer's gradients first). As soon as every gradient in
a bucket is ready, DDP starts that bucket's all-reduce - asynchronously - and backward carries on
with the earlier layers. Communication overlaps computation; backward() returns once every
bucket is averaged. A communication hook (the function DDP calls per bucket) lets us watch it.
"""

import argparse
import gc
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_lib.distributed import choose_backend

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=6)
p.add_argument("--width", type=int, default=256)
p.add_argument("--bucket_cap_mb", type=float, default=0.25, help="small, so this small model gets several buckets")
p.add_argument("--out", default="outputs/concepts/02_ddp_backward.json")
args = p.parse_args()

rank, local_rank, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
backend, _ = choose_backend("auto")
device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
if backend == "nccl":
    torch.cuda.set_device(device)
dist.init_process_group(backend, timeout=timedelta(seconds=60))

torch.manual_seed(0)  # same initial weights everywhere (DDP would broadcast rank 0's anyway)
layers = []
for _ in range(args.layers):
    layers += [torch.nn.Linear(args.width, args.width), torch.nn.Tanh()]
model = torch.nn.Sequential(*layers).to(device)
ddp = DDP(model, device_ids=[local_rank] if backend == "nccl" else None, bucket_cap_mb=args.bucket_cap_mb)
params = list(model.parameters())
events = []  # (seconds since backward started, bucket index, numel, gradients NOT yet computed)
t_backward = [0.0]


def watching_allreduce(state, bucket):
    """Called by DDP when a bucket is full of ready gradients: record, then all-reduce it as usual."""
    not_ready = sum(p.grad is None for p in params)  # zero_grad(set_to_none=True) left them None
    events.append((time.perf_counter() - t_backward[0], bucket.index(), bucket.buffer().numel(), not_ready))
    return default_hooks.allreduce_hook(None, bucket)  # async all-reduce, then divide by world size


ddp.register_comm_hook(None, watching_allreduce)
torch.manual_seed(100 + rank)  # each rank: different data
steps = []
for step in range(2):  # step 0: DDP learns the order gradients arrive in and rebuilds its buckets
    x = torch.randn(32, args.width, device=device)
    loss = ddp(x).pow(2).mean()
    events.clear()
    for p_ in params:
        p_.grad = None
    t_backward[0] = time.perf_counter()
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    steps.append({"backward_s": time.perf_counter() - t_backward[0], "buckets": list(events)})

# Gradient sync, checked: DDP's gradients == the mean over ranks of plain local gradients.
ddp_grads = torch.cat([p_.grad.reshape(-1) for p_ in params])
with ddp.no_sync():  # no_sync: backward WITHOUT the all-reduce -> this rank's local gradient
    for p_ in params:
        p_.grad = None
    ddp(x).pow(2).mean().backward()
local = torch.cat([p_.grad.reshape(-1) for p_ in params])
mean_local = local.clone()
dist.all_reduce(mean_local)
mean_local /= world
g0 = ddp_grads.clone()
dist.broadcast(g0, src=0)                            # rank 0's gradients, to compare with
last = steps[-1]
sys.stdout.write(f"[rank {rank}] backward {1000 * last['backward_s']:.1f} ms, {len(last['buckets'])} bucket all-reduces; "
                 f"the first started with {last['buckets'][0][3]} of {len(params)} gradients still to compute\n")
report = {
    "rank": rank, "world_size": world, "backend": backend, "n_params": sum(p_.numel() for p_ in params),
    "n_tensors": len(params), "steps": steps,
    "max_diff_ddp_vs_mean_of_local": float((ddp_grads - mean_local).abs().max()),
    "max_diff_ddp_vs_local": float((ddp_grads - local).abs().max()),
    "same_grads_as_rank0": torch.equal(g0, ddp_grads),
}
everyone = [None] * world
dist.all_gather_object(everyone, report)
if rank == 0:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"ranks": everyone}, indent=1))
del ddp      # free DDP (it holds the group and in-flight work) before the group goes;
gc.collect() # freeing it during interpreter shutdown can abort the process
dist.barrier()
dist.destroy_process_group()
