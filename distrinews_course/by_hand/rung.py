"""The base every rung of scripts/by_hand/ extends: what a data-parallel wrapper needs that is not its idea.

A rung wraps a model under whatever default process group is initialized, as torch's DDP does (a learner's own
`dist.init_process_group("gloo", ...)` is enough): it lists the parameters it averages, starts every rank from rank
0's weights, makes the side group of its small agreements itself (collectively, in its constructor), and steps:
every rank has every gradient, then the rung's own sync_gradients(), then the optimizer.
"""

from __future__ import annotations

import weakref
from contextlib import nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist


def refusal(message: str) -> Exception:
    """A learner's mistake as the harness's one-paragraph error: distrinews_lib's UserError, loaded once one is due."""
    from distrinews_lib.errors import UserError

    return UserError(message)


class Untimed:
    """The timeline of a rung nobody times (the race and the checker pass a timeline.Timeline): it records nothing."""

    on = False

    def ready(self, name: str) -> None:
        pass

    def span(self, kind: str, name: str = ""):
        return nullcontext()

    def comm(self, work, name: str, nbytes: int):
        return work


class Rung:
    """Data parallelism over the default process group; a rung writes sync_gradients() (and its hooks)."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        if not dist.is_initialized():
            raise refusal(
                "no process group: call torch.distributed.init_process_group (gloo) before wrapping the model, as "
                "torch's DistributedDataParallel needs (torchrun sets the environment it reads)"
            )
        self.model, self.world = model, dist.get_world_size()
        self.params = [p for p in model.parameters() if p.requires_grad]  # a tied weight once; frozen ones not at all
        self.names = param_names(model)
        self.timeline = timeline or Untimed()
        self.collectives = 0  # collectives launched so far
        self.agreement = agreement_group()  # made here, by every rank together (new_group is a collective)
        if broadcast:  # every rank starts from rank 0's weights (the ranks seeded differently)
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)

    def optimizer(self, lr, weight_decay):
        return torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)

    def missing(self) -> list:
        """The parameters that got no gradient in this step, on this rank."""
        return [p for p in self.params if p.grad is None]

    def step(self, optimizer):
        stop_unless_every_rank_has(self, self.missing())  # on every rank, not one
        self.sync_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync_gradients(self):
        raise NotImplementedError("a rung averages the gradients in sync_gradients()")


# default group -> the agreement group made under it (the checker's watch.py reads it too)
AGREEMENT_GROUPS = weakref.WeakKeyDictionary()


def agreement_group():
    """The side group for the rungs' small agreements under the current default group: made on first use, by every
    rank together, then reused. Its collectives never pair with the gradients' own, which may still be in flight (and
    unmatched) on the default group when something went wrong; its timeout leaves room for a rank stuck that long in
    the default group to arrive."""
    from torch.distributed.distributed_c10d import _get_default_group

    default = _get_default_group()
    group = AGREEMENT_GROUPS.get(default)
    if group is None:
        timeout = 2 * group_timeout(default) + timedelta(seconds=5)
        group = AGREEMENT_GROUPS[default] = dist.new_group(backend="gloo", timeout=timeout)
    return group


def group_timeout(group) -> timedelta:
    """The timeout of a gloo process group (torch's default, 30 minutes, where it cannot be read)."""
    try:
        return group._get_backend(torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):
        return timedelta(minutes=30)


def stop_unless_every_rank_has(dp, missing) -> None:
    """Every rank says which of dp.params got no gradient in this step (`missing`); if any rank misses one, EVERY rank
    stops here with the same message, instead of one rank raising while the others wait in a collective it will
    never join (then crash when it exits). One all-reduce of a bit per rank and parameter, on the agreement group."""
    index = {id(p): i for i, p in enumerate(dp.params)}
    bits = torch.zeros(len(dp.params), dtype=torch.int64)
    for p in missing:
        bits[index[id(p)]] = 1 << dist.get_rank()  # the SUM of one distinct bit per rank is their OR
    dist.all_reduce(bits, group=getattr(dp, "agreement", None) or agreement_group())
    holes = bits.nonzero().flatten().tolist()
    if holes:
        first = int(bits[holes[0]])
        ranks = [r for r in range(dist.get_world_size()) if first >> r & 1]
        more = f" (and {len(holes) - 1} more)" if len(holes) > 1 else ""
        raise refusal(
            f"an unused parameter: {dp.names[dp.params[holes[0]]]}{more} got no gradient in this step on "
            f"rank {', '.join(map(str, ranks))} of {dist.get_world_size()}: it took no part in the loss "
            "there. Every rank stops here. Use every parameter in forward on every rank (torch's DDP "
            "needs find_unused_parameters=True for a model that does not)."
        )


def one_dtype(params) -> torch.dtype:
    """The parameters' one dtype (a flat buffer holds one); a clear error for a model that mixes them."""
    dtypes = {p.dtype for p in params}
    if len(dtypes) != 1:
        raise refusal(f"the parameters mix dtypes {sorted(map(str, dtypes))}: one flat buffer holds one dtype")
    return dtypes.pop()


def bucket_cap_bytes(bucket_mb) -> float:
    """A bucket's cap in bytes: 25 MiB when none is given (torch's DDP's default); 0 puts every gradient in a bucket
    of its own, as in torch's DDP."""
    if bucket_mb is None:
        return 25 * 2**20
    if bucket_mb < 0:
        raise refusal(f"bucket size {bucket_mb} MiB: give 0 (a bucket per gradient) or more")
    return bucket_mb * 2**20


def param_names(model) -> dict:
    return {p: n for n, p in model.named_parameters()}


def first_tensor_needing_grad(out):
    """The first tensor in a module's output (a tensor, tuple, list or dict) that autograd will send a gradient to."""
    if torch.is_tensor(out):
        return out if out.requires_grad else None
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    return next((t for t in map(first_tensor_needing_grad, values) if t is not None), None)
