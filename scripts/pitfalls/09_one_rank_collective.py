"""Pitfall 9: a collective called on one rank only.

A collective (all_reduce, barrier, broadcast, all_gather...) completes only when EVERY rank calls
it, in the same order. Tucking one inside `if rank == 0:` (say, to log a global metric) leaves
rank 0 waiting for partners that never come, while the others wait in the next collective.
With a short --ddp_timeout both fail after that many seconds; with the default timeout they
would sit for 30 minutes (gloo) or 10 (nccl). Fix: every rank calls the collective; only the
printing is rank-0 only.
(Debugging tip: TORCH_DISTRIBUTED_DEBUG=DETAIL, or dist.monitored_barrier on gloo, names the
rank that did not arrive.)
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

from distrinews_course.demo import finish, result, start, write_json

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed"], required=True)
p.add_argument("--ddp_timeout", type=float, default=30, help="seconds a collective may wait before it fails")
p.add_argument("--out", default="outputs/pitfalls/09_one_rank_collective_{mode}.json")
args = p.parse_args()

ctx = start(timeout_s=args.ddp_timeout)
val_loss = torch.tensor([1.0 + ctx.rank], device=ctx.device)  # this rank's validation loss

t0 = time.perf_counter()
try:
    if args.mode == "broken":
        if ctx.rank == 0:
            dist.all_reduce(val_loss)               # BUG: only rank 0 gets here
            print(f"global val loss {val_loss.item() / ctx.world:.3f}", flush=True)
    else:
        dist.all_reduce(val_loss)                   # THE FIX: every rank calls the collective...
        if ctx.rank == 0:                           # ...and only the printing is rank-0 only
            print(f"global val loss {val_loss.item() / ctx.world:.3f}", flush=True)
    dist.barrier()                                  # e.g. the start of the next epoch
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)          # nccl is asynchronous: wait for the result here
    result(ctx, mode=args.mode, finished=True, seconds=f"{time.perf_counter() - t0:.2f}")
    write_json(args.out.format(mode=args.mode),
               {"world_size": ctx.world, "global_val_loss": val_loss.item() / ctx.world,
                "seconds": time.perf_counter() - t0}, ctx.rank)
except Exception as err:
    msg = " ".join(str(err).split())[:160]
    result(ctx, mode=args.mode, error=type(err).__name__, waited_s=f"{time.perf_counter() - t0:.1f}")
    print(f"[rank {ctx.rank}] {type(err).__name__}: {msg}", flush=True)
    sys.stdout.flush()
    os._exit(1)  # exit now: a normal shutdown would wait on the broken process group
finish()
