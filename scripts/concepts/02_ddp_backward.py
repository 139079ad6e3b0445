"""Concept 2: what DistributedDataParallel does in backward(). Gradients go into buckets of about bucket_cap_mb,
in the order backward produces them; once a bucket is ready, DDP starts its all-reduce asynchronously and backward
carries on. A communication hook (the function DDP calls with each bucket) lets us watch it happen."""

import argparse
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.demo import finish, gather, start, write_json

p = argparse.ArgumentParser()
p.add_argument("--bucket_cap_mb", type=float, default=0.25, help="small, so this small model gets several buckets")
p.add_argument("--out", default="outputs/concepts/02_ddp_backward.json")
args = p.parse_args()

ctx = start(timeout_s=60)
torch.manual_seed(0)  # the same initial weights everywhere (DDP would broadcast rank 0's anyway)
model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(256, 256), torch.nn.Tanh())])
ddp = DDP(model.to(ctx.device), device_ids=ctx.device_ids, bucket_cap_mb=args.bucket_cap_mb)
params, t0, buckets, grad_ready = list(model.parameters()), [0.0], [], []
clock = lambda: time.perf_counter() - t0[0]  # seconds since this rank's backward() started
for i, p_ in enumerate(params):              # note when each parameter's gradient is computed
    p_.register_post_accumulate_grad_hook(lambda _, i=i: grad_ready.append((clock(), i)))


def watching_allreduce(state, bucket):
    """DDP calls this when a bucket's gradients are all ready: note the time, all-reduce as usual, note its end."""
    event = {"index": bucket.index(), "numel": bucket.buffer().numel(), "launched": clock(),
             "not_ready": sum(p.grad is None for p in params)}   # gradients backward has still to compute
    buckets.append(event)
    return default_hooks.allreduce_hook(None, bucket).then(lambda f: event.update(done=clock()) or f.value())


ddp.register_comm_hook(None, watching_allreduce)
torch.manual_seed(100 + ctx.rank)  # each rank: its own data
steps = []
for step in range(2):  # step 0: DDP learns the order gradients arrive in and rebuilds its buckets
    x = torch.randn(32, 256, device=ctx.device)
    loss = ddp(x).pow(2).mean()
    ddp.zero_grad(set_to_none=True)  # every .grad None until backward computes it: what not_ready counts
    del buckets[:], grad_ready[:]    # this step's events only
    t0[0] = time.perf_counter()
    loss.backward()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
    steps.append({"backward_s": clock(), "buckets": [dict(b) for b in buckets], "grad_ready": sorted(grad_ready)})

synced = torch.cat([p_.grad.reshape(-1) for p_ in params])  # what DDP left in .grad...
with ddp.no_sync():                                          # ...against this rank's own gradient (no all-reduce)
    ddp.zero_grad(set_to_none=True)
    ddp(x).pow(2).mean().backward()
local = torch.cat([p_.grad.reshape(-1) for p_ in params])
mean_local, rank0 = local.clone(), synced.clone()
dist.all_reduce(mean_local)                                 # the sum of the local gradients
dist.broadcast(rank0, src=0)                                # rank 0's, to compare with
report = {"rank": ctx.rank, "backend": ctx.backend, "bucket_cap_mb": args.bucket_cap_mb, "steps": steps,
          "param_numel": [p_.numel() for p_ in params], "bytes_per_number": params[0].element_size(),
          "ddp_vs_mean_of_local": float((synced - mean_local / ctx.world).abs().max()),
          "ddp_vs_local": float((synced - local).abs().max()), "same_as_rank0": torch.equal(rank0, synced)}
write_json(args.out, {"ranks": gather(report)}, ctx.rank)
del ddp  # free DDP (it holds the group and in-flight work) before the group goes
finish()
