"""A classifier rebuilt from its checkpoint for the server: the model from its own config (transformers, or --model
custom's plain PyTorch) with strict weights, and refused when it would load but answer wrongly (check_servable). The
file is read and validated by the format's one module, distrinews_lib/checkpoint.py."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import torch

from ..checkpoint import (
    CLASSIFY_TASK,
    DEFAULT_CHECKPOINT,
    CheckpointError,
    position_limit,
    read_checkpoint,
    tokenizer_from_files,
)
from ..data.tokenization import TRUNCATIONS, set_truncation


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


def _custom_config(d: dict):
    from ..models.custom import CustomConfig

    unknown = sorted(set(d) - {f.name for f in fields(CustomConfig)})
    if unknown:
        raise ValueError(f"unknown custom model settings: {', '.join(unknown)}")
    return CustomConfig(**d)


def load_classifier(path=DEFAULT_CHECKPOINT) -> tuple:
    """(eval-mode model on the CPU, tokenizer, payload) of a classifier's checkpoint: read and checked, its model
    rebuilt from its own config (transformers, or --model custom's plain PyTorch) with strict weights, refused when it
    would answer wrongly (check_servable), and its tokenizer cutting texts as in training."""
    from transformers import AutoConfig, AutoModelForSequenceClassification  # deferred: importing it costs seconds

    from ..models.build import quiet_transformers
    from ..models.custom import MODEL_TYPE as CUSTOM_MODEL_TYPE
    from ..models.custom import CustomClassifier

    quiet_transformers()
    path = Path(path)
    payload = read_checkpoint(path, task=CLASSIFY_TASK)  # another task's file refused
    cfg_dict = dict(payload["model_config"])
    model_type = cfg_dict.pop("model_type", payload["model_type"])
    if model_type == CUSTOM_MODEL_TYPE:  # --model custom: plain PyTorch, rebuilt from its own config
        try:
            model = CustomClassifier(_custom_config(cfg_dict))
        except (TypeError, ValueError) as err:
            raise CheckpointError(
                f"checkpoint {path} has a custom model config this version cannot build ({err}); retrain it."
            ) from None
    else:
        config = AutoConfig.for_model(model_type, **cfg_dict)
        model = AutoModelForSequenceClassification.from_config(config)
    try:
        model.load_state_dict(payload["state_dict"], strict=True)
    except RuntimeError as err:
        raise CheckpointError(
            f"checkpoint {path} does not match its own model config: {str(err).splitlines()[0][:200]}"
        ) from None
    check_servable(path, payload, model)
    tokenizer = tokenizer_from_files(payload["tokenizer_files"])
    truncation = payload.get("truncation", "head")
    if truncation not in TRUNCATIONS:
        raise CheckpointError(
            f"checkpoint {path} has truncation={truncation!r}; it must be one of {', '.join(TRUNCATIONS)}. Retrain it."
        )
    set_truncation(tokenizer, truncation)
    return model.eval(), tokenizer, payload
