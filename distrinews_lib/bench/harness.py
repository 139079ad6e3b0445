"""Run the course's training scripts UNCHANGED, in-process, and measure what happens inside them.

Notebook 05 and scripts/bench_train.py time the real scripts, not a copy of their loop:

    with harness.shared_process_group():            # under torchrun: one group for many runs
        res = harness.run(SCRIPT, argv, warmup=2, steps=10, device=device, comm=True)

- run() executes the script with runpy and these argv. A global optimizer-step hook marks the clock
  (after synchronising the GPU) at the end of step `warmup` and of step `warmup + steps`; the batches
  the script's EpochMeter sees in between give the samples, tokens and FLOPs of that window.
- comm=True registers a DDP communication hook on the script's DDP model that does what DDP does by
  default (average each gradient bucket with an all-reduce) and records when each bucket's all-reduce
  was launched and when it completed, and its size: how much of a step is spent communicating.
  hook="fp16" | "bf16" | "powersgd" registers one of torch's compression hooks instead, timed the same
  way; every all_reduce call is counted, so the bytes really sent are known whatever the hook does.
- shared_process_group() creates the process group once; the scripts' own init_process_group and
  destroy_process_group calls then reuse it (torchrun's start-up costs seconds per launch).
- alone() runs a single-process script on one rank while the others wait: inside it, distrinews_lib
  behaves as in a world of one.
"""

from __future__ import annotations

import contextlib
import gc
import runpy
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook

from .. import distributed as D
from ..training import flops, loop
from .timing import cpu_busy_seconds, foreign_cores, sync


@dataclass
class Window:
    """What happened between the end of optimizer step `warmup` and the end of step `warmup + steps`."""

    warmup: int
    steps: int
    device: object = None
    seen: int = 0
    marks: dict = field(default_factory=dict)     # step -> (wall, cpu, machine busy seconds)
    batches: list = field(default_factory=list)   # (step being built, real lengths, padded width)
    comm: list = field(default_factory=list)      # (launched, completed, bytes, bucket index) per bucket all-reduce
    sent: list = field(default_factory=list)      # (time, bytes) of every all_reduce call (what a hook really sends)

    def after_step(self, *_):
        self.seen += 1
        if self.seen in (self.warmup, self.warmup + self.steps):
            sync(self.device)
            self.marks[self.seen] = (time.perf_counter(), time.process_time(), cpu_busy_seconds())

    def on_batch(self, cpu_batch):
        mask = cpu_batch["attention_mask"]
        self.batches.append((self.seen, mask.sum(1).tolist(), int(mask.shape[1])))

    def result(self, shape=None, peak=None, n_devices: int = 1) -> dict:
        if self.warmup not in self.marks or self.warmup + self.steps not in self.marks:
            raise RuntimeError(f"the script took {self.seen} optimizer steps; the window needs {self.warmup + self.steps}")
        (t0, c0, b0), (t1, c1, b1) = self.marks[self.warmup], self.marks[self.warmup + self.steps]
        seconds, cpu_s = t1 - t0, c1 - c0
        inside = [(lengths, width) for step, lengths, width in self.batches if self.warmup <= step < self.warmup + self.steps]
        lengths = [n for ls, _ in inside for n in ls]
        padded = sum(len(ls) * w for ls, w in inside)
        out = {"steps": self.steps, "seconds": seconds, "cpu_s": cpu_s, "cpu_share": cpu_s / seconds if seconds else None,
               "samples": len(lengths), "tokens": sum(lengths), "padded_tokens": padded,
               "samples_per_s": len(lengths) / seconds, "tokens_per_s": sum(lengths) / seconds,
               "samples_per_cpu_s": len(lengths) / cpu_s if cpu_s > 0 else None,
               "padding_fraction": 1 - sum(lengths) / padded if padded else None,
               "foreign_cores": foreign_cores(b0, b1, cpu_s, seconds)}
        if shape is not None:
            fl = flops.training_flops(shape, lengths)
            out["model_tflops"] = fl / seconds / 1e12
            out["mfu"] = flops.mfu(fl / seconds, peak, n_devices)
        comm = [c for c in self.comm if t0 <= c[0] <= t1]
        if comm:
            out["allreduces"] = len(comm)
            out["synced_backwards"] = sum(1 for c in comm if c[3] == 0)  # bucket 0 is all-reduced once per synced backward
            out["allreduce_bytes"] = sum(c[2] for c in comm)
            out["comm_seconds"] = _union(comm)  # time during which at least one all-reduce was in flight
            out["comm_fraction"] = out["comm_seconds"] / seconds
        sent = [n for when, n in self.sent if t0 <= when <= t1]
        if sent:
            out["bytes_sent"] = sum(sent)
            out["bytes_sent_per_step"] = sum(sent) / self.steps
        return out


