"""Rung 2 of chapter 03's ladder, flat: after backward(), ONE all-reduce of every gradient in one buffer.

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/flat.py --steps 20 [--no-broadcast]
"""
import torch
import torch.distributed as dist

from distrinews_course.by_hand.rung import Rung


class FlatDP(Rung):
    """Average every gradient over the ranks after backward(): all of them flattened into one buffer, one all-reduce."""

    def sync_gradients(self):
        flat = torch.cat([p.grad.reshape(-1) for p in self.params]).div_(self.world)  # one message, not one per tensor
        with self.timeline.span("comm_sync", "all gradients"):
            dist.all_reduce(flat)  # SUM over the ranks, in place; blocks until done
        self.collectives += 1
        offset = 0
        for p in self.params:  # the averages back into the gradients
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


if __name__ == "__main__":
    from distrinews_course.by_hand import harness  # the run around the idea: data, loop, closing check

    harness.run(FlatDP, __doc__)
