"""Helpers around torch.distributed that are not the lesson: env reading, backend choice, rank-0 I/O.

The training script still calls init_process_group / DDP / destroy_process_group itself; this
module only answers the questions around them (which backend and why, which device, am I rank 0).
"""

from __future__ import annotations

import os
import socket
import sys
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
    if launched:
        die_with_parent()
        _fresh_store_after_a_restart()
    # Gloo connects each pair of ranks on first use instead of all at start-up: its eager full-mesh
    # connect fails ~half the time right after a torchrun --max-restarts restart ("Connection refused",
    # cf. pytorch/pytorch#167288); lazily, 12 of 12 restarts here went through.
    os.environ.setdefault("TORCH_GLOO_LAZY_INIT", "1")
    if not launched:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    if os.environ.get("DISTRINEWS_RANKS_DIR"):  # the launcher counts the ranks that really started (launch.py)
        marker = os.path.join(os.environ["DISTRINEWS_RANKS_DIR"], f"rank{os.environ['RANK']}")
        with open(marker, "w") as f:
            f.write(f"{os.getpid()} {os.environ['WORLD_SIZE']}\n")
    return DistInfo(
        rank=int(os.environ["RANK"]),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        world_size=int(os.environ["WORLD_SIZE"]),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])),
        launched_by_torchrun=launched,
    )


_ATTEMPT_STORE = None  # rank 0 hosts it for the whole life of the process


def _fresh_store_after_a_restart() -> None:
    """Give every attempt after a torchrun restart a rendezvous store of its own.

    The restarted ranks meet in the torchrun agent's store again, where the dead attempt's keys are
    still there, and gloo can read a dead rank's address from them and fail with "Connection refused"
    (pytorch/pytorch#167288; seen here on 3 of 3 restarts with some timings). Rank 0 starts a fresh
    store and publishes its address under a key of this attempt; every rank then rendezvous there."""
    global _ATTEMPT_STORE
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if attempt == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in os.environ:
        return
    from datetime import timedelta

    agent_addr, agent_port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    agent = dist.TCPStore(agent_addr, agent_port, is_master=False, timeout=timedelta(seconds=300))
    key = f"distrinews/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/attempt{attempt}/store"
    if int(os.environ.get("RANK", 0)) == 0:
        _ATTEMPT_STORE = dist.TCPStore("0.0.0.0", 0, is_master=True, timeout=timedelta(seconds=300), wait_for_workers=False)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # the address the others reach us at
            probe.connect((agent_addr, agent_port))
            host = probe.getsockname()[0]
        agent.set(key, f"{host}:{_ATTEMPT_STORE.port}")
    host, port = agent.get(key).decode().rsplit(":", 1)  # waits until rank 0 has published it
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = host, port


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
                f"--backend nccl with {local_world_size} processes on this node but only {n_gpu} GPU(s): NCCL needs one "
                f"GPU per rank, and ranks sharing a GPU fail or hang. Launch with --nproc_per_node={n_gpu}, or use --backend gloo."
            )
        return "nccl", f"nccl (asked for): {local_world_size} rank(s), each with its own GPU"
    if requested == "gloo":
        return "gloo", "gloo (asked for): collectives over TCP between CPU processes"
    if requested != "auto":
        raise UserError(f"unknown --backend '{requested}'. Choices: auto, nccl, gloo.")
    if nccl_fits(n_gpu, local_world_size):
        return "nccl", f"nccl: each of the {local_world_size} rank(s) on this node has its own GPU ({n_gpu} found)"
    if n_gpu > 0:
        return "gloo", (f"gloo: {local_world_size} ranks but only {n_gpu} GPU(s), so ranks cannot each own a GPU; "
                        "training on CPU processes instead")
    return "gloo", "gloo: no CUDA GPU here, so DDP runs on CPU processes and all-reduces over TCP"


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


def max_param_difference(model: torch.nn.Module) -> float:
    """Largest |difference| between this rank's parameters and rank 0's, maxed over ranks (0.0: identical)."""
    flat = torch.cat([p.detach().reshape(-1).double().cpu() for p in model.parameters()])
    if not is_initialized() or get_world_size() == 1:
        return 0.0
    device = next(model.parameters()).device
    ref = flat.to(device).clone()
    dist.broadcast(ref, src=0)
    diff = (flat.to(device) - ref).abs().max().reshape(1)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    return float(diff.item())


def agree(fn, *args, **kwargs):
    """Run fn on every rank; if it raised a UserError on ANY rank, raise one on every rank.

    Without this, the rank that failed exits while the others wait in their next collective until
    the timeout. Collective: every rank must call it.
    """
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
        raise UserError(f"rank(s) {', '.join(map(str, odd))} do not hold the same {what} as rank 0 "
                        f"({values[odd[0]]!r} vs {values[0]!r}). {hint}".rstrip() + ".")


def local_main_first(fn, *args, **kwargs):
    """Run fn on this node's local rank 0 first, then on the other local ranks (which then find its cache).

    The barrier is reached even when fn fails, so a failure cannot turn into a hang."""
    first = int(os.environ.get("LOCAL_RANK", 0)) == 0
    if not first:
        barrier()
    try:
        return fn(*args, **kwargs)
    finally:
        if first:
            barrier()


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the torchrun agent) dies, so a killed launcher
    never leaves ranks behind holding GPUs and ports. A no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
    except (OSError, AttributeError):
        pass
