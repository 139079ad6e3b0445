"""Rung 6 of chapter 03's ladder, ZeRO-2 by hand: the bucketed rung, but each bucket is reduce-scattered as it fills
during backward: a rank keeps only its shard of every bucket's gradient (the full gradients are freed), updates only
that shard of the weights, then one all-gather gives every rank every updated weight.

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/zero2.py --steps 20 --bucket_mb 1 [--no-broadcast]
"""
import torch
import torch.distributed as dist
from bucketed import make_buckets  # rung 4's bucket rule, unchanged (its folder is on the path of a script)

from distrinews_course.by_hand.rung import Rung, bucket_cap_bytes, one_dtype
from distrinews_lib.errors import UserError


class Zero2DP(Rung):
    """Reduce-scatter the gradients DURING backward(), a bucket at a time; a rank keeps and updates its shard only."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        super().__init__(model, bucket_mb, broadcast, timeline)
        self.buckets = make_buckets(self.params, bucket_cap_bytes(bucket_mb))
        self.dtype = one_dtype(self.params)
        # Each bucket padded to a multiple of the world size; rank r owns elements [r * s, (r + 1) * s) of each.
        self.shard_sizes = [-(-sum(p.numel() for p in b) // self.world) for b in self.buckets]
        rank = dist.get_rank()
        self.shards = [torch.nn.Parameter(self.flatten(i, [p.detach() for p in b])[rank * s:(rank + 1) * s].clone())
                       for i, (b, s) in enumerate(zip(self.buckets, self.shard_sizes))]
        self.register_hooks()

    def register_hooks(self):
        """What the hooks keep, and a hook per parameter."""
        self.bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        self.ready = [0] * len(self.buckets)  # how many of each bucket's gradients this backward has completed
        self.arrived = set()  # the parameters that got a gradient in this step (theirs are freed once sent)
        self.launched = 0  # buckets launched in this backward, in bucket order (0, 1, 2...) on every rank
        self.pending = []  # (bucket index, this rank's shard of its average, work handle)
        for p in self.params:  # autograd calls the hook once p.grad holds the whole gradient (tied: both uses summed)
            p.register_post_accumulate_grad_hook(lambda p: on_grad_ready(p, self))

    def flatten(self, i, tensors):
        """Bucket i's tensors in one buffer, padded to world x shard."""
        flat = torch.zeros(self.shard_sizes[i] * self.world, dtype=self.dtype)
        torch.cat([t.reshape(-1) for t in tensors], out=flat[:sum(t.numel() for t in tensors)])
        return flat

    def optimizer(self, lr, weight_decay):
        return torch.optim.AdamW(self.shards, lr=lr, weight_decay=weight_decay)  # state for the shards only

    def launch(self, i):
        """Bucket i is complete: reduce-scatter it (this rank receives the sum of its shard only); free the grads."""
        flat = self.flatten(i, [p.grad for p in self.buckets[i]]).div_(self.world)  # divide first, as DDP
        for p in self.buckets[i]:
            p.grad = None  # from now on this rank holds only its shard of these gradients
        mine = torch.empty(self.shard_sizes[i], dtype=self.dtype)
        work = dist.reduce_scatter_tensor(mine, flat, async_op=True)
        self.pending.append((i, mine, self.timeline.comm(work, f"bucket {i}", flat.nbytes)))

    def sync_gradients(self):
        if self.launched:  # a bad bookkeeping: say so on every rank instead of waiting forever
            raise UserError(f"bucket {self.launched} was never launched: launch bucket i once its last gradient is "
                            "ready.")
        for shard in self.shards:
            shard.grad = None
        for i, mine, work in self.pending:
            work.wait()
            shard = self.shards[i]  # a second backward's shard adds to the first's: accumulation comes free
            shard.grad = mine if shard.grad is None else shard.grad.add_(mine)
        self.collectives += len(self.pending)
        self.pending, self.arrived = [], set()

    def missing(self):
        return [p for p in self.params if p not in self.arrived]  # theirs are freed once sent: None says nothing

    def step(self, optimizer):
        super().step(optimizer)  # every rank has every gradient; each rank updates its shards only
        mine = torch.cat([s.detach() for s in self.shards])  # this rank's shard of every bucket: one message
        everyone = torch.empty(self.world * mine.numel(), dtype=self.dtype)
        with self.timeline.span("comm_sync", "all-gather"):
            dist.all_gather_into_tensor(everyone, mine)
        self.collectives += 1
        everyone, offset = everyone.view(self.world, -1), 0
        for b, s in zip(self.buckets, self.shard_sizes):  # every rank's shard of bucket b, in rank order: bucket b
            flat, start = everyone[:, offset:offset + s].reshape(-1), 0
            for p in b:
                p.data.copy_(flat[start:start + p.numel()].view_as(p))
                start += p.numel()
            offset += s


def on_grad_ready(param, dp):
    """Called by autograd as soon as param.grad is complete: count it; launch every bucket now complete, in order."""
    i = dp.bucket_of[param]
    dp.ready[i] += 1
    dp.arrived.add(param)
    while dp.launched < len(dp.buckets) and dp.ready[dp.launched] == len(dp.buckets[dp.launched]):
        dp.launch(dp.launched)  # the next bucket in the fixed order is complete: launch it (the same on every rank)
        dp.launched += 1
    if dp.launched == len(dp.buckets):  # every bucket has left: a second backward starts a new round
        dp.launched, dp.ready = 0, [0] * len(dp.buckets)


if __name__ == "__main__":
    from distrinews_course.by_hand import harness  # the run around the idea: data, loop, closing check

    harness.run(Zero2DP, __doc__)
