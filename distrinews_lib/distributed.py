"""Helpers around torch.distributed that are not the lesson: env reading, backend choice, rank-0 I/O.
The scripts still call init_process_group / DDP / destroy_process_group themselves."""

from __future__ import annotations

import atexit
import gc
import logging
import os
import socket
import sys
import traceback
from typing import Callable, NamedTuple, NoReturn

import torch
import torch.distributed as dist

from .errors import UserError, exit_code_of


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
    free local port, so that `python scripts/train_ddp.py` still runs (1 process, gloo) for debugging."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return TorchrunEnv(
            int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ["WORLD_SIZE"]), "env://"
        )
    return TorchrunEnv(0, 0, 1, f"tcp://127.0.0.1:{free_port()}")


def nccl_fits(n_gpus: int, local_world_size: int) -> bool:
    """THE rule for nccl: every rank on this node gets a GPU of its own (ranks sharing a GPU fail or hang)."""
    return n_gpus > 0 and local_world_size <= n_gpus


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


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


def resolve_device(requested: str | None = "auto") -> torch.device:
    """auto (or None): cuda:0 when there is a GPU, else cpu; otherwise the named device (cpu, cuda, cuda:N), checked."""
    if requested in ("auto", None, ""):
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(requested)
    except (RuntimeError, ValueError):
        raise UserError(f"device '{requested}' is not a valid torch device; use auto, cpu, cuda or cuda:N.") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"device '{requested}' was asked for, but this machine has no usable CUDA GPU; use cpu or auto."
        )
    return device


def device_for(backend: str, local_rank: int) -> torch.device:
    """nccl ranks use cuda:LOCAL_RANK (and make it the current device); gloo ranks use the CPU."""
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def node_name() -> str:
    return f"{socket.gethostname()}, local rank {os.environ.get('LOCAL_RANK', 0)}"


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


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    t = tensor.detach().clone()
    if is_initialized() and get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def max_param_difference(model) -> float:
    """Largest |difference| between this rank's parameters and rank 0's, maxed over ranks (0.0: identical). `model`
    is a module, or its weights as a list of tensors (a sharded model gathers them first)."""
    tensors = list(model.parameters()) if isinstance(model, torch.nn.Module) else list(model)
    flat = torch.cat([p.detach().reshape(-1).double().cpu() for p in tensors])
    if not is_initialized() or get_world_size() == 1:
        return 0.0
    device = tensors[0].device
    ref = flat.to(device).clone()
    dist.broadcast(ref, src=0)
    diff = (flat.to(device) - ref).abs().max().reshape(1)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    return float(diff.item())


def comm_device(device: torch.device) -> torch.device:
    """Where collectives take their tensors: nccl wants CUDA tensors, gloo takes CPU ones."""
    if is_initialized() and dist.get_backend() == "nccl":
        return device
    return torch.device("cpu")


def all_gather_varlen(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """all_gather for 1-D tensors whose length differs per rank (on the CPU, in rank order)."""
    if not is_initialized() or get_world_size() == 1:
        return t.cpu()
    t = t.to(device)
    n = torch.tensor([t.numel()], device=device)
    sizes = [torch.zeros_like(n) for _ in range(get_world_size())]
    dist.all_gather(sizes, n)
    width = int(max(s.item() for s in sizes))
    padded = torch.zeros(width, dtype=t.dtype, device=device)
    padded[: t.numel()] = t
    out = [torch.zeros_like(padded) for _ in sizes]
    dist.all_gather(out, padded)
    return torch.cat([o[: int(s.item())] for o, s in zip(out, sizes)]).cpu()


def gather_by_index(index: torch.Tensor, *columns: torch.Tensor, device: torch.device, gather: bool = True) -> tuple:
    """Every rank's (index, columns...) rows by dataset index, each index once (DistributedSampler pads the
    shards with repeats). gather=False keeps this rank's rows (no collective); else collective."""
    comm = comm_device(device)
    index, *columns = (all_gather_varlen(c, comm) if gather else c.cpu() for c in (index, *columns))
    order = torch.argsort(index, stable=True)
    index, columns = index[order], [c[order] for c in columns]
    first = torch.ones_like(index, dtype=torch.bool)
    first[1:] = index[1:] != index[:-1]
    return (index[first], *(c[first] for c in columns))


def agree(fn, *args, **kwargs):
    """Run fn on every rank; if it raised a UserError on ANY rank, raise one on every rank (else the others
    would wait in their next collective until the timeout). Collective."""
    result, error = None, None
    try:
        result = fn(*args, **kwargs)
    except UserError as err:
        error = " ".join(str(err).split())
    if not is_initialized() or get_world_size() == 1:
        if error is not None:
            raise UserError(error)
        return result
    errors = [None] * get_world_size()
    dist.all_gather_object(errors, error)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if failed:
        rank, first = failed[0]
        others = f" ({len(failed) - 1} other rank(s) failed too)" if len(failed) > 1 else ""
        raise UserError(f"rank {rank}: {first}{others}")
    return result


def same_on_all_ranks(value, what: str, hint: str = "") -> None:
    """Raise on every rank unless every rank holds the same `value` (e.g. a fingerprint of its data). Collective."""
    if not is_initialized() or get_world_size() == 1:
        return
    values = [None] * get_world_size()
    dist.all_gather_object(values, value)
    odd = [r for r, v in enumerate(values) if v != values[0]]
    if odd:
        raise UserError(
            f"rank(s) {', '.join(map(str, odd))} do not hold the same {what} as rank 0 "
            f"({values[odd[0]]!r} vs {values[0]!r}). {hint}".rstrip()
            + "."
        )


def local_main_first(fn, *args, **kwargs):
    """Run fn on this node's local rank 0 first, then on the others (which find its cache). The barrier is
    reached even when fn fails, so a failure cannot turn into a hang."""
    first = int(os.environ.get("LOCAL_RANK", 0)) == 0
    if not first:
        barrier()
    try:
        return fn(*args, **kwargs)
    finally:
        if first:
            barrier()


# --------------------------------------------------------------------------- ending a process that joined a group


def end_process(code: int = 0) -> NoReturn:
    """End a process that joined a process group, without the interpreter's teardown.

    Why: gloo's worker threads can still hold finished async work (and its tensors) when Python finalizes; releasing
    them then takes the GIL during teardown and the process aborts ("terminate called without an active exception",
    exit -6) after all its work is done: 1 run in 15 of a bare torch DDP loop (scripts/repro_exit_abort.py measures
    it). An upstream fix (destroying groups at exit) was abandoned, so a finished rank leaves here instead:
    1. unreachable objects are collected (finished work handles and their tensors are dropped while the
       interpreter is whole), and the process group is destroyed if the script has not done it;
    2. Python's exit handlers run (trackers, logging: what a normal exit would flush) and stdout/stderr are flushed;
    3. os._exit(code): no interpreter teardown, no C++ static destructors to race gloo's threads.
    The code is the script's own: a failed rank still exits non-zero, after its message."""
    try:
        gc.collect()
        if is_initialized():
            dist.destroy_process_group()
        gc.collect()
    except Exception as err:  # noqa: BLE001  (tearing down after a failure may fail too; the exit code stands)
        sys.stderr.write(f"[rank {os.environ.get('RANK', 0)}] process group teardown: {err}\n")
        code = code or 1
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
    except Exception:  # noqa: BLE001
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def run_and_end(main: Callable[[], object]) -> NoReturn:
    """main(), then end_process with main's exit code (errors.exit_code_of: a return value or sys.exit(...) as
    usual, 1 after an uncaught exception, whose traceback is printed first, as Python would)."""
    end_process(exit_code_of(main))
