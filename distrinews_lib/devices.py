"""Which device a process computes on: the GPUs this machine has, and a requested device checked (cpu, cuda, cuda:N).
The training scripts and the server both ask here; neither needs a process group for it."""

from __future__ import annotations

import torch

from .errors import UserError


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(requested: str | None = "auto") -> torch.device:
    """auto (or None): cuda:0 when there is a GPU, else cpu; otherwise the named device (cpu, cuda, cuda:N), checked."""
    if requested in ("auto", None, ""):
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(requested)
    except (RuntimeError, ValueError):
        raise UserError(f"device '{requested}' is not a valid torch device; use auto, cpu, cuda or cuda:N.") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"device '{requested}' was asked for, but this machine has no usable CUDA GPU; use cpu or auto."
        )
    return device
