"""The device a process computes on, and the precision (AMP, loss scaling) it computes in."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

import torch

from ..devices import resolve_device  # noqa: F401  (the scripts call precision.resolve_device)
from ..errors import UserError
from .config import AMP_MODES


@dataclass
class AmpSettings:
    mode: str  # what was resolved: "fp16", "bf16" or "off"
    dtype: torch.dtype | None
    use_scaler: bool  # fp16 needs a GradScaler: its gradients underflow without loss scaling
    reason: str

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    def autocast(self, device: torch.device):
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.dtype)


def native_bf16(device: torch.device) -> bool:
    """Compute capability 8.0+: is_bf16_supported() also says yes on a T4, where bf16 is emulated and slow."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def resolve_amp(mode: str, device: torch.device) -> AmpSettings:
    """auto: bf16 on GPUs with native bf16 (A100, H100), fp16 + GradScaler below (T4, V100), off on CPU.
    bf16 asked for on a CPU without it in hardware runs, after one warning line with a measured slowdown."""
    if mode not in AMP_MODES:
        raise UserError(f"unknown --amp '{mode}'. Choices: {', '.join(AMP_MODES)}.")
    on_cuda = device.type == "cuda"
    if mode == "off":
        return AmpSettings("off", None, False, "AMP off (asked for)")
    if mode == "fp16":
        if not on_cuda:
            raise UserError(
                "--amp fp16 needs a CUDA GPU (fp16 autocast with a GradScaler); this run is on the CPU. "
                "Use --amp off (or bf16, which CPUs can autocast), or run on a GPU."
            )
        return AmpSettings("fp16", torch.float16, True, "fp16 autocast with GradScaler (asked for)")
    if mode == "bf16":
        if on_cuda and not native_bf16(device):
            name, cap = torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)
            raise UserError(
                f"--amp bf16: {name} (compute capability {cap[0]}.{cap[1]}) has no bf16 in hardware; torch "
                "would emulate it, slower than fp32. Use --amp fp16 (or auto, which picks fp16 with a "
                "GradScaler here)."
            )
        warning = None
        if not on_cuda:  # bf16 asked for on a CPU: emulated_bf16.py measures what it costs here, if it is emulated
            from .emulated_bf16 import emulated_bf16_warning

            warning = emulated_bf16_warning()
        if warning and os.environ.get("RANK", "0") == "0":  # one line per run, not per rank
            print(warning, file=sys.stderr, flush=True)
        return AmpSettings(
            "bf16",
            torch.bfloat16,
            False,
            f"bf16 autocast on {device.type} (asked for)"
            + (" - EMULATED on this CPU, slower than fp32" if warning else ""),
        )
    if not on_cuda:  # never bf16 on its own: a CPU without it in hardware runs it several times slower than fp32
        return AmpSettings("off", None, False, "AMP off: on a CPU fp32 is the safe default")
    name = torch.cuda.get_device_name(device)
    if native_bf16(device):
        return AmpSettings("bf16", torch.bfloat16, False, f"bf16: {name} has it in hardware, no GradScaler needed")
    return AmpSettings("fp16", torch.float16, True, f"fp16 + GradScaler: {name} has no native bf16 (e.g. T4)")


def make_grad_scaler(amp: AmpSettings, device: torch.device):
    return torch.amp.GradScaler(device.type, enabled=amp.use_scaler)


def compile_if_asked(model, cfg):
    """--compile: the model under torch.compile (--compile_mode reduce-overhead: CUDA graphs); otherwise as it is."""
    return torch.compile(model, mode=cfg.compile_mode) if cfg.compile else model
