"""Exercise 2 of chapter 03: rung 4, bucketed. Average the gradients DURING backward(), a bucket at a time.

The class around the synchronisation is given; each function that raises NotImplementedError is yours to write.
Read every line first: the given code says what your functions receive and what they must leave behind.
The checker runs your BucketedDP in place of scripts/by_hand/bucketed.py's, on 2 ranks, against torch's DDP,
and names the first mistake it finds. Stuck? exercises.hint("bucketed", 1) shows the first of 4 hints.
"""
import torch  # noqa: F401  (for the code you write)
import torch.distributed as dist  # noqa: F401  (for the code you write)

from distrinews_course.by_hand.rung import Rung, bucket_cap_bytes
from distrinews_lib.errors import UserError  # noqa: F401  (for the errors your code raises)


class BucketedDP(Rung):
    """Average the gradients DURING backward(), a bucket at a time: fewer, larger messages, still overlapped."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        super().__init__(model, bucket_mb, broadcast, timeline)
        self.buckets = make_buckets(self.params, bucket_cap_bytes(bucket_mb))
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
