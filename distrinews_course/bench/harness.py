"""Run the course's training scripts UNCHANGED, in-process, and measure what happens inside them.

Notebook 05 and scripts/bench_train.py time the real scripts, not a copy of their loop:

    with harness.shared_process_group():            # under torchrun: one group for many runs
        res = harness.run(SCRIPT, argv, warmup=2, steps=10, device=device, comm=True)

run() executes the script with runpy and these argv, and watches it through hooks that torch and the
training loop offer for this, so renaming something inside the scripts cannot silently break the figures:
- the clock: a global optimizer-step hook (torch's register_optimizer_step_post_hook) marks it, after
  synchronising the GPU, at the end of step `warmup` and of step `warmup + steps`;
- the batches: each micro-batch the script's EpochMeter counts (its add(), watched for the run: the library has
  no benchmark hook); those of the window give its samples, tokens and FLOPs (throughput.window);
- the all-reduces (comm=True, or hook=...): a global module forward pre-hook (torch's
  register_module_forward_pre_hook) sees the script's DDP model on its first forward, before any backward,
  and gives it a communication hook (DDP's own register_comm_hook); then it removes itself. That hook does
  what DDP does by default (average each gradient bucket with an all-reduce), or with hook="fp16" | "bf16" |
  "powersgd" one of torch's compression hooks, or with hook="none" nothing at all (DDP's own cost alone), and
  records when each bucket's all-reduce was launched and completed, the bucket's size and the bytes really
  all-reduced for it: how much of a step is communication.

The one substitution, for lack of a hook: shared_process_group() and alone() below. See there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import runpy
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook

from distrinews_lib import distributed as D
from distrinews_lib.data import sources
from distrinews_lib.training.epochs import EpochMeter

from . import throughput
from .timing import cpu_busy_seconds, kernel_seconds, sync


@dataclass
class Window:
    """What happened between the end of optimizer step `warmup` and the end of step `warmup + steps`."""

    warmup: int
    steps: int
    device: object = None
    seen: int = 0
    marks: dict = field(default_factory=dict)  # step -> (wall, cpu, machine busy seconds)
    batches: list = field(default_factory=list)  # (step being built, real lengths, padded width)
    comm: list = field(default_factory=list)  # (launched, completed, bucket bytes, bucket index, bytes sent)

    def after_step(self, *_):
        self.seen += 1
        if self.seen in (self.warmup, self.warmup + self.steps):
            sync(self.device)
            self.marks[self.seen] = (time.perf_counter(), time.process_time(), cpu_busy_seconds(), kernel_seconds())

    def on_batch(self, cpu_batch):
        mask = cpu_batch["attention_mask"]
        self.batches.append((self.seen, mask.sum(1).tolist(), int(mask.shape[1])))

    def result(self, shape=None, peak=None, n_devices: int = 1) -> dict:
        first, last = self.warmup, self.warmup + self.steps
        if first not in self.marks or last not in self.marks:
            raise RuntimeError(f"the script took {self.seen} optimizer steps; the window needs {last}")
        (t0, c0, b0, k0), (t1, c1, b1, k1) = self.marks[first], self.marks[last]
        inside = [(lengths, width) for step, lengths, width in self.batches if first <= step < last]
        out = throughput.window(
            self.steps, t1 - t0, c1 - c0, inside, busy=(b0, b1), shape=shape, peak=peak, n_devices=n_devices
        )
        # the machine's kernel time in the window (every process's, ours included): its network work, tc's
        out["kernel_cpu_s"] = k1 - k0 if None not in (k0, k1) else None
        comm = [c for c in self.comm if t0 <= c[0] <= t1]
        if comm:
            out["allreduces"] = len(comm)
            out["synced_backwards"] = sum(1 for c in comm if c[3] == 0)  # bucket 0: once per synced backward
            out["allreduce_bytes"] = sum(c[2] for c in comm)
            out["comm_seconds"] = _union(comm)  # time during which at least one all-reduce was in flight
            out["comm_fraction"] = out["comm_seconds"] / out["seconds"]
            out["bytes_sent"] = sum(c[4] for c in comm)  # what the hook all-reduced: less when it compresses
            out["bytes_sent_per_step"] = out["bytes_sent"] / self.steps
        return out


def _union(intervals) -> float:
    total, end = 0.0, float("-inf")
    for a, b, *_ in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _timed_allreduce(window: Window):
    """A DDP communication hook: DDP's default (average the bucket over ranks), timed and sized."""

    def hook(process_group, bucket):
        group = process_group if process_group is not None else dist.group.WORLD
        tensor = bucket.buffer()
        size = tensor.numel() * tensor.element_size()
        launched = time.perf_counter()
        tensor.div_(dist.get_world_size(group))
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def done(f):
            window.comm.append((launched, time.perf_counter(), size, bucket.index(), size))
            return f.value()[0]

        return fut.then(done)

    return hook


