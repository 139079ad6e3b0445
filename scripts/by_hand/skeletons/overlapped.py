"""Exercise 1 of chapter 03: rung 3, overlapped. Average every gradient over the ranks DURING backward().

The class around the synchronisation is given; each function that raises NotImplementedError is yours to write.
The checker runs your DataParallel in place of scripts/by_hand/overlapped.py's, on 2 ranks, against torch's DDP,
and names the first mistake it finds. Stuck? by_hand_check.hint("overlapped", 1) shows the first of 4 hints.
"""
import torch
import torch.distributed as dist

from distrinews_course import by_hand
from distrinews_lib.errors import UserError  # noqa: F401  (for the errors your code raises)


class DataParallel:
    """Average every gradient over the ranks DURING backward(): a hook launches its async all-reduce once ready."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        self.model, self.world = model, dist.get_world_size()
        self.params = [p for p in model.parameters() if p.requires_grad]  # a tied weight is listed once
        self.names = by_hand.param_names(model)
        self.timeline = timeline or by_hand.Timeline()
        self.collectives = 0  # collectives launched so far
        if broadcast:  # every rank starts from rank 0's weights (the ranks seeded differently)
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)
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

    def optimizer(self, lr, weight_decay):
        return torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)

    def step(self, optimizer):
        by_hand.stop_unless_every_rank_has(self, [p for p in self.params if p.grad is None])  # on every rank, not one
        self.sync_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def on_grad_ready(param, dp):
    """Called by autograd once param.grad is complete. Mark param ready; then launch, without waiting, every
    all-reduce that is next in the launch order and ready (each gradient divided by the world size first, as
    torch's DDP does), and keep each work handle (dp.timeline.comm(work, name, nbytes) returns it and draws it
    in the race's Gantt chart). A parameter already ready means a second backward before the step."""
    raise NotImplementedError
