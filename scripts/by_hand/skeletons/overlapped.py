"""Exercise 1 of chapter 03: rung 3, overlapped. Average every gradient over the ranks DURING backward().

The class around the synchronisation is given; each function that raises NotImplementedError is yours to write.
Read every line first: the given code says what your functions receive and what they must leave behind.
The checker runs your OverlappedDP in place of scripts/by_hand/overlapped.py's, on 2 ranks, against torch's DDP,
and names the first mistake it finds. Stuck? exercises.hint("overlapped", 1) shows the first of 4 hints.
"""
import torch  # noqa: F401  (for the code you write)
import torch.distributed as dist  # noqa: F401  (for the code you write)

from distrinews_course.by_hand.rung import Rung
from distrinews_lib.errors import UserError  # noqa: F401  (for the errors your code raises)


class OverlappedDP(Rung):
    """Average every gradient over the ranks DURING backward(): a hook launches its async all-reduce once ready."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        super().__init__(model, bucket_mb, broadcast, timeline)
        self.register_hooks()

    def register_hooks(self):
        """Set up what the hooks keep between calls: the launch order (the same on every rank: the parameters in
        reverse, the order in which backward usually completes them), which parameters are ready, and the launched
        all-reduces' work handles. Then make autograd call on_grad_ready(p, self) once p.grad holds this backward's
        whole gradient, for every p in self.params."""
        raise NotImplementedError

    def sync_gradients(self):
        """Before the optimizer step: wait for every all-reduce launched during backward (the averages are then in
        the .grad tensors), add them to self.collectives, and reset what the hooks keep for the next step."""
        raise NotImplementedError


def on_grad_ready(param, dp):
    """Called by autograd once param.grad is complete. Mark param ready; then launch, without waiting, every
    all-reduce that is next in the launch order and ready (each gradient divided by the world size first, as
    torch's DDP does), and keep each work handle (dp.timeline.comm(work, name, nbytes) returns it and draws it
    in the race's Gantt chart). A parameter already ready means a second backward before the step."""
    raise NotImplementedError
