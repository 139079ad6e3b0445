"""A trained language model back from its checkpoint (the format's module reads it), and text generated with it."""

from __future__ import annotations

import torch

from ..checkpoint import LOADERS, CheckpointError, read_checkpoint, unwrap
from .data import VocabSubset
from .task import LM_TASKS


def load_lm(path, device="cpu"):
    """(model, VocabSubset, payload) from a --task clm/mlm checkpoint written by the training scripts."""
    from transformers import AutoConfig  # deferred: costs seconds

    payload = read_checkpoint(path)
    task = LM_TASKS.get(payload["task"])
    if task is None:
        raise CheckpointError(
            f"checkpoint {path} holds a --task {payload['task']} model, not a language model: {LOADERS}."
        )
    cfg = dict(payload["model_config"])
    config = AutoConfig.for_model(cfg.pop("model_type", payload["model_type"]), **cfg)
    model = task.auto_model().from_config(config)
    model.load_state_dict(payload["state_dict"])
    return model.to(device).eval(), VocabSubset.from_files(payload["tokenizer_files"]), payload


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompt: str,
    max_new_tokens: int = 20,
    device="cpu",
    greedy: bool = False,
    seed: int = 0,
    temperature: float = 0.8,
    top_k: int = 20,
) -> str:
    """Continue a prompt with a causal LM over a VocabSubset: sampled from the top_k most likely tokens at the
    given temperature (a fixed seed: the same text every time), or greedy."""
    bare = unwrap(model)
    words = tokenizer.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([[tokenizer.cls_token_id, *tokenizer.encode(words)]], device=device)
    limit = bare.config.n_positions
    g = torch.Generator().manual_seed(seed)
    for _ in range(max_new_tokens):
        logits = bare(input_ids=ids[:, -limit:]).logits[0, -1].float().cpu()
        logits[[tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id]] = -float("inf")
        if greedy:
            nxt = int(logits.argmax())
        else:
            top = torch.topk(logits / temperature, top_k)
            nxt = int(top.indices[torch.multinomial(torch.softmax(top.values, -1), 1, generator=g)])
        if nxt == tokenizer.sep_token_id:
            break
        ids = torch.cat([ids, torch.tensor([[nxt]], device=device)], dim=1)
    return tokenizer.decode(ids[0, 1:], skip_special_tokens=True)
