"""The measuring half of chapter 00's scripts/concepts/02_ddp_backward.py, kept out of the script so that it shows
DDP and its communication hook:

    clock = GradClock(params)         seconds since backward() started; notes when each gradient is computed
    clock.not_ready()                 how many gradients backward has still to compute (each .grad None until then)
    steps.append(clock.backward(loss, buckets))   loss.backward(), timed; that step's bucket events and gradients
    timed_allreduce(bucket, event, clock)   the hook's all-reduce (DDP's default), noting event["done"] at its end
    compare_with_local(ddp, params, loss_fn, world)   DDP's .grad against this rank's own gradient (no_sync)
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


class GradClock:
    """A clock started by backward(), and the moment each parameter's gradient was accumulated, as (seconds, index)."""

    def __init__(self, params):
        self.params, self.t0, self.ready = list(params), time.perf_counter(), []
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda _, i=i: self.ready.append((self(), i)))

    def __call__(self) -> float:
        return time.perf_counter() - self.t0

    def not_ready(self) -> int:
        return sum(p.grad is None for p in self.params)

    def backward(self, loss: torch.Tensor, buckets: list) -> dict:
        """Run loss.backward() on a fresh clock (and wait for the GPU); this step's events only: `buckets` (filled by
        the communication hook) and the gradients are emptied first."""
        del buckets[:], self.ready[:]
        self.t0 = time.perf_counter()
        loss.backward()
        device = loss.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return {"backward_s": self(), "buckets": [dict(b) for b in buckets], "grad_ready": sorted(self.ready)}


def timed_allreduce(bucket, event: dict, clock: GradClock) -> torch.futures.Future:
    """All-reduce a DDP bucket exactly as DDP does without a hook (default_hooks.allreduce_hook: sum, then divide by
    the world size), and note in event["done"] the clock's time when that all-reduce completed. The future it returns
    is what a communication hook hands back to DDP: the bucket's averaged gradients."""

    def done(fut: torch.futures.Future) -> torch.Tensor:
        event["done"] = clock()
        return fut.value()

    return default_hooks.allreduce_hook(None, bucket).then(done)


def compare_with_local(ddp, params, loss_fn, world: int) -> dict:  # loss_fn(ddp): the step's loss again
    """What DDP left in .grad, against this rank's own gradient of the same loss (recomputed under no_sync, so not
    all-reduced), the mean of every rank's own gradient, and rank 0's .grad. DDP keeps its promise when the first
    figure is ~0 (rounding), the second is not (the ranks' data differ) and every rank holds rank 0's."""
    synced = torch.cat([p.grad.reshape(-1) for p in params])
    with ddp.no_sync():
        ddp.zero_grad(set_to_none=True)
        loss_fn(ddp).backward()
    local = torch.cat([p.grad.reshape(-1) for p in params])
    mean_local, rank0 = local.clone(), synced.clone()
    dist.all_reduce(mean_local)  # the sum of the local gradients
    dist.broadcast(rank0, src=0)  # rank 0's, to compare with
    return {
        "ddp_vs_mean_of_local": float((synced - mean_local / world).abs().max()),
        "ddp_vs_local": float((synced - local).abs().max()),
        "same_as_rank0": torch.equal(rank0, synced),
    }
