"""Plumbing shared by the pitfall scripts, so each script shows only its pitfall.

start()      reads torchrun's env, picks the backend (nccl when every rank has its own GPU, else gloo)
             and starts the process group with a SHORT timeout: a hang becomes an error in seconds.
result()     prints one `RESULT rank=R key=value ...` line (one write, so ranks do not interleave).
gather()     collects a Python object from every rank (a list, one entry per rank).
write_json() rank 0 writes the numbers the notebook checks, atomically (temp file + rename).
"""

import gc
import json
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from distrinews_lib.distributed import choose_backend, ensure_torchrun_env


@dataclass
class Ctx:
    rank: int
    local_rank: int
    world: int
    backend: str
    device: torch.device


def start(timeout_s: float = 30, backend: str = "auto") -> Ctx:
    info = ensure_torchrun_env()  # plain `python script.py` works too: a world of one
    backend, _why = choose_backend(backend)
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank)
        device = torch.device("cuda", info.local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return Ctx(info.rank, info.local_rank, info.world_size, backend, device)


def result(ctx_or_rank, **values) -> None:
    rank = ctx_or_rank.rank if isinstance(ctx_or_rank, Ctx) else ctx_or_rank
    fmt = lambda v: json.dumps(v, separators=(",", ":")) if isinstance(v, (list, dict)) else str(v)
    line = " ".join([f"RESULT rank={rank}"] + [f"{k}={fmt(v)}" for k, v in values.items()])
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def gather(obj) -> list:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def write_json(path, data, rank: int) -> None:
    if rank != 0:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def finish() -> None:
    if dist.is_initialized():
        gc.collect()    # free dead DDP models now: one collected after the group is gone can abort the exit
        dist.barrier()  # nobody tears down while a partner is still talking to it
        dist.destroy_process_group()
