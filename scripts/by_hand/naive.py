"""Rung 1 of chapter 03's ladder, naive data parallelism: after backward(), one all-reduce per gradient.

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/naive.py --steps 20 [--no-broadcast]
"""
import torch.distributed as dist

from distrinews_course.by_hand.rung import Rung


class NaiveDP(Rung):
    """Average every gradient over the ranks after backward(): one blocking all-reduce per parameter."""

    def sync_gradients(self):
        for p in self.params:
            p.grad.div_(self.world)  # divide first, as torch's DDP does (by 2: exact in fp32)
            with self.timeline.span("comm_sync", self.names[p]):
                dist.all_reduce(p.grad)  # SUM over the ranks, in place; blocks until done
            self.collectives += 1


if __name__ == "__main__":
    from distrinews_course.by_hand import harness  # the run around the idea: data, loop, closing check

    harness.run(NaiveDP, __doc__)
