"""Rung 4 of chapter 03's ladder, bucketed: gradients grouped, in reverse order, into buckets of --bucket_mb MiB (closed
once they hold at least that, as torch's DDP's are); a bucket leaves once complete, in the same order on every rank.

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/bucketed.py --steps 20 --bucket_mb 1 [--no-broadcast]
"""
import torch
import torch.distributed as dist

from distrinews_course.by_hand.rung import Rung, bucket_cap_bytes
from distrinews_lib.errors import UserError


class BucketedDP(Rung):
    """Average the gradients DURING backward(), a bucket at a time: fewer, larger messages, still overlapped."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        super().__init__(model, bucket_mb, broadcast, timeline)
        self.buckets = make_buckets(self.params, bucket_cap_bytes(bucket_mb))
        self.register_hooks()

    def register_hooks(self):
        """What the hooks keep, and a hook per parameter."""
        self.bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        self.ready = [0] * len(self.buckets)  # how many of each bucket's gradients this backward has completed
        self.pending = []  # (flat buffer, work handle), launched in bucket order (0, 1, 2...) on every rank
        for p in self.params:  # autograd calls the hook once p.grad holds the whole gradient (tied: both uses summed)
            p.register_post_accumulate_grad_hook(lambda p: on_grad_ready(p, self))

    def launch(self, i):
        """Bucket i is complete: copy its gradients into one buffer and start averaging it."""
        flat = torch.cat([p.grad.reshape(-1) for p in self.buckets[i]]).div_(self.world)  # divide first, as DDP
        work = dist.all_reduce(flat, async_op=True)
        self.pending.append((flat, self.timeline.comm(work, f"bucket {i}", flat.nbytes)))

    def sync_gradients(self):
        if len(self.pending) != len(self.buckets):  # a bad bookkeeping: say so on every rank instead of waiting forever
            raise UserError(f"bucket {len(self.pending)} was never launched: on_grad_ready must launch bucket i once "
                            "its last gradient is ready.")
        for i, (flat, work) in enumerate(self.pending):
            work.wait()
            offset = 0
            for p in self.buckets[i]:  # the averages back into the gradients
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.collectives += len(self.pending)
        self.pending, self.ready = [], [0] * len(self.buckets)


def make_buckets(params, cap):
    """The parameters in reverse (the order backward usually completes them), cut into buckets: a bucket closes once
    it holds at least `cap` bytes (torch's DDP's rule, and chapter 00's)."""
    buckets, size = [[]], 0
    for p in reversed(params):
        buckets[-1].append(p)
        size += p.numel() * p.element_size()
        if size >= cap:
            buckets.append([])
            size = 0
    return [b for b in buckets if b]


def on_grad_ready(param, dp):
    """Called by autograd as soon as param.grad is complete: count it; launch every bucket now complete, in order."""
    i = dp.bucket_of[param]
    dp.ready[i] += 1
    if dp.ready[i] > len(dp.buckets[i]):  # more gradients than the bucket holds: a second backward before the step
        raise UserError(f"a second backward() before step(): bucket {i} had already been averaged. This rung averages "
                        "one backward per step: call step() after each backward().")
    while len(dp.pending) < len(dp.buckets) and dp.ready[len(dp.pending)] == len(dp.buckets[len(dp.pending)]):
        dp.launch(len(dp.pending))  # the next bucket in the fixed order is complete: launch it (the same on every rank)


if __name__ == "__main__":
    from distrinews_course.by_hand import harness  # the run around the idea: data, loop, closing check

    harness.run(BucketedDP, __doc__)
