"""The one atomic writer of the package: a crash never leaves half a file, a reader sees the old file or the
new. Every file the course writes while others may read it (checkpoints, snapshots, metrics, caches) goes
through it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None]) -> Path:
    """Call write(binary file) on a temporary file beside `path`, fsync it, then rename it over `path`."""
    umask = os.umask(0)
    os.umask(umask)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask)  # what a plain open() gives: mkstemp's 0600 would hide it from a server
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def atomic_write_json(path: str | os.PathLike, data: Any, indent: int | None = 2) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=indent, default=str))


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    return atomic_write(path, lambda f: torch.save(obj, f))
