"""Concept 2: what DistributedDataParallel does in backward().

DDP groups the gradients into buckets (about bucket_cap_mb each, in the order backward produces
them: the last layer's first). As soon as every gradient in a bucket is ready, DDP starts that
bucket's all-reduce - asynchronously - and backward carries on with the earlier layers.
Communication overlaps computation; backward() returns once every bucket is averaged.
A communication hook (the function DDP calls per bucket) lets us watch it: it notes when each
bucket's all-reduce was launched and, through the future it returns (.then), when it completed.
(On GPUs with nccl, "completed" is when the all-reduce was queued on the GPU's stream.)
"""

import argparse
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.demo import finish, gather, start, write_json

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=6)
p.add_argument("--width", type=int, default=256)
p.add_argument("--bucket_cap_mb", type=float, default=0.25, help="small, so this small model gets several buckets")
p.add_argument("--out", default="outputs/concepts/02_ddp_backward.json")
args = p.parse_args()

ctx = start(timeout_s=60)
torch.manual_seed(0)  # same initial weights everywhere (DDP would broadcast rank 0's anyway)
layers = []
for _ in range(args.layers):
    layers += [torch.nn.Linear(args.width, args.width), torch.nn.Tanh()]
model = torch.nn.Sequential(*layers).to(ctx.device)
ddp = DDP(model, device_ids=ctx.device_ids, bucket_cap_mb=args.bucket_cap_mb)
params = list(model.parameters())
t_backward = [0.0]
buckets = []      # one dict per bucket all-reduce: index, numel, launched, done (s since backward started)
grad_ready = []   # (s since backward started, parameter index): when each gradient was computed


def clock():
    return time.perf_counter() - t_backward[0]


for i, p_ in enumerate(params):
    p_.register_post_accumulate_grad_hook(lambda _, i=i: grad_ready.append((clock(), i)))


def watching_allreduce(state, bucket):
    """Called by DDP when a bucket is full of ready gradients: record, all-reduce it as usual, record its end."""
    event = {"index": bucket.index(), "numel": bucket.buffer().numel(), "launched": clock(),
             "not_ready": sum(p.grad is None for p in params)}  # zero_grad(set_to_none=True) left them None
    buckets.append(event)

    def completed(fut):
        event["done"] = clock()
        return fut.value()

    return default_hooks.allreduce_hook(None, bucket).then(completed)  # async all-reduce / world size


ddp.register_comm_hook(None, watching_allreduce)
torch.manual_seed(100 + ctx.rank)  # each rank: different data
steps = []
for step in range(2):  # step 0: DDP learns the order gradients arrive in and rebuilds its buckets
    x = torch.randn(32, args.width, device=ctx.device)
    loss = ddp(x).pow(2).mean()
    buckets.clear()
    grad_ready.clear()
    for p_ in params:
        p_.grad = None
    t_backward[0] = time.perf_counter()
    loss.backward()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    steps.append({"backward_s": clock(), "buckets": [dict(b) for b in buckets], "grad_ready": sorted(grad_ready)})

# Gradient sync, checked: DDP's gradients == the mean over ranks of plain local gradients.
ddp_grads = torch.cat([p_.grad.reshape(-1) for p_ in params])
with ddp.no_sync():  # no_sync: backward WITHOUT the all-reduce -> this rank's local gradient
    for p_ in params:
        p_.grad = None
    ddp(x).pow(2).mean().backward()
local = torch.cat([p_.grad.reshape(-1) for p_ in params])
mean_local = local.clone()
dist.all_reduce(mean_local)
mean_local /= ctx.world
g0 = ddp_grads.clone()
dist.broadcast(g0, src=0)                            # rank 0's gradients, to compare with
last = steps[-1]
sys.stdout.write(f"[rank {ctx.rank}] backward {1000 * last['backward_s']:.1f} ms, {len(last['buckets'])} bucket "
                 f"all-reduces; the first started with {last['buckets'][0]['not_ready']} of {len(params)} gradients "
                 f"still to compute\n")
report = {
    "rank": ctx.rank, "world_size": ctx.world, "backend": ctx.backend, "bucket_cap_mb": args.bucket_cap_mb,
    "n_params": sum(p_.numel() for p_ in params), "param_numel": [p_.numel() for p_ in params],
    "bytes_per_number": params[0].element_size(), "n_tensors": len(params), "steps": steps,
    "max_diff_ddp_vs_mean_of_local": float((ddp_grads - mean_local).abs().max()),
    "max_diff_ddp_vs_local": float((ddp_grads - local).abs().max()),
    "same_grads_as_rank0": torch.equal(g0, ddp_grads),
}
write_json(args.out, {"ranks": gather(report)}, ctx.rank)
del ddp  # free DDP (it holds the group and in-flight work) before the group goes
finish()
