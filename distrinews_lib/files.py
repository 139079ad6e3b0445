"""Writing files so that a crash never leaves half of one: the one atomic writer of the package.

Every file the course writes while others may read it (checkpoints, snapshots, metrics, the tokenizer cache, the
notebooks' records) goes through atomic_write: the bytes go to a temporary file in the same folder, are flushed to
disk (fsync), get the permissions a plain open() would give (mkstemp's 0600 would hide them from a server running as
another user), and the temporary file is renamed over the target. A reader sees the old file or the new one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch


def umask_mode(mode: int = 0o666) -> int:
    """The permissions a plain open() would give under this process's umask."""
    current = os.umask(0)
    os.umask(current)
    return mode & ~current


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None]) -> Path:
    """Call write(binary file) on a temporary file beside `path`, fsync it, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, umask_mode())
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
