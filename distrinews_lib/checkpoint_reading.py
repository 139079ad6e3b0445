"""A checkpoint file read back and checked, for the server (serving/rebuild.py), the language models (lm/) and a
notebook. read_checkpoint loads it (torch.load(weights_only=True)) and says what a missing, empty, foreign, older,
newer or other-task file is; tokenizer_from_files rebuilds its tokenizer; check_servable refuses a classifier's file
that would load but answer wrongly. A training run that only writes its checkpoint never imports this module:
checkpoint.py hands these names out on first use.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from .checkpoint_format import CLASSIFY_TASK, LOADERS, CheckpointError, check_format, position_limit
from .data.tokenization import HASH_FILE


def tokenizer_from_files(files: dict):
    """The tokenizer from tokenizer_files(): the hash tokenizer from its settings, any other through transformers."""
    if HASH_FILE in files:  # the vocabulary-free hash tokenizer (an option): its settings are all it needs
        from .data.hash_tokenizer import HashTokenizer

        return HashTokenizer.from_dict(json.loads(files[HASH_FILE]))
    from transformers import AutoTokenizer  # deferred: importing transformers costs seconds

    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            (Path(tmp) / Path(name).name).write_text(text, encoding="utf-8")
        return AutoTokenizer.from_pretrained(tmp)


def read_checkpoint(path, task: str | None = None) -> dict:
    """The payload of a checkpoint written by save_checkpoint, checked. Raises CheckpointError saying which path and
    why: missing, empty, a folder, unreadable, another kind of file, another version of the format, or (task=NAME)
    a model another task trained."""
    path = Path(path)
    if path.is_dir():
        from .shard_integrity import refusal  # deferred: only a folder handed over needs it

        sharded = refusal(path)
        if sharded:
            raise CheckpointError(sharded)
        found = sorted(p.name for p in path.glob("*.pt"))
        hint = (
            f"It holds {', '.join(found[:5])}{' ...' if len(found) > 5 else ''}: pass one of those files."
            if found
            else "Pass the .pt file itself, for example checkpoints/distilbert_agnews.pt."
        )
        raise CheckpointError(f"checkpoint {path} is a folder, not a checkpoint file. {hint}")
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint not found: {path}. Train one first (python scripts/train_single.py, or notebook 01/02), "
            "or point to it with --checkpoint / DISTRINEWS_CHECKPOINT."
        )
    if path.stat().st_size == 0:
        raise CheckpointError(
            f"checkpoint {path} is empty (0 bytes): the copy or the write that made it was cut short. "
            "Retrain it or restore a complete copy."
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, random bytes, pickled code...
        reason = (str(err).splitlines() or [""])[0][:150]
        raise CheckpointError(
            f"checkpoint {path} could not be read ({type(err).__name__}{': ' + reason if reason else ''}). "
            "It may be truncated or not a DistriNews checkpoint; retrain or restore it."
        ) from None
    check_format(path, payload)
    payload.setdefault("task", CLASSIFY_TASK)  # format 2 files from before --task existed hold classifiers
    if task is not None and payload["task"] != task:
        raise CheckpointError(
            f"checkpoint {path} holds a --task {payload['task']} model, not a --task {task} one, so it cannot be "
            f"loaded here: {LOADERS}."
        )
    return payload


def check_servable(path, payload: dict, model: torch.nn.Module) -> None:
    """Refuse a checkpoint that would load but answer wrongly: label names that do not match the model's
    outputs, a token window longer than its position table, or NaN/infinite weights."""
    labels = payload["label_names"]
    if not isinstance(labels, (list, tuple)) or not labels or not all(isinstance(n, str) and n.strip() for n in labels):
        raise CheckpointError(
            f"checkpoint {path} has label names {str(labels)[:120]}; they must be a non-empty list of "
            "non-empty strings, one per model output. Retrain it."
        )
    outputs = int(model.config.num_labels)  # strict load_state_dict has checked the head against the config
    if len(labels) != outputs:
        raise CheckpointError(
            f"checkpoint {path} names {len(labels)} labels ({', '.join(map(str, labels))[:200]}) but its model has "
            f"{outputs} outputs, so its answers would carry the wrong names. Retrain it, or fix its label_names to "
            f"list exactly {outputs} classes in the order of the model's outputs."
        )
    repeated = sorted({n for n in labels if list(labels).count(n) > 1})
    if repeated:
        raise CheckpointError(
            f"checkpoint {path} names the label{'s' if len(repeated) > 1 else ''} "
            f"{', '.join(map(repr, repeated))} more than once; each of the model's outputs needs its own name, "
            "or answers would lose classes. Retrain it, or fix its label_names."
        )
    max_length = payload.get("max_length", 128)
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
        raise CheckpointError(
            f"checkpoint {path} has max_length={max_length!r}; it must be a whole number of tokens, "
            "at least 2. Retrain it with a valid --max_length."
        )
    limit = position_limit(model)
    if limit is not None and max_length > limit:
        raise CheckpointError(
            f"checkpoint {path} cuts texts at max_length={max_length} tokens, but its model has position embeddings "
            f"for only {limit} tokens, so every longer text would fail. Retrain it with --max_length {limit} or less."
        )
    bad = [
        name
        for name, t in payload["state_dict"].items()
        if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]
    if bad:
        raise CheckpointError(
            f"checkpoint {path} has NaN or infinite weights in {len(bad)} tensor{'s' if len(bad) > 1 else ''} "
            f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}): the training run that wrote it diverged. "
            "Retrain it with a lower --lr, or with --amp off."
        )
