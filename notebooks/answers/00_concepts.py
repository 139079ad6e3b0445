"""Chapter 00's reference answers (read only by its solution cells; see README.md here)."""

import torch.distributed as dist


def average_gradients(model, world):
    """After backward(): every parameter's .grad becomes its mean over all ranks (in place)."""
    for p in model.parameters():
        dist.all_reduce(p.grad)  # SUM over the ranks, in place, on every rank
        p.grad /= world  # ... then the mean, as DDP does
