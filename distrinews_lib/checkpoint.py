"""The checkpoint's format, in one place, below both the training and the serving side: save_checkpoint writes it
(the *unwrapped* model, its tokenizer's files, labels and run metadata in one file, written atomically by rank 0);
read_checkpoint reads and validates it (torch.load(weights_only=True)), with a version field and a message that says
what an older, newer, foreign or other-task file is; check_servable refuses a classifier's file that would load but
answer wrongly. The server (serving/inference.py rebuilds a classifier from it) and the language models (lm/) only
call it; it imports nothing of either, nor of training/.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from .data.tokenization import HASH_FILE, truncation_of
from .errors import UserError
from .files import atomic_torch_save

FORMAT_VERSION = 2  # 2: the tokenizer travels inside the file (1 kept it in a folder beside it)
DEFAULT_CHECKPOINT = "checkpoints/distilbert_agnews.pt"  # where the trained model goes, and what the server loads
CLASSIFY_TASK = "classify"  # what a classifier's file records as its task (and format 2 files from before --task)
LOADERS = (
    "classifiers load with distrinews_lib.serving.inference.load_checkpoint (the server), language models "
    "(--task clm, mlm) with distrinews_lib.lm.inference.load_lm (notebook 11)"
)
REQUIRED_KEYS = ("model_type", "model_config", "state_dict", "label_names")


class CheckpointError(UserError):
    """The checkpoint is missing, truncated, or not one of ours."""


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


def payload_for(
    model,
    tokenizer,
    label_names,
    metadata: dict | None = None,
    max_length: int | None = None,
    truncation: str | None = None,
    with_state: bool = True,
) -> dict:
    """The checkpoint's payload for the unwrapped model (no `module.` prefix): config, labels, metadata, tokenizer and,
    with_state, the weights. with_state=False: the rest alone (a sharded checkpoint saves the weights itself)."""
    bare = unwrap(model)
    payload = {
        "format_version": FORMAT_VERSION,
        "model_type": bare.config.model_type,
        "model_config": _plain(bare.config.to_dict()),
        "label_names": list(label_names),
        "max_length": int(max_length or 128),
        "metadata": _plain(metadata or {}),
        "tokenizer_files": tokenizer_files(tokenizer),
        "truncation": truncation or truncation_of(tokenizer),
        "task": (metadata or {}).get("task", CLASSIFY_TASK),  # the task that trained it (training.task.Task.name)
    }
    if with_state:
        payload["state_dict"] = {k: v.detach().cpu().clone() for k, v in bare.state_dict().items()}
    return payload


def write_payload(payload: dict, path) -> Path:
    """Write a payload as a checkpoint file, atomically, once it passes the checks read_checkpoint applies."""
    path = Path(path)
    _check_format(path, payload)
    atomic_torch_save(payload, path)
    return path


def save_checkpoint(
    path,
    model,
    tokenizer,
    label_names,
    metadata: dict | None = None,
    max_length: int | None = None,
    truncation: str | None = None,
) -> Path:
    """Save the unwrapped model (no `module.` prefix) with its config, labels, metadata and tokenizer."""
    return write_payload(payload_for(model, tokenizer, label_names, metadata, max_length, truncation), path)


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
    _check_format(path, payload)
    payload.setdefault("task", CLASSIFY_TASK)  # format 2 files from before --task existed hold classifiers
    if task is not None and payload["task"] != task:
        raise CheckpointError(
            f"checkpoint {path} holds a --task {payload['task']} model, not a --task {task} one, so it cannot be "
            f"loaded here: {LOADERS}."
        )
    return payload


def _check_format(path: Path, payload) -> None:
    """A foreign file, or another version of the format, gets a message that says which."""
    if isinstance(payload, dict) and "snapshot_version" in payload:
        raise CheckpointError(
            f"{path} is a training snapshot (what --resume continues from), not a checkpoint: the "
            "checkpoint is the file a finished run saves at --checkpoint."
        )
    missing = [k for k in REQUIRED_KEYS if not isinstance(payload, dict) or k not in payload]
    if missing:
        bare = isinstance(payload, dict) and payload and all(torch.is_tensor(v) for v in payload.values())
        what = " It holds bare weights (a state_dict) without the model's config, labels or tokenizer." if bare else ""
        raise CheckpointError(f"checkpoint {path} is not a DistriNews checkpoint (missing {', '.join(missing)}).{what}")
    if any(str(k).startswith("module.") for k in payload["state_dict"]):
        raise CheckpointError(
            f"checkpoint {path} holds a DDP wrapper's keys ('module.' prefix); save unwrap(model) instead."
        )
    version = payload.get("format_version", 1)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} was written by a newer DistriNews (format {version!r}); this one reads "
            f"format {FORMAT_VERSION}. Update distrinews_lib, or retrain it with this version."
        )
    if version < FORMAT_VERSION or not isinstance(payload.get("tokenizer_files"), dict):
        raise CheckpointError(
            f"checkpoint {path} was written by an older DistriNews (format {version}, "
            f"tokenizer in a separate folder); retrain it to get format {FORMAT_VERSION}."
        )


def position_limit(model: torch.nn.Module) -> int | None:
    """How many token positions the model can embed (None when it has no absolute position table)."""
    for name, module in model.named_modules():
        if name.endswith("position_embeddings") and isinstance(module, torch.nn.Embedding):
            # RoBERTa-style tables start counting after the padding index.
            pad = module.padding_idx
            return module.num_embeddings - (pad + 1 if pad is not None else 0)
    limit = getattr(model.config, "max_position_embeddings", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


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
