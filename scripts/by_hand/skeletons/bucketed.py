"""Exercise 2 of chapter 03: rung 4, bucketed. Average the gradients DURING backward(), a bucket at a time.

The class around the synchronisation is given; each function that raises NotImplementedError is yours to write.
The checker runs your DataParallel in place of scripts/by_hand/bucketed.py's, on 2 ranks, against torch's DDP,
and names the first mistake it finds. Stuck? by_hand_check.hint("bucketed", 1) shows the first of 4 hints.
"""
import torch
import torch.distributed as dist

from distrinews_course import by_hand
from distrinews_lib.errors import UserError  # noqa: F401  (for the errors your code raises)


class DataParallel:
    """Average the gradients DURING backward(), a bucket at a time: fewer, larger messages, still overlapped."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        self.model, self.world = model, dist.get_world_size()
        self.params = [p for p in model.parameters() if p.requires_grad]  # a tied weight is listed once
        self.names = by_hand.param_names(model)
        self.timeline = timeline or by_hand.Timeline()
        self.collectives = 0  # collectives launched so far
        if broadcast:  # every rank starts from rank 0's weights (the ranks seeded differently)
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t.data, src=0)
        self.buckets = make_buckets(self.params, (bucket_mb or 25) * 2**20)
        self.register_hooks()

    def register_hooks(self):
        """Set up what the hooks keep between calls (which bucket each parameter is in, how many of each bucket's
        gradients are ready, the launched buckets' buffers and work handles), then make autograd call
        on_grad_ready(p, self) once p.grad holds this backward's whole gradient, for every p in self.params."""
        raise NotImplementedError

    def launch(self, i):
        """Bucket i is complete: its gradients in one flat buffer, divided by the world size (as torch's DDP does),
        its all-reduce launched without waiting; keep the buffer and the work handle."""
        raise NotImplementedError

    def sync_gradients(self):
        """Before the optimizer step: wait for each bucket's all-reduce, copy its averages back into its parameters'
        .grad, add the buckets to self.collectives, and reset what the hooks keep for the next step."""
        raise NotImplementedError

    def optimizer(self, lr, weight_decay):
        return torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)

    def step(self, optimizer):
        by_hand.stop_unless_every_rank_has(self, [p for p in self.params if p.grad is None])  # on every rank, not one
        self.sync_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def make_buckets(params, cap):
    """The rule: walk the parameters in reverse (the order in which backward usually completes them), add each to
    the current bucket, and close the bucket once it holds at least `cap` bytes (torch's DDP's rule). Returns a list
    of buckets, each a list of parameters (the checker compares them with torch's DDP's own)."""
    raise NotImplementedError


def on_grad_ready(param, dp):
    """Called by autograd once param.grad is complete. Count it in its bucket; then launch every bucket that is next
    in bucket order and complete: the same order on every rank. More gradients than a bucket holds means a second
    backward before the step."""
    raise NotImplementedError
