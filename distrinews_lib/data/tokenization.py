"""Text -> token ids: the hash tokenizer (--tokenizer hash), head+tail truncation, the token cache.

The hash tokenizer lowercases, splits into words and punctuation, and hashes each token with blake2b into
--hash_buckets ids: the same id in every process (Python's hash() is salted per process, so every DDP rank
would differ). It answers like a Hugging Face tokenizer where the course uses one. head_tail keeps the first
quarter and the last three quarters of the budget: a review's verdict is often at its end (Sun et al. 2019).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..files import atomic_torch_save
from .batching import PadCollator
from .texts import TextSplits

VOCAB_FILE = Path(__file__).resolve().parent.parent / "assets" / "vocab.txt"

HASH_FILE = "distrinews_hash_tokenizer.json"
TOKEN_PATTERN = r"\w+|[^\w\s]"
TRUNCATIONS = ("head", "head_tail")
SPECIALS = ("[PAD]", "[CLS]", "[SEP]")
_TRUNCATION_ATTR = "distrinews_truncation"


def stable_hash(token: str) -> int:
    """A 64-bit hash of the token's bytes that never changes between processes, machines or Pythons."""
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")


def cut(ids: list, budget: int, truncation: str) -> list:
    """At most `budget` ids: the first ones (head), or the first quarter and the last three quarters (head_tail)."""
    if len(ids) <= budget:
        return list(ids)
    if truncation == "head_tail":
        head = budget // 4
        return list(ids[:head]) + list(ids[len(ids) - (budget - head) :])
    return list(ids[:budget])


class HashTokenizer:
    """Lowercase, split on whitespace and punctuation, hash every token into `buckets` ids. No vocabulary."""

    pad_token, cls_token, sep_token = SPECIALS
    pad_token_id, cls_token_id, sep_token_id = 0, 1, 2
    unk_token_id = None  # every token has an id: there is no unknown word
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, buckets: int = 32768, truncation: str = "head", model_max_length: int = 512):
        if buckets < 16:
            raise ValueError(f"a hash tokenizer needs at least 16 buckets (got {buckets})")
        if truncation not in TRUNCATIONS:
            raise ValueError(f"truncation must be one of {TRUNCATIONS} (got {truncation!r})")
        self.buckets, self.truncation, self.model_max_length = int(buckets), truncation, int(model_max_length)
        self._pattern = re.compile(TOKEN_PATTERN)
        self._ids: dict = {}  # token -> id, a memo: hashing is the slow part, and words repeat

    @property
    def name_or_path(self) -> str:
        return f"hash-blake2b-{self.buckets}"

    @property
    def vocab_size(self) -> int:
        return self.buckets

    def __len__(self) -> int:
        return self.buckets

    def __repr__(self) -> str:
        return f"HashTokenizer(buckets={self.buckets}, truncation={self.truncation!r})"

    def tokenize(self, text: str) -> list:
        return self._pattern.findall(text.lower())

    def token_id(self, token: str) -> int:
        i = self._ids.get(token)
        if i is None:
            i = self._ids[token] = len(SPECIALS) + stable_hash(token) % (self.buckets - len(SPECIALS))
        return i

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return SPECIALS.index(tokens) if tokens in SPECIALS else self.token_id(tokens)
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def encode(self, text: str, max_length: int | None = None, truncation: bool = True) -> list:
        """[CLS] ids [SEP], cut to max_length tokens in all with this tokenizer's truncation."""
        ids = [self.token_id(t) for t in self.tokenize(text)]
        if truncation and max_length:
            ids = cut(ids, max(0, max_length - 2), self.truncation)
        return [self.cls_token_id, *ids, self.sep_token_id]

    def __call__(
        self,
        texts,
        truncation: bool = True,
        max_length: int | None = None,
        padding=False,
        return_tensors: str | None = None,
        **_ignored,
    ):
        """Like a Hugging Face tokenizer: {"input_ids", "attention_mask"}, lists or (padded) tensors."""
        single = isinstance(texts, str)
        ids = [self.encode(t, max_length, truncation) for t in ([texts] if single else texts)]
        if padding or return_tensors == "pt":
            width = max((len(x) for x in ids), default=0)
            masks = [[1] * len(x) + [0] * (width - len(x)) for x in ids]
            ids = [x + [self.pad_token_id] * (width - len(x)) for x in ids]
        else:
            masks = [[1] * len(x) for x in ids]
        if return_tensors == "pt":
            return {
                "input_ids": torch.tensor(ids, dtype=torch.long).reshape(len(ids), -1),
                "attention_mask": torch.tensor(masks, dtype=torch.long).reshape(len(ids), -1),
            }
        if single:
            return {"input_ids": ids[0], "attention_mask": masks[0]}
        return {"input_ids": ids, "attention_mask": masks}

    def to_dict(self) -> dict:
        return {
            "tokenizer_class": "HashTokenizer",
            "version": 1,
            "buckets": self.buckets,
            "hash": "blake2b-64",
            "lowercase": True,
            "pattern": TOKEN_PATTERN,
            "specials": list(SPECIALS),
            "truncation": self.truncation,
            "model_max_length": self.model_max_length,
        }

    def save_pretrained(self, folder) -> list:
        path = Path(folder) / HASH_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")
        return [str(path)]


def set_truncation(tokenizer, truncation: str) -> None:
    """Remember on the tokenizer how texts are cut, so the checkpoint (and so the server) cuts them the same way."""
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation must be one of {TRUNCATIONS} (got {truncation!r})")
    if isinstance(tokenizer, HashTokenizer):
        tokenizer.truncation = truncation
    else:
        setattr(tokenizer, _TRUNCATION_ATTR, truncation)


def truncation_of(tokenizer) -> str:
    if isinstance(tokenizer, HashTokenizer):
        return tokenizer.truncation
    return getattr(tokenizer, _TRUNCATION_ATTR, "head")


def encode_texts(tokenizer, texts: list, max_length: int, truncation: str | None = None) -> list:
    """Unpadded token ids of each text, at most max_length, cut as `truncation` (or the tokenizer) says."""
    truncation = truncation or truncation_of(tokenizer)
    if isinstance(tokenizer, HashTokenizer) and truncation != tokenizer.truncation:
        tokenizer = HashTokenizer(tokenizer.buckets, truncation)
    if isinstance(tokenizer, HashTokenizer) or truncation == "head":
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


def _cache_key(texts: list, tokenizer, max_length: int, truncation: str = "head") -> str:
    h = hashlib.sha256()
    h.update(f"{type(tokenizer).__name__}|{tokenizer.name_or_path}|{len(tokenizer)}|{max_length}|".encode())
    if truncation != "head":
        h.update(f"truncation={truncation}|".encode())
    h.update(str(tokenizer.convert_tokens_to_ids(["the", "news", "[SEP]"])).encode())
    for t in texts:
        h.update(t.encode("utf-8", "replace"))
        h.update(b"\x00")
    return h.hexdigest()[:32]


def tokenize_texts(texts: list, tokenizer, max_length: int, use_cache: bool = True) -> list:
    """encode_texts, cached on disk so every rank and rerun reuses the ids."""
    truncation = truncation_of(tokenizer)
    path = cache_dir() / f"{_cache_key(texts, tokenizer, max_length, truncation)}.pt"
    if use_cache and path.is_file():
        try:
            return torch.load(path, weights_only=True)
        except Exception:
            pass  # a damaged cache file is simply rebuilt
    ids = encode_texts(tokenizer, texts, max_length, truncation)
    if use_cache:
        try:
            atomic_torch_save(ids, path)  # ranks tokenizing at the same time can't corrupt it
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