def _no_allreduce(window: Window):
    """A DDP communication hook that sends nothing: each bucket is divided by the world size, as DDP's default hook
    does, and comes back without an all-reduce (every rank keeps its own gradient). DDP's own work per step stays (its
    hooks, the copies into and out of the buckets, the division, its forward's checks): chapter 05 times it against the
    same work without DDP. The bucket is recorded, with 0 bytes sent."""

    def hook(process_group, bucket):
        buffer = bucket.buffer()
        buffer.div_(dist.get_world_size(process_group if process_group is not None else dist.group.WORLD))
        now = time.perf_counter()
        window.comm.append((now, now, buffer.numel() * buffer.element_size(), bucket.index(), 0))
        fut = torch.futures.Future()
        fut.set_result(buffer)
        return fut

    return hook


def _compression_hook(window: Window, name: str):
    """One of torch's gradient compression hooks, timed like _timed_allreduce; the bytes it all-reduces are what
    it casts the bucket to (fp16, bf16) or what PowerSGD's own statistics say it sent (P, Q and the tensors it
    leaves uncompressed; the whole bucket in its first plain steps)."""
    if name == "powersgd":  # rank-1 approximations of each gradient matrix, after 2 steps of plain all-reduce
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
        inner = powerSGD_hook.powerSGD_hook
    else:
        state, inner = None, {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}[name]
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[name]

    def hook(_, bucket):
        buffer = bucket.buffer()
        size = buffer.numel() * buffer.element_size()
        before = state.compression_stats()[2] if state else 0
        launched = time.perf_counter()
        fut = inner(state, bucket)
        if state:  # numbers of elements all-reduced, counted as the hook splits the bucket (0: a plain step)
            sent = (state.compression_stats()[2] - before) * buffer.element_size() or size
        else:
            sent = buffer.numel() * dtype.itemsize

        def done(f):
            window.comm.append((launched, time.perf_counter(), size, bucket.index(), sent))
            return f.value()

        return fut.then(done)

    return hook


def _on_first_ddp_forward(register):
    """Call register(ddp_model) for the first DistributedDataParallel model that runs a forward (before its
    first backward, as register_comm_hook wants), then stop watching; returns the watch's handle."""

    def pre_hook(module, _args):
        ddp = getattr(module, "_orig_mod", module)  # torch.compile(DDP(model)) wraps it once more
        if isinstance(ddp, DistributedDataParallel):
            handle.remove()  # modules go back to torch's fast path without global hooks
            register(ddp)

    handle = register_module_forward_pre_hook(pre_hook)
    return handle


