"""Pitfall 7: uneven inputs across ranks - the classic DDP hang.

Sharding by hand (data[rank::world]) with N not a multiple of world * batch gives rank 0 one
more batch. DDP all-reduces gradients inside EVERY backward, so rank 0's extra backward waits
for partners that have left the loop and now wait somewhere else (here: the barrier before
saving). Nobody can move: a hang. Run it with a short --ddp_timeout (the process group's
timeout) and it ends as an error after that many seconds, not after the default 30 minutes
(gloo) or 10 (nccl).
Fixes: (a) even shards - DistributedSampler pads (or drop_last=True trims) to equal batch
counts; (b) torch.distributed.algorithms.Join, which lets finished ranks shadow the collectives
of the ranks still training.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

from distrinews_course.demo import finish, result, start, write_json
from distrinews_lib.distributed import max_param_difference

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed"], required=True)
p.add_argument("--ddp_timeout", type=float, default=30, help="seconds a collective may wait before it fails")
p.add_argument("--batch_size", type=int, default=4)
p.add_argument("--out", default="outputs/pitfalls/07_uneven_inputs_{mode}.json")
args = p.parse_args()

ctx = start(timeout_s=args.ddp_timeout)
N = 3 * args.batch_size * ctx.world + 1            # one sample too many for even shards
torch.manual_seed(0)
data = TensorDataset(torch.randn(N, 8), torch.randn(N, 1))


def make_ddp():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).to(ctx.device)
    return DDP(model, device_ids=ctx.device_ids)


def train(ddp, loader) -> int:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    steps = 0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(ddp(x.to(ctx.device)), y.to(ctx.device))
        loss.backward()                            # all-reduce: needs every rank
        opt.step()
        opt.zero_grad()
        steps += 1
    return steps


manual = DataLoader(Subset(data, range(ctx.rank, N, ctx.world)), batch_size=args.batch_size)  # BUG: uneven shards
report = {"world_size": ctx.world, "n": N, "ddp_timeout": args.ddp_timeout}
if args.mode == "broken":
    result(ctx, mode="broken", my_batches=len(manual))
    t0 = time.perf_counter()
    try:
        steps = train(make_ddp(), manual)
        result(ctx, mode="broken", finished_steps=steps)
        dist.barrier()                             # "wait for rank 0 to save" - but rank 0 is still in backward
        result(ctx, mode="broken", finished=True)
    except Exception as err:                       # the timeout, after --ddp_timeout seconds
        msg = " ".join(str(err).split())[:160]
        result(ctx, mode="broken", error=type(err).__name__, waited_s=f"{time.perf_counter() - t0:.1f}")
        print(f"[rank {ctx.rank}] {type(err).__name__}: {msg}", flush=True)
        sys.stdout.flush()
        os._exit(1)  # exit now: a normal shutdown would wait on the broken process group
else:
    # Fix (a): even shards. DistributedSampler pads the last shard, so every rank has the same batches.
    even = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data, shuffle=False))  # FIX (a)
    ddp = make_ddp()
    steps_even = train(ddp, even)
    dist.barrier()
    steps = [None] * ctx.world
    dist.all_gather_object(steps, steps_even)      # the batches each rank trained on, as counted in its loop
    report["even"] = {"batches_per_rank": steps, "max_param_diff": max_param_difference(ddp)}
    # Fix (b): keep the uneven shards, but let ranks that run out "join" the others' all-reduces.
    ddp = make_ddp()
    with Join([ddp]):                              # FIX (b)
        steps_join = train(ddp, manual)
    dist.barrier()
    steps = [None] * ctx.world
    dist.all_gather_object(steps, steps_join)
    report["join"] = {"steps_per_rank": steps, "max_param_diff": max_param_difference(ddp)}
    result(ctx, mode="fixed", even_steps=steps_even, join_steps=steps_join)
    write_json(args.out.format(mode="fixed"), report, ctx.rank)
    del ddp  # free the DDP model before the process group goes (see distrinews_course.demo.finish)
finish()
