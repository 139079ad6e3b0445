"""Helpers around torch.distributed that are not the lesson: env reading, backend choice, rank-0 I/O.

The training script still calls init_process_group / DDP / destroy_process_group itself; this
module only answers the questions around them (which backend and why, which device, am I rank 0).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .errors import UserError


@dataclass
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    launched_by_torchrun: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_torchrun_env() -> DistInfo:
    """Read torchrun's env; when the script was started with plain `python`, make it a world of one.

    That way `python scripts/train_ddp.py` still runs (1 process, gloo), which helps debugging.
    """
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    # Gloo connects each pair of ranks on first use instead of all at start-up: its eager full-mesh
    # connect fails ~half the time right after a torchrun --max-restarts restart ("Connection refused",
    # cf. pytorch/pytorch#167288); lazily, 12 of 12 restarts here went through.
    os.environ.setdefault("TORCH_GLOO_LAZY_INIT", "1")
    if not launched:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    return DistInfo(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=int(os.environ["WORLD_SIZE"]),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])),
        launched_by_torchrun=launched,
    )


def choose_backend(requested: str = "auto", local_world_size: int | None = None) -> tuple[str, str]:
    """(backend, one-line reason). nccl only when every rank on this node gets its own GPU."""
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "nccl":
        if n_gpu == 0:
            raise UserError(
                "--backend nccl needs NVIDIA GPUs, and this machine has none (torch.cuda.is_available() is False). "
                "Use --backend gloo (or auto), which runs DDP on CPU processes."
            )
        if local_world_size > n_gpu:
            raise UserError(
                f"--backend nccl with {local_world_size} processes on this node but only {n_gpu} GPU(s): NCCL needs one "
                f"GPU per rank, and ranks sharing a GPU fail or hang. Launch with --nproc_per_node={n_gpu}, or use --backend gloo."
            )
        return "nccl", f"nccl (asked for): {local_world_size} rank(s), each with its own GPU"
    if requested == "gloo":
        return "gloo", "gloo (asked for): collectives over TCP between CPU processes"
    if requested != "auto":
        raise UserError(f"unknown --backend '{requested}'. Choices: auto, nccl, gloo.")
    if n_gpu >= local_world_size and n_gpu > 0:
        return "nccl", f"nccl: each of the {local_world_size} rank(s) on this node has its own GPU ({n_gpu} found)"
    if n_gpu > 0:
        return "gloo", (f"gloo: {local_world_size} ranks but only {n_gpu} GPU(s), so ranks cannot each own a GPU; "
                        "training on CPU processes instead")
    return "gloo", "gloo: no CUDA GPU here, so DDP runs on CPU processes and all-reduces over TCP"


def device_for(backend: str, local_rank: int) -> torch.device:
    """nccl ranks use cuda:LOCAL_RANK; gloo ranks use the CPU."""
    if backend == "nccl":
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


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


def barrier() -> None:
    if is_initialized():
        dist.barrier()


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Average a tensor over ranks (returns a new tensor; identity on one process)."""
    t = tensor.detach().clone()
    if is_initialized() and get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= get_world_size()
    return t


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    t = tensor.detach().clone()
    if is_initialized() and get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double().cpu() for p in model.parameters()])


def max_param_difference(model: torch.nn.Module) -> float:
    """Largest |difference| between this rank's parameters and rank 0's, maxed over ranks (0.0: identical)."""
    flat = flat_params(model)
    if not is_initialized() or get_world_size() == 1:
        return 0.0
    device = next(model.parameters()).device
    ref = flat.to(device).clone()
    dist.broadcast(ref, src=0)
    diff = (flat.to(device) - ref).abs().max().reshape(1)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    return float(diff.item())
