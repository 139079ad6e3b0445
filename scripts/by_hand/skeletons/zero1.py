"""Exercise 3 of chapter 03: rung 5, ZeRO-1. Each rank keeps AdamW state for its share of one flat buffer only.

The class around the synchronisation is given; each function that raises NotImplementedError is yours to write.
Read every line first: the given code says what your functions receive and what they must leave behind.
The checker runs your Zero1DP in place of scripts/by_hand/zero1.py's, on 2 ranks, against torch's DDP, and
names the first mistake it finds. Stuck? exercises.hint("zero1", 1) shows the first of 4 hints.
"""
import torch
import torch.distributed as dist  # noqa: F401  (for the code you write)

from distrinews_course.by_hand.rung import Rung, one_dtype, stop_unless_every_rank_has
from distrinews_lib.errors import UserError  # noqa: F401  (for the errors your code raises)


class Zero1DP(Rung):
    """One flat buffer split evenly: rank r owns elements [r * shard, (r + 1) * shard) and only updates those."""

    def __init__(self, model, bucket_mb=None, broadcast=True, timeline=None):
        super().__init__(model, bucket_mb, broadcast, timeline)
        self.dtype = one_dtype(self.params)  # the flat buffers keep it: float64 trains in float64
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = -(-self.numel // self.world)  # rounded up: padding gives every rank the same length
        self.shard = self.make_shard()

    def make_shard(self):
        """This rank's share of the flattened weights, as a new nn.Parameter (a copy): the only part its optimizer
        sees and keeps AdamW state for."""
        raise NotImplementedError

    def flatten(self, tensors):
        """The tensors (one per parameter, in self.params' order) in one flat buffer of world x shard_size numbers,
        the padding zeros."""
        raise NotImplementedError

    def unflatten(self, flat):
        """Copy a flat buffer of the same layout back into the parameters."""
        raise NotImplementedError

    def optimizer(self, lr, weight_decay):
        return torch.optim.AdamW([self.shard], lr=lr, weight_decay=weight_decay)  # state for the shard only

    def step(self, optimizer):
        stop_unless_every_rank_has(self, self.missing())  # on every rank, not one
        sharded_step(self, optimizer)
        self.collectives += 2  # a reduce-scatter and an all-gather
        for p in self.params:
            p.grad = None


def sharded_step(dp, optimizer):
    """Reduce-scatter the gradients' flat buffer (divided by the world size first) so that this rank receives the
    sum of its share only, as dp.shard's gradient; step the optimizer (then zero its gradients); all-gather every
    rank's updated shard into a flat buffer and copy it into the model."""
    raise NotImplementedError
