"""Save the inference checkpoint: the *unwrapped* model, its tokenizer's files, labels and run metadata in one
file, written atomically by rank 0 and readable with torch.load(weights_only=True) (serving/inference.py reads
it).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from ..data.tokenization import truncation_of
from ..files import atomic_torch_save

FORMAT_VERSION = 2  # 2: the tokenizer travels inside the file (1 kept it in a folder beside it)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The bare model inside DDP (`.module`) and/or torch.compile (`._orig_mod`)."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def tokenizer_files(tokenizer) -> dict:
    """The tokenizer as {file name: text}, from save_pretrained (every file it writes is text)."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return {p.name: p.read_text(encoding="utf-8") for p in sorted(Path(tmp).iterdir()) if p.is_file()}


def _plain(value):
    """Metadata as plain Python values, so weights_only=True can load it."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    for plain in (str, int, float):  # str subclasses such as torch's TorchVersion are not weights_only-safe
        if isinstance(value, plain):
            return plain(value)
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    return str(value)


def save_checkpoint(path, model, tokenizer, label_names, metadata: dict | None = None, max_length: int | None = None,
                    truncation: str | None = None) -> Path:
    """Save the unwrapped model (no `module.` prefix) with its config, labels, metadata and tokenizer."""
    path = Path(path)
    bare = unwrap(model)
    state = {k: v.detach().cpu().clone() for k, v in bare.state_dict().items()}
    payload = {
        "format_version": FORMAT_VERSION,
        "model_type": bare.config.model_type,
        "model_config": _plain(bare.config.to_dict()),
        "state_dict": state,
        "label_names": list(label_names),
        "max_length": int(max_length or 128),
        "metadata": _plain(metadata or {}),
        "tokenizer_files": tokenizer_files(tokenizer),
        "truncation": truncation or truncation_of(tokenizer),
        "task": (metadata or {}).get("task", "classify"),  # clm / mlm: a language model (serving.inference.load_lm)
    }
    atomic_torch_save(payload, path)
    return path


def position_limit(model: torch.nn.Module) -> int | None:
    """How many token positions the model can embed (None when it has no absolute position table)."""
    for name, module in model.named_modules():
        if name.endswith("position_embeddings") and isinstance(module, torch.nn.Embedding):
            # RoBERTa-style tables start counting after the padding index.
            pad = module.padding_idx
            return module.num_embeddings - (pad + 1 if pad is not None else 0)
    limit = getattr(model.config, "max_position_embeddings", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None
