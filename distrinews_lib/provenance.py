"""Where a result came from: the machine, its devices, the versions, the git commit and the command."""

from __future__ import annotations

import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .timing import load_average


def versions() -> dict:
    import torch
    import transformers

    from . import __version__

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "distrinews_lib": __version__}
    for pkg in ("datasets", "accelerate"):
        try:
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
    import torch

    info = {"hostname": socket.gethostname(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "processor": cpu_name()}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def machine_slug() -> str:
    """A short file-name-safe name for this machine: 'cpu2-amd-epyc', '2x-tesla-t4', '1x-nvidia-h100-80gb-hbm3'."""
    import torch

    if torch.cuda.is_available():
        name, n = torch.cuda.get_device_name(0), torch.cuda.device_count()
        base = f"{n}x-{name}"
    else:
        base = f"cpu{os.cpu_count()}-{cpu_name()}"
    slug = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-")
    return re.sub(r"-(processor|cpu|\d+-core)$", "", slug)[:60]


def provenance(argv=None) -> dict:
    """Who/what/where produced a benchmark file: machine, devices, versions, git commit, exact command."""
    import torch

    argv = sys.argv if argv is None else argv
    info = {
        "machine": machine_slug(),
        "machine_info": machine_info(),
        "cpu": machine_info()["processor"],
        "gpu": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else None,
        "versions": versions(),
        "git_commit": git_commit(),
        "git_dirty": _git_dirty(),
        "command": " ".join(shlex.quote(a) for a in ["python", *argv]),
        "cwd": os.getcwd(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_average_at_start": load_average(),
        "python": platform.python_version(),
    }
    return info


def _git_dirty() -> bool | None:
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent).stdout
        return bool(out.strip())
    except (OSError, subprocess.SubprocessError):
        return None


def as_jsonable(obj):
    """Dataclasses, tuples and torch dtypes into plain JSON types."""
    if hasattr(obj, "__dataclass_fields__"):
        return as_jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {str(k): as_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [as_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return None if obj != obj else obj  # NaN is not JSON
    if obj is None or isinstance(obj, (int, str, bool)):
        return obj
    return str(obj)