def run(script, argv, *, warmup: int, steps: int, device=None, comm: bool = False, hook: str | None = None) -> Window:
    """Run `script` with `argv` as __main__ and return the measured Window. The script must take at least
    warmup + steps optimizer steps (pass --epochs 1 --max_steps_per_epoch warmup+steps)."""
    window = Window(warmup, steps, device)
    if hook == "none":
        comm_hook = _no_allreduce(window)
    else:
        comm_hook = _compression_hook(window, hook) if hook else _timed_allreduce(window)
    watches = [register_optimizer_step_post_hook(window.after_step)]
    counted = EpochMeter.add

    def add(meter, loss, cpu_batch):  # every micro-batch the script's meter counts, seen by the window too
        window.on_batch(cpu_batch)
        counted(meter, loss, cpu_batch)

    if comm or hook:
        watches.append(_on_first_ddp_forward(lambda ddp: ddp.register_comm_hook(ddp.process_group, comm_hook)))
    saved_argv = sys.argv
    try:
        sys.argv = [str(script), *map(str, argv)]
        try:
            # The script's last line ends its process (distributed.run_and_end); here it is one run of many in this
            # process, so main() just returns (or raises) instead.
            with _patched(D, "run_and_end", lambda main: main()), _patched(EpochMeter, "add", add):
                runpy.run_path(str(script), run_name="__main__")
        except SystemExit as stop:
            if stop.code not in (0, None):
                raise
    finally:
        sys.argv = saved_argv
        for watch in watches:
            watch.remove()
        gc.collect()  # free this run's DDP model while the process group still exists
    return window


# --------------------------------------------------------------------------- the one substitution
# Many runs of the scripts share ONE torchrun launch (its start-up costs seconds each time), so they must share
# its process group (and the process: run() keeps a script's last line, run_and_end, from ending it). The scripts
# create and destroy theirs themselves (dist.init_process_group is part of the lesson) and torch has no hook for
# that, so inside shared_process_group() those two functions are swapped for no-ops; and a single-process script
# run on one rank of that group must not meet the others in collectives, so alone() makes
# distrinews_lib.distributed report no process group. Both are undone on leaving the block. One more, for time only:
# a data folder is read once per launch, not once per run (_read_once).


@contextlib.contextmanager
def _patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def shared_process_group(timeout_s: float = 600):
    """One process group for every script run in this launch; the scripts' init/destroy become no-ops."""
    env = D.torchrun_env()
    backend, why = D.choose_backend("auto")
    D.device_for(backend, env.local_rank)
    dist.init_process_group(
        backend=backend,
        init_method=env.init_method,
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    destroy = dist.destroy_process_group
    try:
        with (
            _patched(dist, "init_process_group", lambda *a, **k: None),
            _patched(dist, "destroy_process_group", lambda *a, **k: None),
            _patched(sources, "load_folder", _read_once(sources.load_folder)),  # load_embedded's too
        ):
            yield backend, why
    finally:
        gc.collect()
        destroy()


def _read_once(load):
    """A data folder (the embedded sample's, or --data's), read once per launch, not once per run (a tenth of a
    second each time, before any run's clock starts): each run gets its own copy of the lists, which a run's subset
    replaces. The texts themselves (texts.CleanOnRead, read-only) are shared: each run cleans the rows it keeps."""
    kept = {}

    def copy(x):
        return list(x) if isinstance(x, list) else x

    def once(*args, **kwargs):
        key = repr((args, sorted(kwargs.items())))
        if key not in kept:
            kept[key] = load(*args, **kwargs)
        s = kept[key]
        return dataclasses.replace(
            s,
            train_texts=copy(s.train_texts),
            train_labels=list(s.train_labels),
            test_texts=copy(s.test_texts),
            test_labels=list(s.test_labels),
            full_sizes=dict(s.full_sizes),
            label_names=list(s.label_names),
        )

    return once


@contextlib.contextmanager
def alone():
    """On this rank, the script sees a world of one (for a single-process script run on rank 0 while the other ranks
    wait): torch.distributed.is_initialized() answers False inside the block, so every helper of distrinews_lib that
    asks it (wherever the library keeps that helper) skips its collectives. The process group itself is untouched:
    the ranks meet again at the harness's barrier after the block."""
    with _patched(D, "is_initialized", lambda: False), _patched(dist, "is_initialized", lambda: False):
        yield
