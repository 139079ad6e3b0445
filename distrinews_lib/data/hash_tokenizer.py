"""The hash tokenizer (--tokenizer hash; --tokenizer auto with --model custom): no vocabulary file.

It lowercases, splits into words and punctuation, and hashes each token with blake2b into --hash_buckets ids: the
same id in every process (Python's hash() is salted per process, so every DDP rank would differ). It answers like a
Hugging Face tokenizer where the course uses one. An option, like the custom model it goes with: read only where it is
chosen (models/build.py) or found in a checkpoint (checkpoint.tokenizer_from_files).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import torch

from .tokenization import HASH_FILE, TRUNCATIONS, cut

TOKEN_PATTERN = r"\w+|[^\w\s]"
SPECIALS = ("[PAD]", "[CLS]", "[SEP]")


def stable_hash(token: str) -> int:
    """A 64-bit hash of the token's bytes that never changes between processes, machines or Pythons."""
    return int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")


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

    @property
    def distrinews_truncation(self) -> str:  # tokenization.TRUNCATION_ATTR: set_truncation and truncation_of use it
        return self.truncation

    @distrinews_truncation.setter
    def distrinews_truncation(self, truncation: str) -> None:
        self.truncation = truncation

    def cut_texts(self, texts: list, max_length: int, truncation: str) -> list:
        """tokenization.encode_texts for this tokenizer: unpadded ids of each text, cut as `truncation` says."""
        tokenizer = self if truncation == self.truncation else HashTokenizer(self.buckets, truncation)
        return tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]

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

    @classmethod
    def from_dict(cls, d: dict) -> "HashTokenizer":
        """The tokenizer to_dict() describes (a checkpoint's HASH_FILE); refused if this version hashes otherwise."""
        if (
            d.get("tokenizer_class") != "HashTokenizer"
            or d.get("hash") != "blake2b-64"
            or d.get("pattern") != TOKEN_PATTERN
        ):
            raise ValueError(f"not a hash tokenizer this version can rebuild: {str(d)[:200]}")
        return cls(int(d["buckets"]), d.get("truncation", "head"), int(d.get("model_max_length", 512)))

    def save_pretrained(self, folder) -> list:
        path = Path(folder) / HASH_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")
        return [str(path)]
