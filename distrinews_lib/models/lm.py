"""The language models of --task clm|mlm (a small GPT-2, a DistilBERT for masked tokens) and their loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..data.lm import IGNORE

# The tiny LMs of the CPU course: a few seconds per epoch over the embedded AG News text.
TINY_LM = dict(dim=128, layers=2, heads=4, ffn=512)


def build_lm(task: str, tokenizer, block_size: int, seed: int):
    """(model, description): a small random GPT-2 (clm) or DistilBERT (mlm)."""
    from transformers import DistilBertConfig, DistilBertForMaskedLM, GPT2Config, GPT2LMHeadModel  # deferred: slow

    torch.manual_seed(seed)
    vocab = len(tokenizer)
    if task == "clm":
        cfg = GPT2Config(vocab_size=vocab, n_positions=block_size, n_embd=TINY_LM["dim"], n_layer=TINY_LM["layers"],
                         n_head=TINY_LM["heads"], n_inner=TINY_LM["ffn"], bos_token_id=tokenizer.cls_token_id,
                         eos_token_id=tokenizer.sep_token_id, pad_token_id=tokenizer.pad_token_id)
        return GPT2LMHeadModel(cfg), f"GPT-2 from its config: {TINY_LM['layers']} layers, dim {TINY_LM['dim']}, random init"
    cfg = DistilBertConfig(vocab_size=vocab, dim=TINY_LM["dim"], n_layers=TINY_LM["layers"], n_heads=TINY_LM["heads"],
                           hidden_dim=TINY_LM["ffn"], max_position_embeddings=max(512, block_size),
                           pad_token_id=tokenizer.pad_token_id)
    return DistilBertForMaskedLM(cfg), f"DistilBERT from its config: {TINY_LM['layers']} layers, dim {TINY_LM['dim']}, random init"


def token_losses(model, batch, task: str):
    """(sum of the loss over the predicted tokens, number of predicted tokens), per block."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    labels = batch["labels"]
    if task == "clm":  # token t predicts token t+1
        logits, labels = logits[:, :-1], labels[:, 1:]
    per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE,
                                reduction="none").view(labels.shape)
    counted = labels != IGNORE
    return (per_token * counted).sum(1).double(), counted.sum(1)
