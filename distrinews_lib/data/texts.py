"""What a dataset is to the course: texts and 0-based labels for a train and a test split, the label names,
and where they came from; the datasets it knows by name, and how their rows become one clean text.
"""

from __future__ import annotations

import hashlib
import html
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

AG_NEWS_LABELS = ["World", "Sports", "Business", "Sci/Tech"]  # in the order of the original classes.txt
HUB_DATASET = "fancyzhx/ag_news"  # the canonical id of "ag_news" on the hub


class CleanOnRead(Sequence):
    """A file's texts, each made clean when it is read: a run keeps a subset of the rows (--num_samples), and cleaning
    every row of a file was most of reading it (0.3 of 0.44 CPU-s for AG News' 12,000 + 7,600 rows here)."""

    def __init__(self, raw: list, clean: Callable):
        self._raw, self._clean = raw, clean

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._clean(*r) for r in self._raw[i]]
        return self._clean(*self._raw[i])


@dataclass
class TextSplits:
    """Raw texts and 0-based labels for train and test, their label names, and where they came from."""

    train_texts: list
    train_labels: list
    test_texts: list
    test_labels: list
    source: str  # "hub", "folder", "csv", "embedded" or "synthetic"
    detail: str  # human-readable: hub id, folder path, or the synthetic warning
    is_synthetic: bool = False
    full_sizes: dict = field(default_factory=dict)
    label_names: list = field(default_factory=lambda: list(AG_NEWS_LABELS))  # label i is label_names[i]
    name: str = "AG News"  # the dataset, for titles: "AG News", "IMDB", "reviews.csv"...

    def describe(self) -> str:
        return (
            f"data: {self.source} ({self.detail}); train {len(self.train_texts)} rows, "
            f"test {len(self.test_texts)} rows; {len(self.label_names)} classes"
        )

    @property
    def title(self) -> str:
        """A short name for plot titles and summaries: 'AG News (embedded sample)', 'IMDB (hub)', 'SYNTHETIC data'..."""
        if self.source == "synthetic":
            return "SYNTHETIC data"
        if self.source == "embedded":
            return f"{self.name} (embedded real sample)"
        if self.source in ("folder", "csv"):
            return f"{self.name} ({Path(self.detail.split(' + ')[0]).parent.name or self.source})"
        return f"{self.name} ({self.source})"

    def fingerprint(self) -> str:
        """A short hash of the label names and every text and label: the same data on every rank."""
        h = hashlib.sha256()
        h.update(("\x03".join(self.label_names) + "\x04").encode("utf-8", "replace"))
        for texts, labels in ((self.train_texts, self.train_labels), (self.test_texts, self.test_labels)):
            for t, y in zip(texts, labels):
                h.update(f"{y}\x00{t}\x01".encode("utf-8", "replace"))
            h.update(b"\x02")
        return h.hexdigest()[:16]

    def class_counts(self, split: str = "train") -> list:
        counts = [0] * len(self.label_names)
        for y in getattr(self, f"{split}_labels"):
            counts[y] += 1
        return counts

    def balance(self) -> str:
        parts, notes = [], []
        for split in ("train", "test"):
            counts = self.class_counts(split)
            total = max(1, sum(counts))
            parts.append(
                f"{split} " + ", ".join(f"{n} {c:,} ({100 * c / total:.1f}%)" for n, c in zip(self.label_names, counts))
            )
            empty = [n for n, c in zip(self.label_names, counts) if c == 0]
            if empty:
                notes.append(f"no {split} example of {', '.join(empty)}")
            elif max(counts) > 1.5 * min(counts):
                notes.append(
                    f"{split} is imbalanced (largest class {max(counts) / min(counts):.1f}x the smallest): "
                    "accuracy alone hides the small classes"
                )
        return "class balance: " + "; ".join(parts) + ("".join(f" | WARNING: {n}" for n in notes))


# AG News lost the '&' of its HTML escapes: " #39;" is "&#39;", " quot;" is "&quot;".
_BARE_ENTITY = re.compile(r"(?<!&) ?(#\d+|quot|amp|lt|gt);")
_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)


def clean_news(*parts: str) -> str:
    """AG News' title and description as one string, its quirks (`\\` line breaks, ` #39;`) undone."""
    *title, description = parts
    title = title[0].strip() if title else ""
    text = f"{title}. {description.strip()}" if title else description.strip()
    text = text.replace("\\", " ")
    text = _BARE_ENTITY.sub(lambda m: html.unescape(f"&{m.group(1)};"), text)
    return " ".join(html.unescape(text).split())


