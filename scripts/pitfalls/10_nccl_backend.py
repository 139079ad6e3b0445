"""Pitfall 10: NCCL where it cannot work - no GPU, or several ranks on one GPU.

NCCL moves CUDA tensors between GPUs and needs one GPU per rank. Hard-coding
init_process_group("nccl") and `.cuda()` (which means cuda:0 on every rank) fails on a machine
without GPUs (a CPU build of torch has no NCCL at all) and, on a GPU box, puts every rank on GPU 0,
which NCCL refuses ("Duplicate GPU detected"). Fix: choose the backend from the hardware -
distrinews_lib.distributed.choose_backend("auto") picks nccl with one GPU per rank and
cuda:LOCAL_RANK, gloo otherwise - and say why.
"""

import argparse
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from distrinews_course.demo import finish, result, start, write_json

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed"], required=True)
p.add_argument("--ddp_timeout", type=float, default=30)
p.add_argument("--out", default="outputs/pitfalls/10_nccl_backend_fixed.json")
args = p.parse_args()

rank = int(os.environ["RANK"])
if args.mode == "broken":
    t0 = time.perf_counter()
    try:
        dist.init_process_group("nccl", timeout=timedelta(seconds=args.ddp_timeout))  # BUG: hard-coded
        x = torch.ones(1).cuda()                    # BUG: cuda:0 on every rank (or no GPU at all)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        result(rank, mode="broken", finished=True)
    except Exception as err:
        msg = " ".join(str(err).split())[:200]
        result(rank, mode="broken", error=type(err).__name__, seconds=f"{time.perf_counter() - t0:.2f}")
        print(f"[rank {rank}] {type(err).__name__}: {msg}", flush=True)
        sys.stdout.flush()
        os._exit(1)  # exit at once, with an error code the launcher sees
else:
    from distrinews_lib.distributed import choose_backend
    backend, why = choose_backend("auto")           # THE FIX: let the hardware decide...
    if rank == 0:
        print(f"backend: {why}", flush=True)        # ...and say why
    ctx = start(timeout_s=args.ddp_timeout, backend=backend)  # nccl: torch.cuda.set_device(LOCAL_RANK)
    x = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
    dist.all_reduce(x)
    result(ctx, mode="fixed", backend=ctx.backend, device=ctx.device, allreduce_sum=x.item())
    devices = [None] * ctx.world
    dist.all_gather_object(devices, str(ctx.device))
    write_json(args.out, {"world_size": ctx.world, "backend": ctx.backend, "reason": why, "devices": devices,
                          "allreduce_sum": x.item()}, ctx.rank)
    finish()
