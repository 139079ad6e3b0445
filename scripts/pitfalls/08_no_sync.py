"""Pitfall 8: gradient accumulation without no_sync().

With DDP every backward() all-reduces the gradients. Accumulating over K micro-batches then
costs K all-reduces per optimizer step, although only the sum at the end is needed. Inside
`with model.no_sync():` backward only accumulates locally; the last micro-batch's backward
(outside no_sync) all-reduces once. Same gradients, 1/K of the communication.
A DDP communication hook counts the all-reduces; the optimizer steps are timed.
"""

import argparse
import contextlib
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_lib.demo import finish, result, start, write_json

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=["broken", "fixed", "both"], default="both")
p.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
p.add_argument("--steps", type=int, default=6, help="optimizer steps timed (after one warm-up step)")
p.add_argument("--width", type=int, default=1024, help="hidden width: bigger = more bytes per all-reduce")
p.add_argument("--out", default="outputs/pitfalls/08_no_sync.json")
args = p.parse_args()

ctx = start()


class CountingState:
    def __init__(self):
        self.calls, self.bytes = 0, 0


def counting_allreduce(state, bucket):
    state.calls += 1
    state.bytes += bucket.buffer().numel() * bucket.buffer().element_size()
    return default_hooks.allreduce_hook(None, bucket)  # the usual averaging all-reduce


def run(use_no_sync: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, 4)).to(ctx.device)
    ddp = DDP(model, device_ids=ctx.device_ids)
    state = CountingState()
    ddp.register_comm_hook(state, counting_allreduce)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(100 + ctx.rank)  # same data for both variants, different per rank
    step_times, calls_per_step, bytes_per_step = [], [], []
    for step in range(args.steps + 1):
        t0, calls0, bytes0 = time.perf_counter(), state.calls, state.bytes
        for micro in range(args.accum):
            x, y = torch.randn(8, 64, generator=g), torch.randint(0, 4, (8,), generator=g)
            last = micro == args.accum - 1
            ctx_mgr = ddp.no_sync() if (use_no_sync and not last) else contextlib.nullcontext()  # THE FIX
            with ctx_mgr:
                loss = torch.nn.functional.cross_entropy(ddp(x.to(ctx.device)), y.to(ctx.device))
                (loss / args.accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        if step > 0:  # step 0 warms up (and DDP rebuilds its buckets there)
            step_times.append(time.perf_counter() - t0)
            calls_per_step.append(state.calls - calls0)
            bytes_per_step.append(state.bytes - bytes0)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    return {"allreduce_per_step": statistics.mean(calls_per_step),
            "mb_per_step": statistics.mean(bytes_per_step) / 2**20,
            "ms_per_step": 1000 * statistics.median(step_times)}, flat


report, params = {}, {}
for mode in (["broken", "fixed"] if args.mode == "both" else [args.mode]):
    report[mode], params[mode] = run(use_no_sync=(mode == "fixed"))
    result(ctx, mode=mode, **{k: f"{v:.2f}" for k, v in report[mode].items()})
if len(params) == 2:  # no_sync changes the communication, not the maths
    report["max_param_diff_broken_vs_fixed"] = float((params["broken"] - params["fixed"]).abs().max())
dist.barrier()
write_json(args.out, {"world_size": ctx.world, "accum": args.accum, "steps": args.steps,
                      "n_params": int(next(iter(params.values())).numel()),
                      **report}, ctx.rank)
finish()
