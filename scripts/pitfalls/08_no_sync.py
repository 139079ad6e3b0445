"""Pitfall 8: gradient accumulation without no_sync().

With DDP every backward() all-reduces the gradients. Accumulating over K micro-batches then
costs K all-reduces per optimizer step, although only the sum at the end is needed. Inside
`with model.no_sync():` backward only accumulates locally; the last micro-batch's backward
(outside no_sync) all-reduces once. Same gradients, 1/K of the communication.
A DDP communication hook counts the all-reduces; the optimizer steps are timed (both variants
step by step in turn, so that both see the same machine; the fastest step of each is reported).
"""

import argparse
import contextlib
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from distrinews_course.demo import finish, result, start, write_json

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


class Variant:
    """One DDP model trained with accumulation, with or without no_sync, and what its steps cost."""

    def __init__(self, use_no_sync: bool):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(64, args.width), torch.nn.ReLU(),
                                         torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                         torch.nn.Linear(args.width, 4)).to(ctx.device)
        self.ddp = DDP(self.model, device_ids=ctx.device_ids)
        self.state = CountingState()
        self.ddp.register_comm_hook(self.state, counting_allreduce)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=0.01)
        self.g = torch.Generator().manual_seed(100 + ctx.rank)  # same data for both variants, different per rank
        self.use_no_sync, self.times, self.calls, self.bytes = use_no_sync, [], [], []

    def step(self, record: bool) -> None:
        t0, calls0, bytes0 = time.perf_counter(), self.state.calls, self.state.bytes
        self.per_micro = []  # all-reduces each micro-batch's backward made
        for micro in range(args.accum):  # BOTH MODES: K micro-batches, one optimizer step
            x, y = torch.randn(8, 64, generator=self.g), torch.randint(0, 4, (8,), generator=self.g)
            last = micro == args.accum - 1
            skip_sync = self.use_no_sync and not last
            ctx_mgr = self.ddp.no_sync() if skip_sync else contextlib.nullcontext()  # THE FIX: no_sync() till the last
            before = self.state.calls
            with ctx_mgr:  # BOTH MODES
                loss = torch.nn.functional.cross_entropy(self.ddp(x.to(ctx.device)), y.to(ctx.device))
                (loss / args.accum).backward()  # BOTH MODES: / K, so the sum is the big batch's mean
            self.per_micro.append(self.state.calls - before)
        self.opt.step()  # BOTH MODES
        self.opt.zero_grad(set_to_none=True)  # BOTH MODES
        if ctx.device.type == "cuda":
            torch.cuda.synchronize(ctx.device)
        if record:
            self.times.append(time.perf_counter() - t0)
            self.calls.append(self.state.calls - calls0)
            self.bytes.append(self.state.bytes - bytes0)

    def report(self) -> dict:
        return {"allreduce_per_step": statistics.mean(self.calls), "mib_per_step": statistics.mean(self.bytes) / 2**20,
                "ms_per_step": 1000 * min(self.times),  # the fastest step: other programs can only add time
                "allreduce_per_micro_batch": self.per_micro}  # the last step's


modes = ["broken", "fixed"] if args.mode == "both" else [args.mode]
variants = {mode: Variant(use_no_sync=(mode == "fixed")) for mode in modes}
for step in range(args.steps + 1):  # step 0 warms up (and DDP rebuilds its buckets there)
    for mode in modes:              # interleaved, so that both variants see the same machine
        variants[mode].step(record=step > 0)
report = {mode: v.report() for mode, v in variants.items()}
params = {mode: torch.cat([p.detach().reshape(-1) for p in v.model.parameters()]).cpu() for mode, v in variants.items()}
for mode in modes:
    result(ctx, mode=mode, **{k: f"{v:.2f}" if isinstance(v, float) else v for k, v in report[mode].items()})
if len(params) == 2:  # no_sync changes the communication, not the maths
    report["max_param_diff_broken_vs_fixed"] = float((params["broken"] - params["fixed"]).abs().max())
dist.barrier()
write_json(args.out, {"world_size": ctx.world, "accum": args.accum, "steps": args.steps,
                      "n_params": int(next(iter(params.values())).numel()),
                      **report}, ctx.rank)
del variants  # free the DDP models before the process group goes (see distrinews_course.demo.finish)
finish()
