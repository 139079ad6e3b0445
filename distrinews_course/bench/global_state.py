"""The process-wide settings a training contender can change and the next one would inherit: TF32 (both of torch's
APIs), cuDNN's flags, deterministic algorithms, CPU threads, the environment, and torch.compile's caches.

bench_train runs its contenders in one process, round after round. Trainer turns TF32 on through the new API
(`fp32_precision`); the next contender then ran with TF32 too, and an `--amp off` window measured MFU 40.6% in one
round (fp32 peak) and 7.0% in the next (TF32 peak). So the compare section takes a snapshot before the first
window and, before every window, restores it, clears the compile caches, and asserts that the state is the snapshot.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# The new API's leaves (torch >= 2.9), parents first: setting a parent resets the leaves that inherit from it.
PRECISION_KNOBS = (
    "fp32_precision",
    "cuda.matmul.fp32_precision",
    "cudnn.fp32_precision",
    "cudnn.conv.fp32_precision",
    "cudnn.rnn.fp32_precision",
    "mkldnn.fp32_precision",
    "mkldnn.matmul.fp32_precision",
    "mkldnn.conv.fp32_precision",
    "mkldnn.rnn.fp32_precision",
)
CUDNN_FLAGS = ("enabled", "benchmark", "deterministic")
SDP_KERNELS = ("flash", "mem_efficient", "math", "cudnn")


def _owner(path: str):
    obj = torch.backends
    *parents, leaf = path.split(".")
    for p in parents:
        obj = getattr(obj, p, None)
        if obj is None:
            return None, leaf
    return obj, leaf


@dataclass(frozen=True)
class GlobalState:
    precision: tuple  # (knob, value) of every fp32_precision knob this torch has
    legacy_tf32: tuple | None  # (matmul, cudnn) allow_tf32 on a torch without the new API
    cudnn: tuple
    sdp: tuple
    deterministic: bool
    threads: int
    environ: tuple

    @classmethod
    def capture(cls) -> GlobalState:
        precision = []
        for path in PRECISION_KNOBS:
            owner, leaf = _owner(path)
            if owner is not None and hasattr(owner, leaf):
                precision.append((path, getattr(owner, leaf)))
        legacy = None
        if not precision:  # torch < 2.9: only the legacy flags exist, and reading them is safe
            legacy = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        sdp = tuple(
            (k, getattr(torch.backends.cuda, f"{k}_sdp_enabled")())
            for k in SDP_KERNELS
            if hasattr(torch.backends.cuda, f"{k}_sdp_enabled")
        )
        return cls(
            precision=tuple(precision),
            legacy_tf32=legacy,
            cudnn=tuple((k, getattr(torch.backends.cudnn, k)) for k in CUDNN_FLAGS),
            sdp=sdp,
            deterministic=torch.are_deterministic_algorithms_enabled(),
            threads=torch.get_num_threads(),
            environ=tuple(sorted(os.environ.items())),
        )

    def restore(self) -> None:
        """Put every setting back (through the API that reads back without error), and empty torch.compile's
        in-memory caches so that no contender reuses another's compiled graphs."""
        for path, value in self.precision:
            owner, leaf = _owner(path)
            setattr(owner, leaf, value)
        if self.legacy_tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.legacy_tf32
        for k, v in self.cudnn:
            setattr(torch.backends.cudnn, k, v)
        for k, v in self.sdp:
            getattr(torch.backends.cuda, f"enable_{k}_sdp")(v)
        torch.use_deterministic_algorithms(self.deterministic)
        torch.set_num_threads(self.threads)
        saved = dict(self.environ)
        for k in set(os.environ) - set(saved):
            del os.environ[k]
        os.environ.update(saved)
        reset_compile_caches()

    def differences(self, other: GlobalState) -> list:
        """What differs from `other`, one readable item per setting."""
        out = []
        for name in ("precision", "cudnn", "sdp"):  # (setting, value) pairs: name the ones that moved
            mine, theirs = dict(getattr(self, name)), dict(getattr(other, name))
            out += [
                f"{name} {k}: {theirs.get(k)} -> {mine.get(k)}" for k in mine | theirs if mine.get(k) != theirs.get(k)
            ]
        for name in ("legacy_tf32", "deterministic", "threads"):
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                out.append(f"{name}: {b} -> {a}")
        if self.environ != other.environ:
            mine, theirs = dict(self.environ), dict(other.environ)
            keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            out.append(f"environment: {', '.join(keys)}")
        return out


def reset_compile_caches() -> None:
    """torch.compile's in-memory state: compiled frames, guards, and CUDA graph trees. (The on-disk caches stay:
    they only save compile time, which no window measures.)"""
    if hasattr(torch, "_dynamo"):
        torch._dynamo.reset()


class StateLeak(RuntimeError):
    """A contender started from other global settings than the first one did."""


def start_window(baseline: GlobalState, name: str) -> None:
    """Before a contender's window: restore the baseline and check that it holds."""
    baseline.restore()
    diff = GlobalState.capture().differences(baseline)
    if diff:
        raise StateLeak(f"{name} would start from other global settings than the baseline: {'; '.join(diff)}")
