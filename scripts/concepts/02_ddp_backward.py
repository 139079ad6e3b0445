"""Concept 2: what DistributedDataParallel does in backward(). Gradients go into buckets of about bucket_cap_mb,
in the order backward produces them; once a bucket is ready, DDP starts its all-reduce asynchronously and backward
carries on. A communication hook (the function DDP calls with each bucket) lets us watch it happen."""

import argparse

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.bucket_watch import GradClock, compare_with_local, timed_allreduce
from distrinews_course.demo import finish, gather, start, write_json

p = argparse.ArgumentParser()
p.add_argument("--bucket_cap_mb", type=float, default=0.25, help="small, so this small model gets several buckets")
p.add_argument("--out", default="outputs/concepts/02_ddp_backward.json")
args = p.parse_args()

ctx = start(timeout_s=60)
torch.manual_seed(0)  # the same initial weights everywhere (DDP would broadcast rank 0's anyway)
model = torch.nn.Sequential(*[m for _ in range(6) for m in (torch.nn.Linear(256, 256), torch.nn.Tanh())])
ddp = DDP(model.to(ctx.device), device_ids=ctx.device_ids, bucket_cap_mb=args.bucket_cap_mb)
params, buckets = list(model.parameters()), []
clock = GradClock(params)  # seconds since backward() started; notes when each parameter's gradient is computed


def watching_allreduce(state, bucket):
    """DDP calls this when a bucket's gradients are all ready: note the time, all-reduce as usual, note its end."""
    event = {"index": bucket.index(), "numel": bucket.buffer().numel(), "launched": clock(),
             "not_ready": clock.not_ready()}   # gradients backward has still to compute
    buckets.append(event)
    return timed_allreduce(bucket, event, clock)  # DDP's own all-reduce of the bucket; notes event["done"] at its end


ddp.register_comm_hook(None, watching_allreduce)
torch.manual_seed(100 + ctx.rank)  # each rank: its own data
steps = []
for step in range(2):  # step 0: DDP learns the order gradients arrive in and rebuilds its buckets
    x = torch.randn(32, 256, device=ctx.device)
    loss = ddp(x).pow(2).mean()
    ddp.zero_grad(set_to_none=True)  # every .grad None until backward computes it: what not_ready counts
    steps.append(clock.backward(loss, buckets))  # loss.backward(), timed: this step's buckets and gradients

report = {"rank": ctx.rank, "backend": ctx.backend, "bucket_cap_mb": args.bucket_cap_mb, "steps": steps,
          "param_numel": [p_.numel() for p_ in params], "bytes_per_number": params[0].element_size(),
          **compare_with_local(ddp, params, lambda m: m(x).pow(2).mean(), ctx.world)}  # .grad vs each rank's own
write_json(args.out, {"ranks": gather(report)}, ctx.rank)
del ddp  # free DDP (it holds the group and in-flight work) before the group goes
finish()
