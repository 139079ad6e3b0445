"""Rung 3 of chapter 03's ladder, overlapped: each gradient's all-reduce leaves as soon as backward has produced it
(and every one before it in a fixed order, the same on every rank).

    torchrun --standalone --nproc_per_node=2 scripts/by_hand/overlapped.py --steps 20 [--no-broadcast]
"""
import torch.distributed as dist

from distrinews_course.by_hand.rung import Rung
from distrinews_lib.errors import UserError


class OverlappedDP(Rung):
    """Average every gradient over the ranks DURING backward(): a hook launches its async all-reduce once ready."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        super().__init__(model, bucket_mb, broadcast, timeline)
        self.register_hooks()

    def register_hooks(self):
        """What the hooks keep, and a hook per parameter."""
        self.order = list(reversed(self.params))  # the launch order, the same on every rank: backward's usual one
        self.ready = set()  # the parameters whose gradient this backward has completed
        self.pending = []  # (parameter, work handle), launched in self.order's order
        for p in self.params:  # autograd calls the hook once p.grad holds the whole gradient (tied: both uses summed)
            p.register_post_accumulate_grad_hook(lambda p: on_grad_ready(p, self))

    def sync_gradients(self):
        if len(self.pending) != len(self.params):  # a bad hook: say so on every rank instead of waiting forever
            raise UserError(f"{len(self.params)} gradients, {len(self.pending)} all-reduces launched by the hook: "
                            "on_grad_ready must launch exactly one all-reduce per parameter and keep its handle.")
        for p, work in self.pending:
            work.wait()  # the step needs every average; most have arrived while backward ran
        self.collectives += len(self.pending)
        self.pending, self.ready = [], set()


def on_grad_ready(param, dp):
    """Called by autograd as soon as param.grad is complete: launch, without waiting, every all-reduce now due in the
    fixed order. Not in readiness order: gloo pairs the ranks' n-th all-reduces, which must be the same tensor."""
    if param in dp.ready:  # its gradient completed twice: a second backward before the step
        raise UserError(f"a second backward() before step(): {dp.names[param]}'s gradient was already being averaged. "
                        "This rung averages one backward per step: call step() after each backward().")
    dp.ready.add(param)
    while len(dp.pending) < len(dp.order) and dp.order[len(dp.pending)] in dp.ready:
        p = dp.order[len(dp.pending)]  # the next one in the fixed order, and it is ready
        p.grad.div_(dp.world)  # divide first, as torch's DDP does (by 2: exact in fp32)
        work = dist.all_reduce(p.grad, async_op=True)  # returns at once; gloo's thread does the sending
        dp.pending.append((p, dp.timeline.comm(work, dp.names[p], p.grad.nbytes)))


if __name__ == "__main__":
    from distrinews_course.by_hand import harness  # the run around the idea: data, loop, closing check

    harness.run(OverlappedDP, __doc__)
