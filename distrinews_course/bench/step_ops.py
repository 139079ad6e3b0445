"""What one training step asks of the device: its operations, the kernels they launch, and the host syncs among
them, each sync named by the line of code that made it. Where a loop loses against a bare one at a batch that
leaves the GPU idle, the cost is on the host: every launch is CPU time, and every sync stops the CPU from running
ahead of the GPU (the launch queue drains, and the GPU waits for the next launch).

OpCount (a TorchDispatchMode; eager code only: compiled graphs call their kernels directly) sees every aten
operation. On CUDA a launch is an operation that computes into a CUDA tensor, and a sync is one that needs a CUDA
value on the host: `.item()`, `float()`/`int()`/`bool()` of a tensor, `.cpu()`, `nonzero()`... On a CPU there is
no device to wait for, so the count runs on a PROXY of the GPU: the tensors that would live on the GPU (the model's
parameters, the optimizer's state, the batch after `epochs.to_device`, and whatever is computed from them) are
tracked, and a sync is a read of one of them on the host. The CPU batch's own reads (the meter counts its tokens on
the host) are no syncs, on a GPU either.

profiler_counts (CUDA only) reads the CUDA runtime calls themselves from torch.profiler: kernel launches, CUDA graph
replays, and the synchronisations, per step; it sees compiled code too.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from distrinews_lib.training import epochs

from .. import ROOT

aten = torch.ops.aten
SCALAR_READS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default}
# Operations whose output size depends on the data: on CUDA they copy a count back before they can allocate.
DATA_DEPENDENT = {"nonzero", "masked_select", "unique", "_unique2", "unique_consecutive", "repeat_interleave"}
NO_KERNEL = {"empty", "empty_strided", "empty_like", "_local_scalar_dense", "detach", "alias", "lift_fresh"}
TORCH_DIR = os.path.dirname(torch.__file__)
HERE = os.path.abspath(__file__)


def call_site() -> str:
    """The line that asked for it: the innermost frame outside torch (and outside this module), as path:line
    (function), the path relative to the checkout or to site-packages."""
    frame = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(TORCH_DIR) and path != HERE and "contextlib" not in path:
            break
        frame = frame.f_back
    if frame is None:
        return "?"
    path = os.path.abspath(frame.f_code.co_filename)
    if path.startswith(str(ROOT)):
        path = os.path.relpath(path, ROOT)
    elif "site-packages" in path:
        path = path.split("site-packages" + os.sep, 1)[1]
    return f"{path}:{frame.f_lineno} ({frame.f_code.co_name})"


def where_launched() -> str:
    """The line of the training loop (or of the library it calls) a launch came from: the innermost frame in this
    checkout, or 'the model' when it came from inside transformers or torch.nn modules called by the loop."""
    frame = sys._getframe(2)
    inside_model = False
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(str(ROOT)) and path != HERE and "site-packages" not in path:
            site = f"{os.path.relpath(path, ROOT)}:{frame.f_lineno}"
            return f"{site} (in the model)" if inside_model else site
        inside_model = inside_model or "transformers" in path or os.path.join("nn", "modules") in path
        frame = frame.f_back
    return "?"


class OpCount(TorchDispatchMode):
    """Counts per optimizer step (steps cut by a global optimizer-step hook). proxy=True: the CPU's GPU proxy
    (see the module's docstring); seed() marks the tensors that would live on the GPU."""

    def __init__(self, proxy: bool):
        super().__init__()
        self.proxy = proxy
        self._device = weakref.WeakValueDictionary()  # id -> tensor, the tensors that live on the (proxy) GPU
        self.steps: list = []  # one Counter per finished step
        self.current = collections.Counter()
        self.sites = collections.Counter()  # sync site -> count, over the counted steps
        self.launch_sites = collections.Counter()  # the line of the loop a launch came from -> count

    def seed(self, tensors) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._device[id(t)] = t

    def on_device(self, t) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        if not self.proxy:
            return t.device.type == "cuda"
        return self._device.get(id(t)) is t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        dev_in = any(self.on_device(t) for t in inputs)
        if self.proxy and dev_in:
            self.seed(outputs)  # computed from GPU tensors: on the GPU too
        name = func.overloadpacket.__name__
        self.current["ops"] += 1
        sync = None
        if func in SCALAR_READS and dev_in:
            sync = "scalar read"
        elif name in ("_to_copy", "copy_") and self._to_host(func, args, kwargs, out):
            sync = "copy to the host"
        elif name in DATA_DEPENDENT and dev_in:
            sync = f"data-dependent size ({name})"
        if sync:
            self.current["syncs"] += 1
            self.sites[f"{sync}: {call_site()}"] += 1
        elif not func.is_view and name not in NO_KERNEL and any(self.on_device(t) for t in outputs):
            self.current["launches"] += 1
            self.launch_sites[where_launched()] += 1
        return out

    def _to_host(self, func, args, kwargs, out) -> bool:
        src = args[1] if func.overloadpacket.__name__ == "copy_" else args[0]
        if not self.on_device(src):
            return False
        if self.proxy:  # on the proxy, a copy to the host is one the loop asked for by device (cpu) or by .cpu()
            device = kwargs.get("device")
            return device is not None and torch.device(device).type == "cpu"
        dst = args[0] if func.overloadpacket.__name__ == "copy_" else out
        return isinstance(dst, torch.Tensor) and dst.device.type == "cpu"

    def end_step(self) -> None:
        self.steps.append(self.current)
        self.current = collections.Counter()
        if len(self.steps) == 1:  # the first step read tensors made before counting began: not counted
            self.sites.clear()
            self.launch_sites.clear()

    def summary(self) -> dict:
        steps = self.steps[1:]
        n = len(steps) or 1
        per_step = {k: sum(s[k] for s in steps) / n for k in ("ops", "launches", "syncs")}
        return {
            "counted_steps": len(steps),
            "what": "CPU proxy of a GPU (see distrinews_course.bench.step_ops)" if self.proxy else "CUDA, eager ops",
            "ops_per_step": per_step["ops"],
            "launches_per_step": per_step["launches"],
            "syncs_per_step": per_step["syncs"],
            "sync_sites_per_step": {site: c / n for site, c in sorted(self.sites.items())},
            "launch_sites_per_step": {site: c / n for site, c in self.launch_sites.most_common()},
        }


@contextlib.contextmanager
def proxy_device_copies(counter: OpCount, counting=lambda: True):
    """On a CPU, make epochs.to_device copy the batch (on a GPU it does: one launch per tensor), so that the batch the
    model reads and the CPU batch the meter counts are different tensors and the proxy can tell them apart."""
    original = epochs.to_device

    def copying(batch, device, non_blocking=False):
        moved = original(batch, device, non_blocking)
        moved = {k: v.clone() if any(v is c for c in batch.values()) else v for k, v in moved.items()}
        counter.seed(moved.values())
        if counting():
            counter.current["launches"] += len(moved)
            counter.launch_sites[where_launched()] += len(moved)
        return moved

    epochs.to_device = copying
    try:
        yield
    finally:
        epochs.to_device = original


class StepWindow:
    """Runs an OpCount over optimizer steps first+1 .. first+n of whatever trains in this process: entered after
    step `first` (global optimizer-step hook), ended after step first+n (the first of them only starts the proxy's
    tracking: counted are first+2 .. first+n). `seed` gives the tensors that live on the
    GPU (for the CPU proxy: the model's parameters and the optimizer's state), read when counting starts."""

    def __init__(self, first: int, n: int, proxy: bool, seed=None):
        self.first, self.n, self.seen = first, n, 0
        self.counter, self.seed_fn, self.active = OpCount(proxy), seed, False

    def __call__(self, optimizer, *_):
        self.seen += 1
        if self.active:
            self.counter.end_step()
            if self.seen == self.first + self.n:
                self.counter.__exit__(None, None, None)
                self.active = False
        elif self.seen == self.first:
            seeds = [p for g in optimizer.param_groups for p in g["params"]]
            seeds += [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
            self.counter.seed([*seeds, *(self.seed_fn() if self.seed_fn else [])])
            self.counter.__enter__()
            self.active = True

    def __enter__(self):
        self.handle = register_optimizer_step_post_hook(self)
        self.copies = (
            proxy_device_copies(self.counter, lambda: self.active) if self.counter.proxy else contextlib.nullcontext()
        )
        self.copies.__enter__()
        return self

    def __exit__(self, *exc):
        if self.active:
            self.counter.__exit__(None, None, None)
            self.active = False
        self.copies.__exit__(*exc)
        self.handle.remove()

    def summary(self) -> dict:
        return self.counter.summary()


# --------------------------------------------------------------------------- CUDA: the runtime calls themselves

LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
GRAPH_CALLS = ("cudaGraphLaunch",)
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


class ProfileWindow:
    """torch.profiler over optimizer steps first+1 .. first+n (cut by a global optimizer-step hook, as StepWindow):
    per step, the kernel launches, CUDA graph replays and synchronising CUDA calls, read from the runtime calls
    themselves, so compiled code and CUDA graphs count too. trace: a Chrome trace of those steps (the CPU/GPU
    timeline)."""

    def __init__(self, first: int, n: int, trace: str | None = None):
        from torch.profiler import ProfilerActivity, profile

        self.first, self.n, self.seen, self.trace = first, n, 0, trace
        self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        self.counts, self.active = None, False

    def __call__(self, *_):
        self.seen += 1
        if self.seen == self.first:
            torch.cuda.synchronize()
            self.prof.start()
            self.active = True
        elif self.active and self.seen == self.first + self.n:
            torch.cuda.synchronize()
            self.stop()

    def stop(self) -> None:
        self.prof.stop()
        self.active = False
        self.counts = collections.Counter()
        for e in self.prof.key_averages():
            self.counts[e.key] += e.count
        if self.trace:
            self.prof.export_chrome_trace(self.trace)

    def __enter__(self):
        self.handle = register_optimizer_step_post_hook(self)
        return self

    def __exit__(self, *exc):
        if self.active:
            self.stop()
        self.handle.remove()

    def summary(self) -> dict:
        if self.counts is None:
            return {"error": f"the run took {self.seen} optimizer steps; the window needs {self.first + self.n}"}
        per = lambda names: sum(self.counts[n] for n in names) / self.n  # noqa: E731
        return {
            "counted_steps": self.n,
            "what": "CUDA runtime calls read by torch.profiler",
            "launches_per_step": per(LAUNCH_CALLS),
            "graph_replays_per_step": per(GRAPH_CALLS),
            "syncs_per_step": per(SYNC_CALLS),
            "sync_calls_per_step": {n: self.counts[n] / self.n for n in SYNC_CALLS if self.counts[n]},
            "trace": self.trace,
        }