def clean_review(*parts: str) -> str:
    """Review texts: HTML breaks and escapes undone, literal `\\n` as spaces, fields joined by '. '."""
    out = []
    for p in parts:
        p = _BR.sub(" ", (p or "").replace("\\n", " ").replace('\\"', '"'))
        p = " ".join(html.unescape(p).split())
        if p:
            out.append(p)
    return ". ".join(out)


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset the course knows by name: its hub id, its label names, and how its rows become one text."""

    key: str  # --dataset value
    hub_id: str  # canonical id on the Hugging Face hub
    name: str  # for titles
    label_names: tuple  # in the order of its labels (0, 1, ...)
    hub_text_columns: tuple  # hub columns joined into one text
    zhang_fields: tuple  # text fields after the class in the headerless Zhang et al. CSV layout
    cache_aliases: tuple = ()  # older names it may be cached under
    folder_hint: str = ""
    clean: Callable = None  # its fields -> one text (set below: AG News' news quirks, or reviews')


DATASETS = {
    "ag_news": DatasetSpec(
        "ag_news",
        HUB_DATASET,
        "AG News",
        tuple(AG_NEWS_LABELS),
        ("text",),
        ("title", "description"),
        ("ag_news",),
        "ag_news_csv (train.csv, test.csv) or the Kaggle CSV, e.g. ../shared/data/ag_news",
        clean_news,
    ),
    "imdb": DatasetSpec(
        "imdb",
        "stanfordnlp/imdb",
        "IMDB",
        ("negative", "positive"),
        ("text",),
        ("text",),
        ("imdb",),
        "train.csv and test.csv with the header id,rating,label,text, e.g. ../shared/data/imdb",
        clean_review,
    ),
    "amazon_polarity": DatasetSpec(
        "amazon_polarity",
        "fancyzhx/amazon_polarity",
        "Amazon Reviews Polarity",
        ("negative", "positive"),
        ("title", "content"),
        ("title", "text"),
        ("amazon_polarity",),
        'amazon_review_polarity_csv (train.csv, test.csv: "1|2","title","text")',
        clean_review,
    ),
    "yelp_polarity": DatasetSpec(
        "yelp_polarity",
        "fancyzhx/yelp_polarity",
        "Yelp Reviews Polarity",
        ("negative", "positive"),
        ("text",),
        ("text",),
        ("yelp_polarity",),
        'yelp_review_polarity_csv (train.csv, test.csv: "1|2","text")',
        clean_review,
    ),
}
IMDB_HEADER = ["id", "rating", "label", "text"]


@dataclass(frozen=True)
class TextOptions:
    """How rows become (text, label): --text_column, --label_column and --label_names (None: from the data)."""

    text_columns: tuple | None = None
    label_column: str | None = None
    label_names: tuple | None = None

    @classmethod
    def from_config(cls, cfg) -> "TextOptions":
        split = lambda v: tuple(x.strip() for x in v.split(",")) if v else None  # noqa: E731
        return cls(
            split(getattr(cfg, "text_column", None)),
            getattr(cfg, "label_column", None),
            split(getattr(cfg, "label_names", None)),
        )


def balanced_subset(labels: list, n: int, seed: int, proportional: bool = False) -> list:
    """Indices of a class-balanced random subset of size n; proportional: a stratified one."""
    if n >= len(labels):
        return list(range(len(labels)))
    rng = random.Random(seed)
    by_class: dict[int, list] = {}
    for i, y in enumerate(labels):
        by_class.setdefault(y, []).append(i)
    classes = sorted(by_class)
    picked = []
    for k, c in enumerate(classes):
        if proportional:
            want = max(1, round(n * len(by_class[c]) / len(labels)))
        else:
            want = n // len(classes) + (1 if k < n % len(classes) else 0)
        idx = by_class[c][:]
        rng.shuffle(idx)
        picked += idx[:want]
    rng.shuffle(picked)
    return picked


def subset_index(labels: list, n: int | None, seed: int) -> list | None:
    """The rows of a class-balanced subset of n (the course's --num_samples / --eval_samples), or None to keep all."""
    return balanced_subset(labels, n, seed) if n and len(labels) > n else None


def take_subsets(splits: TextSplits, num_samples: int | None, eval_samples: int | None, seed: int) -> TextSplits:
    for split, n in (("train", num_samples), ("test", eval_samples)):
        texts, labels = getattr(splits, f"{split}_texts"), getattr(splits, f"{split}_labels")
        idx = subset_index(labels, n, seed)
        if idx is not None:
            setattr(splits, f"{split}_texts", [texts[i] for i in idx])
            setattr(splits, f"{split}_labels", [labels[i] for i in idx])
        elif not isinstance(texts, list):
            setattr(splits, f"{split}_texts", list(texts))  # every row kept: cleaned now, a plain list from here on
    return splits


def known_datasets_text() -> str:
    return (
        f"{', '.join(DATASETS)} (through the hub, its cache, or --data FOLDER), hub:OWNER/NAME, a folder with "
        "train.csv and test.csv, or csv:PATH (a CSV with a header; --text_column, --label_column)"
    )
