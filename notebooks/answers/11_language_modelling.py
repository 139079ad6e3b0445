"""Chapter 11's reference answers (read only by its solution cells; see README.md here)."""

import torch.nn.functional as F


def next_token_loss(logits, ids):
    """The mean cross-entropy of predicting ids[:, t] from the positions before t."""
    # position t's logits predict token t+1: the last position predicts nothing, the first token is never predicted
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
