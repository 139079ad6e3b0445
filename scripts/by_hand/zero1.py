"""Rung 5 of chapter 03's ladder, ZeRO-1 by hand: the flat rung, with the optimizer sharded over the ranks: each keeps
AdamW state for its even share of the flat buffer only, updates that share, then gathers the updated weights.

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/zero1.py --steps 20 [--no-broadcast]
"""
import torch
import torch.distributed as dist

from distrinews_course.by_hand.rung import Rung, one_dtype, stop_unless_every_rank_has


class Zero1DP(Rung):
    """One flat buffer split evenly: rank r owns elements [r * shard, (r + 1) * shard) and only updates those."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        super().__init__(model, bucket_mb, broadcast, timeline)
        self.dtype = one_dtype(self.params)  # the flat buffers keep it: float64 trains in float64
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = -(-self.numel // self.world)  # rounded up: padding gives every rank the same length
        self.shard = self.make_shard()

    def make_shard(self):
        """This rank's share of the weights, the only part its optimizer sees (and keeps AdamW state for)."""
        lo = dist.get_rank() * self.shard_size
        return torch.nn.Parameter(self.flatten([p.detach() for p in self.params])[lo:lo + self.shard_size].clone())

    def flatten(self, tensors):
        flat = torch.zeros(self.shard_size * self.world, dtype=self.dtype)
        torch.cat([t.reshape(-1) for t in tensors], out=flat[:self.numel])
        return flat

    def unflatten(self, flat):
        offset = 0
        for p in self.params:  # the gathered weights back into the model
            p.data.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()

    def optimizer(self, lr, weight_decay):
        return torch.optim.AdamW([self.shard], lr=lr, weight_decay=weight_decay)  # state for the shard only

    def step(self, optimizer):
        stop_unless_every_rank_has(self, self.missing())  # on every rank, not one
        sharded_step(self, optimizer)
        self.collectives += 2  # a reduce-scatter and an all-gather
        for p in self.params:
            p.grad = None


def sharded_step(dp, optimizer):
    """Average the gradients of this rank's share only, update that share, then share the updated weights."""
    grads = dp.flatten([p.grad for p in dp.params]).div_(dp.world)  # divide first, as torch's DDP does
    dp.shard.grad = torch.empty_like(dp.shard)
    with dp.timeline.span("comm_sync", "reduce-scatter"):
        dist.reduce_scatter_tensor(dp.shard.grad, grads)  # rank r receives the SUM of elements in its share only
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    weights = torch.empty_like(grads)
    with dp.timeline.span("comm_sync", "all-gather"):
        dist.all_gather_into_tensor(weights, dp.shard.detach())  # every rank gets every rank's updated share
    dp.unflatten(weights)


if __name__ == "__main__":
    from distrinews_course.by_hand import harness  # the run around the idea: data, loop, closing check

    harness.run(Zero1DP, __doc__)
