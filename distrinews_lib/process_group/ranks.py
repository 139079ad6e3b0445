"""Which rank this process is, and rank-0 output. Outside a process group (a single process) it is rank 0 of one."""

from __future__ import annotations

import os
import socket

import torch.distributed as dist


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return dist.get_rank() if is_initialized() else int(os.environ.get("RANK", 0))


def get_world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def is_main() -> bool:
    return get_rank() == 0


def print0(*args, **kwargs) -> None:
    """print on rank 0 only: N ranks printing the same line is noise (and interleaves)."""
    if is_main():
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def node_name() -> str:
    return f"{socket.gethostname()}, local rank {os.environ.get('LOCAL_RANK', 0)}"
