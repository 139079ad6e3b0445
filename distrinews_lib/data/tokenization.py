"""Text -> token ids: head+tail truncation, the token cache, DistriNews' copy of DistilBERT's vocabulary.

head_tail keeps the first quarter and the last three quarters of the budget: a review's verdict is often at its end
(Sun et al. 2019). The hash tokenizer (--tokenizer hash) is an option with a module of its own, hash_tokenizer.py.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils.data import Dataset

from ..files import atomic_torch_save
from .batching import PadCollator

if TYPE_CHECKING:  # an annotation only: the server tokenizes texts and never reads a dataset's splits
    from .texts import TextSplits

VOCAB_FILE = Path(__file__).resolve().parent.parent / "assets" / "vocab.txt"

HASH_FILE = "distrinews_hash_tokenizer.json"  # the hash tokenizer's one file: a checkpoint holding it holds one
TRUNCATIONS = ("head", "head_tail")
TRUNCATION_ATTR = "distrinews_truncation"  # how a tokenizer cuts texts, kept on it (the hash tokenizer: its own)


def cut(ids: list, budget: int, truncation: str) -> list:
    """At most `budget` ids: the first ones (head), or the first quarter and the last three quarters (head_tail)."""
    if len(ids) <= budget:
        return list(ids)
    if truncation == "head_tail":
        head = budget // 4
        return list(ids[:head]) + list(ids[len(ids) - (budget - head) :])
    return list(ids[:budget])


def set_truncation(tokenizer, truncation: str) -> None:
    """Remember on the tokenizer how texts are cut, so the checkpoint (and so the server) cuts them the same way."""
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation must be one of {TRUNCATIONS} (got {truncation!r})")
    setattr(tokenizer, TRUNCATION_ATTR, truncation)


def truncation_of(tokenizer) -> str:
    return getattr(tokenizer, TRUNCATION_ATTR, "head")


def encode_texts(tokenizer, texts: list, max_length: int, truncation: str | None = None) -> list:
    """Unpadded token ids of each text, at most max_length, cut as `truncation` (or the tokenizer) says."""
    truncation = truncation or truncation_of(tokenizer)
    if hasattr(tokenizer, "cut_texts"):  # the hash tokenizer cuts each text itself, head or head_tail
        return tokenizer.cut_texts(texts, max_length, truncation)
    if truncation == "head":
        return tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    # head_tail with a Hugging Face tokenizer: the whole text, its special tokens ([CLS] ... [SEP], whatever the
    # model's template) kept, and the words between them cut.
    full = tokenizer(texts, truncation=False)["input_ids"]
    bare = tokenizer(texts, add_special_tokens=False, truncation=False)["input_ids"]
    out = []
    for ids, body in zip(full, bare):
        start = next((p for p in range(len(ids) - len(body) + 1) if ids[p : p + len(body)] == body), 0)
        prefix, suffix = ids[:start], ids[start + len(body) :]
        out.append(prefix + cut(body, max(0, max_length - len(prefix) - len(suffix)), "head_tail") + suffix)
    return out


def tiny_tokenizer():
    """DistilBERT's uncased WordPiece tokenizer from the vocabulary shipped in assets/ (no download)."""
    import transformers  # deferred: importing transformers costs seconds

    if int(transformers.__version__.split(".")[0]) >= 5:
        # transformers 5 takes the vocabulary itself; a vocab_file argument is silently ignored (all [UNK]).
        from transformers import DistilBertTokenizer

        vocab = {w: i for i, w in enumerate(VOCAB_FILE.read_text(encoding="utf-8").splitlines())}
        return DistilBertTokenizer(vocab=vocab, do_lower_case=True, model_max_length=512)
    from transformers import DistilBertTokenizerFast

    return DistilBertTokenizerFast(vocab_file=str(VOCAB_FILE), do_lower_case=True, model_max_length=512)


def cache_dir() -> Path:
    return Path(os.environ.get("DISTRINEWS_CACHE", Path.home() / ".cache" / "distrinews")) / "tokenized"


# The cache holds two flat int32 tensors, not a list of lists: torch.load(weights_only=True) unpickles a list of
# lists one int at a time in Python (0.6 s for 12,000 texts, in every process that trains), two tensors in 0.04 s.
CACHE_FORMAT = "flat-int32"


def _cache_key(texts: list, tokenizer, max_length: int, truncation: str = "head") -> str:
    h = hashlib.sha256()
    h.update(f"{CACHE_FORMAT}|".encode())  # a new format gets new files: an older file is never misread
    h.update(f"{type(tokenizer).__name__}|{tokenizer.name_or_path}|{len(tokenizer)}|{max_length}|".encode())
    if truncation != "head":
        h.update(f"truncation={truncation}|".encode())
    h.update(str(tokenizer.convert_tokens_to_ids(["the", "news", "[SEP]"])).encode())
    for t in texts:
        h.update(t.encode("utf-8", "replace"))
        h.update(b"\x00")
    return h.hexdigest()[:32]


def _pack(ids: list) -> dict:
    return {
        "lengths": torch.tensor([len(x) for x in ids], dtype=torch.int32),
        "ids": torch.tensor([i for x in ids for i in x], dtype=torch.int32),
    }


def _unpack(packed: dict) -> list:
    flat, out, at = packed["ids"].tolist(), [], 0
    for n in packed["lengths"].tolist():
        out.append(flat[at : at + n])
        at += n
    if at != len(flat):
        raise ValueError("token cache: lengths and ids disagree")
    return out


def tokenize_texts(texts: list, tokenizer, max_length: int, use_cache: bool = True) -> list:
    """encode_texts, cached on disk so every rank and rerun reuses the ids."""
    truncation = truncation_of(tokenizer)
    path = cache_dir() / f"{_cache_key(texts, tokenizer, max_length, truncation)}.pt"
    if use_cache and path.is_file():
        try:
            ids = _unpack(torch.load(path, weights_only=True))
            if len(ids) == len(texts):
                return ids
        except Exception:
            pass  # a damaged cache file is simply rebuilt
    ids = encode_texts(tokenizer, texts, max_length, truncation)
    if use_cache:
        try:
            atomic_torch_save(_pack(ids), path)  # ranks tokenizing at the same time can't corrupt it
        except OSError:
            pass  # a read-only home is no reason to stop training
    return ids


class TokenizedDataset(Dataset):
    """Pre-tokenized examples; each item remembers its index so DDP evaluation can drop duplicates."""

    def __init__(self, input_ids: list, labels: list):
        assert len(input_ids) == len(labels)
        self.input_ids = input_ids
        self.labels = labels
        self.lengths = [len(x) for x in input_ids]

    def __len__(self):
        return len(self.input_ids)

    def __getitem__(self, i):
        return {"index": i, "input_ids": self.input_ids[i], "label": self.labels[i]}

    def collator_for(self, sampler=None, pad_id: int = 0, pad_to_multiple_of: int | None = 8) -> PadCollator:
        """Its batches: padded to their longest text (batching.make_loader asks every dataset for its collator)."""
        return PadCollator(pad_id, pad_to_multiple_of)


def tokenize_splits(splits: TextSplits, tokenizer, max_length: int) -> tuple[TokenizedDataset, TokenizedDataset]:
    return (
        TokenizedDataset(tokenize_texts(splits.train_texts, tokenizer, max_length), splits.train_labels),
        TokenizedDataset(tokenize_texts(splits.test_texts, tokenizer, max_length), splits.test_labels),
    )
