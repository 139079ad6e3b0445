"""Where a benchmark's result came from: the machine (as a short name for file names), its devices, the versions,
the git commit (and whether the tree was dirty), the exact command, and the load when it started."""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from distrinews_lib.machine import cpu_name, git_commit, machine_info, versions


def load_average() -> list | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_slug() -> str:
    """A short file-name-safe name for this machine: 'cpu2-amd-epyc', '2x-tesla-t4', '1x-nvidia-h100-80gb-hbm3'."""
    if torch.cuda.is_available():
        return slug_of({"gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]})
    return slug_of({"cpu_count": os.cpu_count(), "processor": cpu_name()})


def slug_of(machine: dict) -> str:
    """machine_slug() of a machine described as distrinews_lib.machine.machine_info() describes it (a record's)."""
    gpus = machine.get("gpus")
    base = f"{len(gpus)}x-{gpus[0]}" if gpus else f"cpu{machine.get('cpu_count')}-{machine.get('processor')}"
    slug = re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-")
    return re.sub(r"-(processor|cpu|\d+-core)$", "", slug)[:60]


def provenance(argv=None) -> dict:
    """Who/what/where produced a benchmark file: machine, devices, versions, git commit, exact command."""
    argv = sys.argv if argv is None else argv
    info = {
        "machine": machine_slug(),
        "machine_info": machine_info(),
        "cpu": machine_info()["processor"],
        "gpu": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else None,
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
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        ).stdout
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
