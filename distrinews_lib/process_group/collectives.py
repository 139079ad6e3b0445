"""What every rank calls together: a barrier, sums and gathers, the check that every rank holds the same weights or
data, and running a step so that one rank's mistake stops every rank instead of leaving the others waiting. Outside a
process group (a single process) each is what it would be in a world of one."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ..errors import UserError
from .ranks import get_world_size, is_initialized


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
