"""What a run ran on: the versions of what it used, the machine, and the git commit of the code."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path

import torch

from . import __version__


def versions() -> dict:
    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": None,
        "distrinews_lib": __version__,
    }
    try:
        if torch.cuda.is_available() and torch.distributed.is_nccl_available():
            nv = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, nv)) if isinstance(nv, tuple) else str(nv)
    except Exception:  # an NCCL-less build
        pass
    for pkg in ("transformers", "datasets", "accelerate"):
        # read from the installed package's metadata, not by importing it: importing datasets alone costs 0.6 s,
        # in every process that trains
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def git_commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=5,
                cwd=Path(__file__).resolve().parent,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# bf16 in hardware on a CPU: x86's AVX-512 BF16 dot products or AMX tiles (Linux names them in /proc/cpuinfo's
# flags); Arm's BF16 extension ("bf16" in Features). Without them torch converts to fp32 and back: slower than fp32.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def cpu_flags(cpuinfo: str | None = None) -> set[str] | None:
    """The CPU's feature flags (x86 'flags', Arm 'Features'), or None where /proc/cpuinfo cannot tell (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def cpu_native_bf16(flags: set[str] | None = None) -> bool | None:
    """True / False when the flags say whether this CPU computes bf16 in hardware; None when they cannot be read."""
    flags = cpu_flags() if flags is None else flags
    return None if flags is None else any(f in flags for f in BF16_CPU_FLAGS)


def machine_info() -> dict:
    info = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "processor": cpu_name(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info