def _union(intervals) -> float:
    total, end = 0.0, float("-inf")
    for a, b, *_ in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


@contextlib.contextmanager
def _patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _timed_allreduce(window: Window):
    """A DDP communication hook: DDP's default (average the bucket over ranks), timed and sized."""

    def hook(process_group, bucket):
        group = process_group if process_group is not None else dist.group.WORLD
        tensor = bucket.buffer()
        launched = time.perf_counter()
        tensor.div_(dist.get_world_size(group))
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done(f):
            window.comm.append((launched, time.perf_counter(), tensor.numel() * tensor.element_size(), bucket.index()))
            return f.value()[0]

        return fut.then(done)

    return hook


def _compression_hook(window: Window, name: str):
    """One of torch's gradient compression hooks, timed like _timed_allreduce."""
    if name == "powersgd":  # rank-1 approximations of each gradient matrix, after 2 steps of plain all-reduce
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
        inner = powerSGD_hook.powerSGD_hook
    else:
        state, inner = None, {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}[name]

    def hook(process_group, bucket):
        launched = time.perf_counter()

        def done(f):
            window.comm.append((launched, time.perf_counter(), 0, bucket.index()))
            return f.value()

        return inner(state, bucket).then(done)

    return hook


def run(script, argv, *, warmup: int, steps: int, device=None, comm: bool = False, hook: str | None = None) -> Window:
    """Run `script` with `argv` as __main__ and return the measured Window. The script must take at least
    warmup + steps optimizer steps (pass --epochs 1 --max_steps_per_epoch warmup+steps)."""
    window = Window(warmup, steps, device)
    original_ddp_init = DistributedDataParallel.__init__

    def ddp_init(module, *args, **kwargs):
        original_ddp_init(module, *args, **kwargs)
        if hook:
            module.register_comm_hook(None, _compression_hook(window, hook))
        elif comm:
            module.register_comm_hook(kwargs.get("process_group"), _timed_allreduce(window))

    original_all_reduce = dist.all_reduce

    def counted_all_reduce(tensor, *args, **kwargs):
        window.sent.append((time.perf_counter(), tensor.numel() * tensor.element_size()))
        return original_all_reduce(tensor, *args, **kwargs)

    handle = register_optimizer_step_post_hook(window.after_step)
    stop_observing = loop.observe_batches(window.on_batch)
    saved_argv = sys.argv
    try:
        with _patched(DistributedDataParallel, "__init__", ddp_init), _patched(dist, "all_reduce", counted_all_reduce):
            sys.argv = [str(script), *map(str, argv)]
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as stop:
                if stop.code not in (0, None):
                    raise
    finally:
        sys.argv = saved_argv
        handle.remove()
        stop_observing()
        gc.collect()  # free this run's DDP model while the process group still exists
    return window


@contextlib.contextmanager
def shared_process_group(timeout_s: float = 600):
    """One process group for every script run in this launch; the scripts' init/destroy become no-ops."""
    env = D.torchrun_env()
    backend, why = D.choose_backend("auto")
    D.device_for(backend, env.local_rank)
    dist.init_process_group(backend=backend, init_method=env.init_method, rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(seconds=timeout_s))
    destroy = dist.destroy_process_group
    try:
        with _patched(dist, "init_process_group", lambda *a, **k: None), \
                _patched(dist, "destroy_process_group", lambda *a, **k: None):
            yield backend, why
    finally:
        gc.collect()
        destroy()


@contextlib.contextmanager
def alone():
    """On this rank, distrinews_lib acts as in a world of one (for a single-process script run on rank 0
    while the other ranks wait); torch.distributed itself is untouched."""
    with _patched(D, "is_initialized", lambda: False):
        yield
