"""Chapter 11's reference answers (read only by its solution cells; see README.md here)."""

import hashlib

import torch
import torch.nn.functional as F


def next_token_loss(logits, ids):
    """The mean cross-entropy of predicting ids[:, t] from the positions before t."""
    # position t's logits predict token t+1: the last position predicts nothing, the first token is never predicted
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def mask_positions(ids, seed, epoch, index, special_ids, rate=0.15):
    """True where block `index` is to be predicted in `epoch`: decided by (seed, epoch, index) alone."""
    key = hashlib.blake2b(f"{seed}:{epoch}:{index}".encode(), digest_size=8).digest()
    g = torch.Generator().manual_seed(int.from_bytes(key, "little") >> 1)  # its own: the run's generator stays put
    text = ~torch.isin(ids, torch.tensor(special_ids))  # [CLS], [SEP] and [PAD] are never predicted
    chosen = (torch.rand(ids.shape, generator=g) < rate) & text
    if text.any() and not chosen.any():  # a block with nothing to predict teaches nothing: pick one of its tokens
        chosen[text.nonzero()[torch.randint(int(text.sum()), (1,), generator=g)]] = True
    return chosen


# The predictions, before the runs.
PREDICTED_UNTRAINED_PERPLEXITY = 4096  # a flat guess over the vocabulary: loss log(V) per token, perplexity V
MY_MLM_VS_CLM = "higher"  # both sides make a masked token easier; in one short epoch, learning from 15% counts more


def predict_blocks(blocks_32, steps_32):
    """Exercise 4: the same tokens in blocks twice as long: half as many blocks, and half the steps per epoch."""
    return {"blocks": blocks_32 // 2, "steps": (steps_32 + 1) // 2}


def predict_vocab(coverage_4096_percent):
    """Exercise 5: the next 4,096 tokens are rarer ones (Zipf's law): they cover about two thirds of what the first
    4,096 miss. The output layer is vocabulary x width: twice the vocabulary, twice the weights."""
    return {"coverage_percent": 100 - (100 - coverage_4096_percent) / 3, "output_layer_times": 2}
