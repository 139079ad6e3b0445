"""What a run ran on: the versions of what it used, the machine, and the git commit of the code."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from pathlib import Path

import torch

from . import __version__


def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda, "nccl": None,
           "distrinews_lib": __version__}
    try:
        if torch.cuda.is_available() and torch.distributed.is_nccl_available():
            nv = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, nv)) if isinstance(nv, tuple) else str(nv)
    except Exception:  # an NCCL-less build
        pass
    for pkg in ("transformers", "datasets", "accelerate"):
        try:  # deferred on purpose: optional packages, and each import costs time
            out[pkg] = __import__(pkg).__version__
        except ImportError:
            out[pkg] = None
    return out


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
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


def machine_info() -> dict:
    info = {"hostname": socket.gethostname(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "processor": cpu_name()}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info
