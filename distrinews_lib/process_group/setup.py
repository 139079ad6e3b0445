"""Before init_process_group: who this process is (torchrun's environment), which backend the group uses and which
device this rank computes on. The scripts still call init_process_group themselves."""

from __future__ import annotations

import os
import socket
from typing import NamedTuple

import torch

from ..devices import gpu_count
from ..errors import UserError


class TorchrunEnv(NamedTuple):
    rank: int  # this process's id among all processes, 0 .. world_size-1
    local_rank: int  # its id on this machine: which GPU it uses
    world_size: int  # how many processes in total
    init_method: str  # where the processes meet: env:// (torchrun's MASTER_ADDR:MASTER_PORT), or a free local port


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_env() -> TorchrunEnv:
    """Who this process is, as torchrun told it; changes nothing. Under plain `python`, a world of one on a
    free local port, so that `python scripts/train_ddp.py` still runs for debugging (1 process; gloo
    without a GPU, nccl with one under --backend auto)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return TorchrunEnv(
            int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ["WORLD_SIZE"]), "env://"
        )
    return TorchrunEnv(0, 0, 1, f"tcp://127.0.0.1:{free_port()}")


def nccl_fits(n_gpus: int, local_world_size: int) -> bool:
    """THE rule for nccl: every rank on this node gets a GPU of its own (ranks sharing a GPU fail or hang)."""
    return n_gpus > 0 and local_world_size <= n_gpus


def choose_backend(requested: str = "auto", local_world_size: int | None = None) -> tuple[str, str]:
    """(backend, one-line reason). nccl only when every rank on this node gets its own GPU."""
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    n_gpu = gpu_count()
    if requested == "nccl":
        if n_gpu == 0:
            raise UserError(
                "--backend nccl needs NVIDIA GPUs, and this machine has none (torch.cuda.is_available() is False). "
                "Use --backend gloo (or auto), which runs DDP on CPU processes."
            )
        if not nccl_fits(n_gpu, local_world_size):
            raise UserError(
                f"--backend nccl with {local_world_size} processes on this node but only {n_gpu} GPU(s): "
                "NCCL needs one GPU per rank, and ranks sharing a GPU fail or hang. "
                f"Launch with --nproc_per_node={n_gpu}, or use --backend gloo."
            )
        return "nccl", f"nccl (asked for): {local_world_size} rank(s), each with its own GPU"
    if requested == "gloo":
        return "gloo", "gloo (asked for): collectives over TCP between CPU processes"
    if requested != "auto":
        raise UserError(f"unknown --backend '{requested}'. Choices: auto, nccl, gloo.")
    if nccl_fits(n_gpu, local_world_size):
        return "nccl", f"nccl: each of the {local_world_size} rank(s) on this node has its own GPU ({n_gpu} found)"
    if n_gpu > 0:
        return "gloo", (
            f"gloo: {local_world_size} ranks but only {n_gpu} GPU(s), so ranks cannot each own a GPU; "
            "training on CPU processes instead"
        )
    return "gloo", "gloo: no CUDA GPU here, so DDP runs on CPU processes and all-reduces over TCP"


def device_for(backend: str, local_rank: int) -> torch.device:
    """nccl ranks use cuda:LOCAL_RANK (and make it the current device); gloo ranks use the CPU."""
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
