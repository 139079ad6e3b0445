"""The datasets of the course: where they come from, tokenized once, batched with dynamic padding.

What (`--dataset`):
  ag_news (default), imdb, amazon_polarity, yelp_polarity   known datasets: hub ids through `datasets`, or a
             local copy in their usual layout (--data FOLDER); label names known (IMDB: negative/positive)
  hub:OWNER/NAME                 any text-classification dataset on the hub (columns: --text_column/--label_column)
  FOLDER                         train/test files in one of the layouts below, recognised by their first row
  csv:PATH                       a CSV with a header (PATH: a folder with train.csv and test.csv, or one file whose
                                 test split is 10% held out), text and label taken from --text_column/--label_column
Layouts read from a folder:
  Zhang et al. 2015 CSV          no header, "class 1..K","field",...: ag_news_csv, amazon_review_polarity_csv,
                                 yelp_review_polarity_csv (a classes.txt beside them names the classes); AG News
                                 also as the Kaggle CSV with header `Class Index,Title,Description`
  a CSV with a header            IMDB's `id,rating,label,text` (label 0 negative, 1 positive), or any header with
                                 a text and a label column
Where a known dataset comes from (`--data`), AG News:
  hub        the Hugging Face hub through `datasets`; with HF_HUB_OFFLINE=1 (or an unreachable hub) its cache
  <folder>   the original ag_news_csv layout (train.csv / test.csv, no header, "class","title","description",
             optionally .gz) or the Kaggle CSV (header `Class Index,Title,Description`)
  embedded   a real AG News sample shipped inside this package (8,000 train rows, the full 7,600-row test
             set; assets/ag_news_sample/README.md gives its provenance): real news, offline
  synthetic  an AG-News-shaped set generated offline, only when asked for; never mistaken for the real thing
  auto       hub when reachable, else the folder in $DISTRINEWS_DATA_DIR, else the hub cache when it holds the
             dataset, else embedded (decided once, on rank 0, by the run plan); for the other known datasets:
             hub when reachable, else its cache
Labels are 0-based indices into the dataset's label names (AG News: 0 World, 1 Sports, 2 Business, 3 Sci/Tech),
which come from the data (a ClassLabel, classes.txt, the label values) or from --label_names.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import html
import io
import os
import random
import re
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import Dataset, Sampler

from . import LABEL_NAMES
from .errors import UserError
from .hub import hub_reachable
from .tokenization import encode_texts, truncation_of

HUB_DATASET = "fancyzhx/ag_news"  # the canonical id of "ag_news" on the hub
EMBEDDED_DIR = Path(__file__).parent / "assets" / "ag_news_sample"
SOURCES = ("auto", "hub", "embedded", "synthetic")
SYNTHETIC_NOTE = "SYNTHETIC AG-News-shaped data generated offline (not real news; accuracy says nothing about AG News)"
KAGGLE_HEADER = ["class index", "title", "description"]


@dataclass
class TextSplits:
    """Raw texts and 0-based labels for train and test, their label names, and where they came from."""

    train_texts: list
    train_labels: list
    test_texts: list
    test_labels: list
    source: str                  # "hub", "folder", "csv", "embedded" or "synthetic"
    detail: str                  # human-readable: hub id, folder path, or the synthetic warning
    is_synthetic: bool = False
    full_sizes: dict = field(default_factory=dict)
    label_names: list = field(default_factory=lambda: list(LABEL_NAMES))  # label i is label_names[i]
    name: str = "AG News"        # the dataset, for titles: "AG News", "IMDB", "reviews.csv"...

    def describe(self) -> str:
        return (f"data: {self.source} ({self.detail}); train {len(self.train_texts)} rows, "
                f"test {len(self.test_texts)} rows; {len(self.label_names)} classes")

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
        """A short hash of the label names and every text and label: two ranks with the same fingerprint train
        on the same data, with the same meaning for each label."""
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
        """The class balance of both splits, in one line, with a warning when it is skewed."""
        parts, notes = [], []
        for split in ("train", "test"):
            counts = self.class_counts(split)
            total = max(1, sum(counts))
            parts.append(f"{split} " + ", ".join(f"{n} {c:,} ({100 * c / total:.1f}%)"
                                                 for n, c in zip(self.label_names, counts)))
            empty = [n for n, c in zip(self.label_names, counts) if c == 0]
            if empty:
                notes.append(f"no {split} example of {', '.join(empty)}")
            elif max(counts) > 1.5 * min(counts):
                notes.append(f"{split} is imbalanced (largest class {max(counts) / min(counts):.1f}x the smallest): "
                             "accuracy alone hides the small classes")
        return "class balance: " + "; ".join(parts) + ("".join(f" | WARNING: {n}" for n in notes))


# --------------------------------------------------------------------------- the known datasets

@dataclass(frozen=True)
class DatasetSpec:
    """A dataset the course knows by name: its hub id, its label names, and how its rows become one text."""

    key: str                     # --dataset value
    hub_id: str                  # canonical id on the Hugging Face hub
    name: str                    # for titles
    label_names: tuple           # in the order of its labels (0, 1, ...)
    hub_text_columns: tuple      # hub columns joined into one text
    zhang_fields: tuple          # text fields after the class in the headerless Zhang et al. CSV layout
    cache_aliases: tuple = ()    # older names it may be cached under
    folder_hint: str = ""


DATASETS = {
    "ag_news": DatasetSpec("ag_news", HUB_DATASET, "AG News", tuple(LABEL_NAMES), ("text",), ("title", "description"),
                           ("ag_news",), "ag_news_csv (train.csv, test.csv) or the Kaggle CSV, e.g. ../shared/data/ag_news"),
    "imdb": DatasetSpec("imdb", "stanfordnlp/imdb", "IMDB", ("negative", "positive"), ("text",), ("text",), ("imdb",),
                        "train.csv and test.csv with the header id,rating,label,text, e.g. ../shared/data/imdb"),
    "amazon_polarity": DatasetSpec("amazon_polarity", "fancyzhx/amazon_polarity", "Amazon Reviews Polarity",
                                   ("negative", "positive"), ("title", "content"), ("title", "text"), ("amazon_polarity",),
                                   "amazon_review_polarity_csv (train.csv, test.csv: \"1|2\",\"title\",\"text\")"),
    "yelp_polarity": DatasetSpec("yelp_polarity", "fancyzhx/yelp_polarity", "Yelp Reviews Polarity",
                                 ("negative", "positive"), ("text",), ("text",), ("yelp_polarity",),
                                 "yelp_review_polarity_csv (train.csv, test.csv: \"1|2\",\"text\")"),
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
        return cls(split(getattr(cfg, "text_column", None)), getattr(cfg, "label_column", None),
                   split(getattr(cfg, "label_names", None)))


# --------------------------------------------------------------------------- reading CSV files

# AG News lost the '&' of its HTML escapes: " #39;" is "&#39;", " quot;" is "&quot;".
_BARE_ENTITY = re.compile(r"(?<!&) ?(#\d+|quot|amp|lt|gt);")
_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)


def clean_text(title: str, description: str) -> str:
    """Title and description as one string; undo AG News' quirks (`\\` line breaks, ` #39;` escapes)."""
    text = f"{title.strip()}. {description.strip()}" if title.strip() else description.strip()
    text = text.replace("\\", " ")
    text = _BARE_ENTITY.sub(lambda m: html.unescape(f"&{m.group(1)};"), text)
    return " ".join(html.unescape(text).split())


def clean_review(*parts: str) -> str:
    """Review texts (IMDB, Amazon, Yelp, a user's CSV): HTML line breaks and escapes undone, the Zhang CSVs'
    literal `\\n` as spaces, whitespace collapsed; several fields joined as 'first. second'."""
    out = []
    for p in parts:
        p = _BR.sub(" ", (p or "").replace("\\n", " ").replace('\\"', '"'))
        p = " ".join(html.unescape(p).split())
        if p:
            out.append(p)
    return ". ".join(out)


def _open_text(path: Path):
    # utf-8-sig: a CSV saved by Excel starts with an invisible byte-order mark; read it as UTF-8 without it.
    with open(path, "rb") as raw:
        head = raw.read(2)
    if head == b"\x1f\x8b":
        with gzip.open(path) as packed:
            head = packed.read(2)
    if head in (b"\xff\xfe", b"\xfe\xff"):
        raise UserError(f"{path} is UTF-16 text (it starts with a UTF-16 byte-order mark, as Excel's \"Unicode text\" "
                        "saves): save it as \"CSV UTF-8\" instead, then run again.")
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _unreadable(path: Path, err: BaseException, what: str) -> UserError:
    if isinstance(err, OSError) and not isinstance(err, (gzip.BadGzipFile, EOFError)):
        return UserError(f"{path} could not be opened ({err.strerror or type(err).__name__}). Point --data/--dataset at "
                         "readable CSV files.")
    return UserError(f"{path} could not be read as a UTF-8 CSV ({type(err).__name__}: {err}). A damaged download? "
                     f"Fetch it again; is it really {what}?")


def read_zhang_csv(path: str | os.PathLike, label_names: list | None, fields: tuple = ("title", "description"),
                   what: str = "AG News") -> tuple[list, list]:
    """(texts, 0-based labels) from a headerless CSV of the Zhang et al. 2015 layout: "class 1..K","field",...
    (ag_news_csv, amazon_review_polarity_csv, yelp_review_polarity_csv). label_names None: any class >= 1."""
    path = Path(path)
    n = len(fields) + 1
    k = len(label_names) if label_names else None
    classes = ", ".join(f"{i + 1} {name}" for i, name in enumerate(label_names)) if label_names else ""
    example = ",".join(['"3"' if n == 3 else '"1"'] + [f'"{f.capitalize()}"' for f in fields])
    texts, labels = [], []
    try:
        with _open_text(path) as f:
            for lineno, row in enumerate(csv.reader(f), start=1):
                if lineno == 1 and [c.strip().lower() for c in row] == KAGGLE_HEADER and n == 3:
                    continue
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != n:
                    raise UserError(
                        f"{path}, line {lineno}: expected {n} fields (class, {', '.join(fields)}), found {len(row)}. "
                        f"{what} rows look like {example}; fix or remove that row.")
                try:
                    label = int(row[0])
                except ValueError:
                    raise UserError(f"{path}, line {lineno}: the class '{row[0][:30]}' is not a number"
                                    + (f" 1..{k} ({classes})." if k else " (1, 2, ...).")) from None
                if (k and not 1 <= label <= k) or label < 1:
                    raise UserError(f"{path}, line {lineno}: class {label} is outside 1..{k or 'K'}"
                                    + (f" ({classes})" if k else "") + ". Fix the label or drop the row.")
                texts.append(clean_text(row[1], row[2]) if what == "AG News" else clean_review(*row[1:]))
                labels.append(label - 1)
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, csv.Error, zlib.error, OSError) as err:
        raise _unreadable(path, err, f"{what} ({'ag_news_csv or the Kaggle CSV' if what == 'AG News' else 'a Zhang et al. CSV'})") from None
    if not texts:
        raise UserError(f"{path} holds no rows.")
    return texts, labels


def read_agnews_csv(path: str | os.PathLike) -> tuple[list, list]:
    """(texts, labels 0..3) from one AG News CSV, with or without the Kaggle header."""
    return read_zhang_csv(path, LABEL_NAMES)


def read_header_csv(path: str | os.PathLike, text_columns: tuple, label_column: str) -> tuple[list, list]:
    """(texts, [(raw label, line number)]) from a CSV with a header row; the named columns must be there."""
    path = Path(path)
    texts, raw = [], []
    try:
        with _open_text(path) as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise UserError(f"{path} is empty: expected a header row naming its columns, then one row per text.")
            names = [h.strip() for h in header]
            lowered = [h.lower() for h in names]
            missing = [c for c in (*text_columns, label_column) if c.lower() not in lowered]
            if missing:
                raise UserError(
                    f"{path} has no column {', '.join(map(repr, missing))} (its header: {', '.join(map(repr, names))[:300]}). "
                    "Name the text and label columns with --text_column and --label_column "
                    "(several text columns, comma-separated, are joined).")
            t_idx = [lowered.index(c.lower()) for c in text_columns]
            l_idx = lowered.index(label_column.lower())
            for lineno, row in enumerate(reader, start=2):
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != len(names):
                    raise UserError(f"{path}, line {lineno}: {len(row)} fields where the header names {len(names)}. "
                                    "A quote left open or a stray comma? Fix or remove that row.")
                value = row[l_idx].strip()
                if not value:
                    raise UserError(f"{path}, line {lineno}: the label column '{names[l_idx]}' is empty. Give every row "
                                    "a label, or remove the row.")
                texts.append(clean_review(*(row[i] for i in t_idx)))
                raw.append((value, lineno))
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, csv.Error, zlib.error, OSError) as err:
        raise _unreadable(path, err, "a CSV with a header") from None
    if not texts:
        raise UserError(f"{path} holds a header but no rows.")
    return texts, raw


def label_indices(raw: list, names: list | None, path) -> tuple[list, list]:
    """Raw label values -> (0-based indices, label names). With names: each value is a name or an index 0..K-1.
    Without: the distinct values, sorted (numbers as numbers), become the names."""
    if names is None:
        values = sorted({v for v, _ in raw}, key=lambda v: (0, int(v), "") if _is_int(v) else (1, 0, v))
        names = values
    lookup = {n: i for i, n in enumerate(names)}
    lower = {n.lower(): i for i, n in enumerate(names)}
    out = []
    for value, lineno in raw:
        i = lookup.get(value, lower.get(value.lower()))
        if i is None and _is_int(value) and 0 <= int(value) < len(names):
            i = int(value)
        if i is None:
            raise UserError(
                f"{path}, line {lineno}: the label '{value[:40]}' is not one of the {len(names)} label names "
                f"({', '.join(names)[:200]}) nor an index 0..{len(names) - 1}. Fix that row, or name every class "
                "with --label_names (comma-separated, in the order of the indices).")
        out.append(i)
    return out, list(names)


def _is_int(v: str) -> bool:
    try:
        int(v)
        return True
    except ValueError:
        return False


def find_split_file(folder: Path, split: str) -> Path:
    """train.csv / train.csv.gz, else the one train*.csv[.gz] (e.g. train_subset_12000.csv.gz)."""
    for name in (f"{split}.csv", f"{split}.csv.gz"):
        candidate = folder / name
        if candidate.is_symlink() and not candidate.exists():
            raise UserError(f"data folder {folder}: {name} is a broken symbolic link (to {os.readlink(candidate)}). "
                            "Fix the link or copy the file there.")
        if candidate.is_dir():
            raise UserError(f"data folder {folder}: {name} is a folder, not a file. Expected the {split} split as a CSV file.")
        if candidate.is_file():
            return candidate
    found = sorted(p for p in folder.glob(f"{split}*.csv*") if p.suffix in (".csv", ".gz") and p.is_file())
    if len(found) == 1:
        return found[0]
    what = "several files: " + ", ".join(p.name for p in found) if found else "no file"
    raise UserError(f"data folder {folder}: looking for the {split} split, found {what}. Expected {split}.csv or "
                    f"{split}.csv.gz (the original ag_news_csv layout, the Kaggle CSV, or a CSV with a header).")


def sniff_layout(path: Path) -> str:
    """'kaggle_ag' (AG News' Kaggle header), 'zhang' (no header: the first field is a class number), or 'header'."""
    try:
        with _open_text(path) as f:
            first = next(csv.reader(f), [])
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, csv.Error, zlib.error, OSError) as err:
        raise _unreadable(path, err, "a CSV") from None
    if [c.strip().lower() for c in first] == KAGGLE_HEADER:
        return "kaggle_ag"
    return "zhang" if first and _is_int(first[0].strip()) else "header"


def _classes_txt(folder: Path) -> list | None:
    path = folder / "classes.txt"
    if path.is_file():
        names = [line.strip() for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
        return names or None
    return None


def load_folder(folder: str | os.PathLike, spec: DatasetSpec | None = DATASETS["ag_news"],
                opts: TextOptions = TextOptions()) -> TextSplits:
    """train/test files of a folder, in the layout its first row shows. spec: the known dataset it holds
    (default AG News, what --data FOLDER always meant); None: whatever the files say (--dataset FOLDER)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise UserError(f"data folder {folder} does not exist. Pass a folder holding train.csv and test.csv "
                        f"({spec.folder_hint if spec else 'a layout of the ones --help lists'}), or use --data synthetic / --data hub.")
    train_file, test_file = find_split_file(folder, "train"), find_split_file(folder, "test")
    layout = sniff_layout(train_file)
    detail = f"{train_file} + {test_file.name}"
    if layout == "header" and spec is not None and spec.key == "ag_news" and opts.text_columns is None:
        raise UserError(f"{train_file} starts with a header row that is not AG News' (Kaggle: Class Index,Title,Description). "
                        "For another dataset, pass --dataset with its name, the folder itself (--dataset FOLDER), or csv:PATH "
                        "with --text_column and --label_column.")
    if layout == "header":
        return load_header_csvs(train_file, test_file, spec, opts, detail, source="folder")
    if opts.text_columns or opts.label_column:
        raise UserError(f"{train_file} has no header row (the Zhang et al. layout: class, then the text fields), so "
                        "--text_column and --label_column do not apply. Leave them out.")
    if spec is None and layout == "kaggle_ag":
        spec = DATASETS["ag_news"]
    names = list(opts.label_names) if opts.label_names else (list(spec.label_names) if spec else _classes_txt(folder))
    fields, what = (spec.zhang_fields, spec.name) if spec else (None, "the dataset")
    if fields is None:  # count the fields of the first row
        with _open_text(train_file) as f:
            fields = tuple(f"field{i}" for i in range(1, len(next(csv.reader(f), ["", ""]))))
    tr_x, tr_y = read_zhang_csv(train_file, names, fields, what)
    te_x, te_y = read_zhang_csv(test_file, names, fields, what)
    if names is None:
        names = [str(i + 1) for i in range(max(tr_y + te_y) + 1)]
    return TextSplits(tr_x, tr_y, te_x, te_y, "folder", detail, full_sizes={"train": len(tr_x), "test": len(te_x)},
                      label_names=names, name=spec.name if spec else folder.name)


def load_header_csvs(train_file: Path, test_file: Path | None, spec: DatasetSpec | None, opts: TextOptions,
                     detail: str, source: str, seed: int = 1234, test_fraction: float = 0.1) -> TextSplits:
    """A CSV with a header per split (or one file, whose test split is a stratified 10% held out)."""
    imdb_like = sniff_header(train_file) == IMDB_HEADER
    if spec is None and imdb_like and not opts.text_columns and not opts.label_column:
        spec = DATASETS["imdb"]
    text_columns = opts.text_columns or ("text",)
    label_column = opts.label_column or "label"
    names = list(opts.label_names) if opts.label_names else (list(spec.label_names) if spec else None)
    tr_x, tr_raw = read_header_csv(train_file, text_columns, label_column)
    if test_file is not None:
        te_x, te_raw = read_header_csv(test_file, text_columns, label_column)
    if names is None:  # from the values of both splits, so that both index the same names
        everything = tr_raw + (te_raw if test_file is not None else [])
        _, names = label_indices(everything, None, train_file)
    tr_y, names = label_indices(tr_raw, names, train_file)
    if test_file is not None:
        te_y, _ = label_indices(te_raw, names, test_file)
    else:  # hold out a stratified, fixed share as the test split
        held = set(balanced_subset(tr_y, max(len(names), round(test_fraction * len(tr_y))), seed, proportional=True))
        te_x, te_y = [tr_x[i] for i in sorted(held)], [tr_y[i] for i in sorted(held)]
        tr_x, tr_y = [x for i, x in enumerate(tr_x) if i not in held], [y for i, y in enumerate(tr_y) if i not in held]
        detail = f"{train_file} (test: {100 * test_fraction:.0f}% of its rows held out, stratified, seed {seed})"
    name = spec.name if spec else Path(train_file).name.split(".")[0] if test_file is None else Path(train_file).parent.name
    return TextSplits(tr_x, tr_y, te_x, te_y, source, detail, full_sizes={"train": len(tr_x), "test": len(te_x)},
                      label_names=names, name=name)


def sniff_header(path: Path) -> list:
    with _open_text(path) as f:
        return [c.strip().lower() for c in next(csv.reader(f), [])]


def load_csv(spec_path: str, opts: TextOptions = TextOptions()) -> TextSplits:
    """csv:PATH - a folder with train.csv and test.csv (.gz ok), or one CSV file (10% held out as the test split)."""
    path = Path(spec_path).expanduser()
    if path.is_dir():
        train_file, test_file = find_split_file(path, "train"), find_split_file(path, "test")
        return load_header_csvs(train_file, test_file, None, opts, f"{train_file} + {test_file.name}", source="csv")
    if not path.is_file():
        raise UserError(f"--dataset csv:{spec_path}: no such file or folder. Give a CSV file with a header row (its test "
                        "split is 10% of the rows, held out), or a folder holding train.csv and test.csv.")
    return load_header_csvs(path, None, None, opts, str(path), source="csv")


def load_embedded() -> TextSplits:
    """The real AG News sample inside the package: offline, and real news (see assets/ag_news_sample/README.md)."""
    splits = load_folder(EMBEDDED_DIR)
    splits.source, splits.detail = "embedded", "real AG News sample shipped in distrinews_lib/assets/ag_news_sample"
    return splits


def _hub_cache_name(spec: DatasetSpec | None, repo_id: str) -> str | None:
    """The name under which the datasets cache holds repo_id (or one of its older aliases), or None."""
    from .hub import dataset_cached

    for name in (repo_id, *(spec.cache_aliases if spec else ())):
        if dataset_cached(name):
            return name
    return None


def _no_cache_message(repo_id: str, why: str) -> str:
    from .hub import datasets_cache_dir, dataset_download_command

    return (f"--data hub: {why}, and the Hugging Face datasets cache at {datasets_cache_dir()} holds no copy of "
            f"'{repo_id}'. On a machine with internet (a login node), fill that cache with: "
            f"{dataset_download_command(repo_id)} - then run again here with HF_HUB_OFFLINE=1 (set HF_HOME or "
            f"HF_DATASETS_CACHE the same way on both). Or use a local copy: --data <folder>"
            + (" or --data embedded (a real AG News sample, offline)." if repo_id == HUB_DATASET else "."))


def load_hub(name: str = HUB_DATASET, spec: DatasetSpec | None = None, opts: TextOptions = TextOptions(),
             num_samples: int | None = None, eval_samples: int | None = None, seed: int = 0) -> TextSplits:
    """A dataset through `datasets`: from the hub when it answers; from the local cache, without any request,
    under HF_HUB_OFFLINE=1 (or HF_DATASETS_OFFLINE=1) or when the hub does not answer."""
    from .hub import datasets_cache_dir, env_says_offline, offline_datasets

    if spec is None:
        spec = next((s for s in DATASETS.values() if s.hub_id == name or name in s.cache_aliases), None)
    offline = env_says_offline() or not hub_reachable()
    load_name = name
    if offline:
        load_name = _hub_cache_name(spec, name)
        if load_name is None:
            why = ("the hub is not reachable (offline mode: HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set)" if env_says_offline()
                   else "the Hugging Face hub is not reachable from this machine")
            raise UserError(_no_cache_message(name, why))
    from datasets import load_dataset

    try:
        if offline:
            with offline_datasets():
                ds = load_dataset(load_name, cache_dir=datasets_cache_dir())
        else:
            ds = load_dataset(name, cache_dir=datasets_cache_dir())
    except Exception as err:  # network errors, renamed datasets, a damaged cache... all are the user's environment
        where = f"the cache at {datasets_cache_dir()}" if offline else "the Hugging Face hub"
        raise UserError(f"could not load '{name}' from {where} ({type(err).__name__}: "
                        f"{str(err).splitlines()[0][:200] if str(err) else ''}). Use --data <folder>"
                        + (" or --data embedded." if name == HUB_DATASET else ".")) from None
    splits = {k.lower(): v for k, v in ds.items()}
    if "train" not in splits or "test" not in splits:
        raise UserError(f"'{name}' has the splits {', '.join(ds)}; the course needs a 'train' and a 'test' split.")
    tr, te = splits["train"], splits["test"]
    label_column = opts.label_column or "label"
    text_columns = opts.text_columns or (spec.hub_text_columns if spec else ("text",))
    for col in (*text_columns, label_column):
        if col not in tr.column_names:
            raise UserError(f"'{name}' has no column '{col}' (its columns: {', '.join(tr.column_names)}). Name the text "
                            "and label columns with --text_column and --label_column.")
    feature = tr.features[label_column]
    names = (list(opts.label_names) if opts.label_names else list(spec.label_names) if spec
             else list(feature.names) if hasattr(feature, "names") else None)
    tr_labels, te_labels = list(tr[label_column]), list(te[label_column])
    if names is None or not all(isinstance(v, int) for v in tr_labels[:1000]):
        raw_tr = [(str(v), i + 2) for i, v in enumerate(tr_labels)]
        raw_te = [(str(v), i + 2) for i, v in enumerate(te_labels)]
        if names is None:
            _, names = label_indices(raw_tr + raw_te, None, name)
        tr_labels, _ = label_indices(raw_tr, names, f"{name} (train)")
        te_labels, _ = label_indices(raw_te, names, f"{name} (test)")
    else:
        bad = next((v for v in tr_labels + te_labels if not 0 <= v < len(names)), None)
        if bad is not None:
            raise UserError(f"'{name}' has the label {bad}, outside 0..{len(names) - 1} ({', '.join(names)}). Name every "
                            "class with --label_names.")
    full = {"train": len(tr), "test": len(te)}
    idx_tr = balanced_subset(tr_labels, num_samples, seed) if num_samples else None
    idx_te = balanced_subset(te_labels, eval_samples, seed) if eval_samples else None
    if idx_tr is not None:
        tr, tr_labels = tr.select(idx_tr), [tr_labels[i] for i in idx_tr]
    if idx_te is not None:
        te, te_labels = te.select(idx_te), [te_labels[i] for i in idx_te]
    clean = (lambda *p: clean_text("", p[0])) if spec and spec.key == "ag_news" else clean_review  # noqa: E731

    def texts(split):
        columns = [split[c] for c in text_columns]
        return [clean(*(str(v) if v is not None else "" for v in row)) for row in zip(*columns)]

    detail = name + (f" (from the cache in {datasets_cache_dir()}, offline)" if offline else "")
    return TextSplits(texts(tr), tr_labels, texts(te), te_labels, "hub", detail, full_sizes=full, label_names=names,
                      name=spec.name if spec else name)


# --------------------------------------------------------------------------- synthetic data

_TOPIC_WORDS = {
    0: "government minister election troops president parliament embassy rebels ceasefire talks diplomats "
       "refugees military capital sanctions treaty protest border nuclear united nations iraq envoy".split(),
    1: "team season coach match championship league player scored goal victory tournament olympic "
       "cup final striker inning quarterback title medal race defeat squad".split(),
    2: "shares profit quarterly earnings market stocks investors bank oil prices revenue merger "
       "company economy dollar sales billion analysts deal retail forecast".split(),
    3: "software internet computer technology researchers space scientists microsoft google launch "
       "users wireless chip network online device nasa data study web".split(),
}
_COMMON = ("the a new on in after over with for to as says report week year first said will after "
           "could amid more than two three monday tuesday wednesday thursday friday").split()


def synthetic_agnews(n_train: int = 10_000, n_test: int = 2_000, seed: int = 1234) -> TextSplits:
    """Headlines built from per-class topic words, common words, and some off-topic words.

    About one word in five comes from another class, so the task is learnable but not trivial.
    """
    rng = random.Random(seed)

    def make(n):
        texts, labels = [], []
        for i in range(n):
            label = i % 4
            words = []
            for _ in range(rng.randint(12, 40)):
                r = rng.random()
                if r < 0.35:
                    words.append(rng.choice(_TOPIC_WORDS[label]))
                elif r < 0.45:
                    words.append(rng.choice(_TOPIC_WORDS[rng.randrange(4)]))
                else:
                    words.append(rng.choice(_COMMON))
            cut = rng.randint(4, 8)
            texts.append(" ".join(words[:cut]).capitalize() + ". " + " ".join(words[cut:]) + ".")
            labels.append(label)
        order = list(range(n))
        rng.shuffle(order)
        return [texts[j] for j in order], [labels[j] for j in order]

    tr_x, tr_y = make(n_train)
    te_x, te_y = make(n_test)
    return TextSplits(tr_x, tr_y, te_x, te_y, "synthetic", SYNTHETIC_NOTE, is_synthetic=True,
                      full_sizes={"train": n_train, "test": n_test})


# --------------------------------------------------------------------------- choosing the dataset and its source

def balanced_subset(labels: list, n: int, seed: int, proportional: bool = False) -> list:
    """Indices of a class-balanced random subset of size n (remainders go to the first classes); proportional:
    each class keeps its share instead (a stratified sample)."""
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


def known_datasets_text() -> str:
    return (f"{', '.join(DATASETS)} (through the hub, its cache, or --data FOLDER), hub:OWNER/NAME, a folder with "
            "train.csv and test.csv, or csv:PATH (a CSV with a header; --text_column, --label_column)")


def resolve_dataset(dataset: str) -> str:
    """--dataset as the plan records it: a known key, 'hub:OWNER/NAME', 'folder:/abs/path' or 'csv:/abs/path'."""
    dataset = (dataset or "ag_news").strip()
    if dataset.lower() in DATASETS:
        return dataset.lower()
    if dataset.startswith("csv:"):
        path = Path(dataset[4:]).expanduser()
        if not dataset[4:] or not path.exists():
            raise UserError(f"--dataset {dataset}: no such file or folder. csv:PATH takes a CSV file with a header row, or "
                            "a folder holding train.csv and test.csv.")
        return f"csv:{path.resolve()}"
    if dataset.startswith("hub:"):
        if dataset[4:].count("/") != 1:
            raise UserError(f"--dataset {dataset}: a hub id has the form hub:OWNER/NAME (e.g. hub:stanfordnlp/imdb).")
        return dataset
    path = Path(dataset).expanduser()
    if path.is_dir():
        return f"folder:{path.resolve()}"
    if dataset.count("/") == 1 and not dataset.startswith((".", "/", "~")) and not path.exists():
        known = next((k for k, s in DATASETS.items() if s.hub_id == dataset), None)
        return known or f"hub:{dataset}"
    raise UserError(f"--dataset {dataset}: not a dataset the course knows and not a folder. Choices: {known_datasets_text()}.")


def resolve_source(source: str, dataset: str = "ag_news", hub: bool | None = None) -> str:
    """What `auto` means on this machine for a known dataset. AG News: the hub when reachable, else
    $DISTRINEWS_DATA_DIR, else the hub cache if it holds AG News, else the embedded real sample. The others: the
    hub when reachable, else its cache. Under DDP only rank 0 asks (plan.decide); every rank then loads what it decided."""
    from .hub import env_says_offline

    spec = DATASETS.get(dataset)
    if spec is None:  # a folder, csv:PATH or hub:ID: --dataset says where it is
        if source not in ("auto", "hub") and not (dataset.startswith("hub:") and source == "hub"):
            raise UserError(f"--data {source} does not go with --dataset {dataset.split(':', 1)[-1]}: that already says "
                            "where the data is. Leave --data at auto.")
        return "hub" if dataset.startswith("hub:") else dataset.split(":", 1)[0]
    if source in ("embedded", "synthetic") and spec.key != "ag_news":
        raise UserError(f"--data {source} is AG News only (the sample inside the package, or generated headlines). "
                        f"For {spec.name} use --data hub (or its cache offline) or --data FOLDER ({spec.folder_hint}).")
    if source != "auto":
        return source
    reachable = (not env_says_offline() and hub_reachable()) if hub is None else hub
    if reachable:
        return "hub"
    if spec.key == "ag_news":
        env_dir = os.environ.get("DISTRINEWS_DATA_DIR")
        if env_dir:
            if not Path(env_dir).expanduser().is_dir():
                raise UserError(f"DISTRINEWS_DATA_DIR={env_dir} is not a folder. Point it at a folder holding "
                                "train.csv and test.csv (or unset it to use the embedded real sample offline).")
            return str(Path(env_dir).expanduser())
        return "hub" if _hub_cache_name(spec, spec.hub_id) else "embedded"
    if _hub_cache_name(spec, spec.hub_id):
        return "hub"
    from .hub import dataset_download_command, datasets_cache_dir

    raise UserError(f"--dataset {spec.key}: the Hugging Face hub is not reachable and its cache at {datasets_cache_dir()} "
                    f"holds no copy of {spec.hub_id}. Point --data at a local copy ({spec.folder_hint}), or fill the cache "
                    f"on a machine with internet (a login node): {dataset_download_command(spec.hub_id)}")


def load_dataset_splits(dataset: str, source: str, num_samples: int | None = None, eval_samples: int | None = None,
                        seed: int = 0, opts: TextOptions = TextOptions()) -> TextSplits:
    """Load a resolved dataset (resolve_dataset) from a resolved source (resolve_source), then take class-balanced
    subsets of train (num_samples) and test (eval_samples)."""
    spec = DATASETS.get(dataset)
    if spec is not None:
        if opts.label_names and len(opts.label_names) != len(spec.label_names):
            raise UserError(f"--label_names gives {len(opts.label_names)} names ({', '.join(opts.label_names)}) but "
                            f"{spec.name} has {len(spec.label_names)} classes ({', '.join(spec.label_names)}).")
        if spec.key == "ag_news" and source in ("embedded", "synthetic"):
            splits = load_embedded() if source == "embedded" else synthetic_agnews()
        elif source == "hub":
            splits = load_hub(spec.hub_id, spec, opts, num_samples, eval_samples, seed)
        else:
            splits = load_folder(source, spec, opts)
        if opts.label_names and source in ("embedded", "synthetic"):
            splits.label_names = list(opts.label_names)
    elif dataset.startswith("hub:"):
        splits = load_hub(dataset[4:], None, opts, num_samples, eval_samples, seed)
    elif dataset.startswith("csv:"):
        splits = load_csv(dataset[4:], opts)
    elif dataset.startswith("folder:"):
        splits = load_folder(dataset[7:], None, opts)
    else:
        raise UserError(f"--dataset {dataset}: unknown. Choices: {known_datasets_text()}.")
    if opts.label_names and len(opts.label_names) != len(splits.label_names):
        raise UserError(f"--label_names gives {len(opts.label_names)} names ({', '.join(opts.label_names)}) but the data "
                        f"has {len(splits.label_names)} classes ({', '.join(splits.label_names)[:200]}).")
    if len(splits.label_names) < 2:
        raise UserError(f"{splits.detail}: only one class ({', '.join(splits.label_names)}); a classifier needs two or more.")
    for attr, n in (("train", num_samples), ("test", eval_samples)):
        if n and len(getattr(splits, f"{attr}_texts")) > n:
            x, y = getattr(splits, f"{attr}_texts"), getattr(splits, f"{attr}_labels")
            idx = balanced_subset(y, n, seed)
            setattr(splits, f"{attr}_texts", [x[i] for i in idx])
            setattr(splits, f"{attr}_labels", [y[i] for i in idx])
    return splits


def load_agnews(source: str, num_samples: int | None = None, eval_samples: int | None = None,
                seed: int = 0) -> TextSplits:
    """Load AG News from `source` (hub, embedded, synthetic, a folder, or auto), then take class-balanced subsets
    of train (num_samples) and test (eval_samples)."""
    return load_dataset_splits("ag_news", resolve_source(source), num_samples, eval_samples, seed)


# --------------------------------------------------------------------------- tokenize once, cache

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
    """Token ids (unpadded lists) for each text, cut as the tokenizer was told (tokenization.set_truncation:
    head, or head_tail); cached on disk so every rank and rerun reuses them."""
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
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                torch.save(ids, f)
            os.replace(tmp, path)  # atomic: ranks tokenizing at the same time can't corrupt it
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


def tokenize_splits(splits: TextSplits, tokenizer, max_length: int) -> tuple[TokenizedDataset, TokenizedDataset]:
    return (TokenizedDataset(tokenize_texts(splits.train_texts, tokenizer, max_length), splits.train_labels),
            TokenizedDataset(tokenize_texts(splits.test_texts, tokenizer, max_length), splits.test_labels))


class PadCollator:
    """Dynamic padding: pad each batch to its own longest sequence, rounded up to a multiple of 8
    (tensor cores like multiples of 8; on CPU it costs a few pad tokens)."""

    def __init__(self, pad_id: int = 0, pad_to_multiple_of: int | None = 8):
        self.pad_id = pad_id
        self.multiple = pad_to_multiple_of or 1

    def __call__(self, items):
        longest = max(len(it["input_ids"]) for it in items)
        width = -(-longest // self.multiple) * self.multiple
        ids = torch.full((len(items), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for r, it in enumerate(items):
            n = len(it["input_ids"])
            ids[r, :n] = torch.tensor(it["input_ids"], dtype=torch.long)
            mask[r, :n] = 1
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "labels": torch.tensor([it["label"] for it in items], dtype=torch.long),
            "index": torch.tensor([it["index"] for it in items], dtype=torch.long),
        }


class LengthGroupedBatchSampler(Sampler):
    """Batches of similar length, drawn from whatever `sampler` yields (e.g. a DistributedSampler shard).

    The sampler's order is cut into chunks of `batch_size * chunk_batches` indices; each chunk is sorted
    by length and cut into batches; the batch order is then shuffled. Every rank regroups only its own
    shard, so sharding stays disjoint, and each rank gets the same number of batches.
    """

    def __init__(self, sampler, lengths, batch_size: int, chunk_batches: int = 50, seed: int = 0, drop_last: bool = False):
        self.sampler, self.lengths, self.batch_size = sampler, lengths, batch_size
        self.chunk = batch_size * chunk_batches
        self.seed, self.drop_last, self.epoch = seed, drop_last, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self):
        epoch = getattr(self.sampler, "epoch", self.epoch)  # follow DistributedSampler.set_epoch
        order = list(self.sampler)
        batches = []
        for s in range(0, len(order), self.chunk):
            chunk = sorted(order[s:s + self.chunk], key=lambda i: self.lengths[i])
            batches += [chunk[b:b + self.batch_size] for b in range(0, len(chunk), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        random.Random(self.seed * 1_000_003 + epoch).shuffle(batches)
        return iter(batches)

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class ShuffleSampler(Sampler):
    """A random order that depends only on (seed, epoch): call set_epoch(epoch) before each epoch.

    The single-process script's sampler. Like DistributedSampler with one replica, so a resumed run
    replays the same order without storing any random state.
    """

    def __init__(self, dataset, seed: int = 0):
        self.n, self.seed, self.epoch = len(dataset), seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self):
        return self.n


def loader_options(cfg, pad_id: int | None, device) -> dict:
    """DataLoader options from the fast-path flags (pinned memory only helps host-to-GPU copies)."""
    on_cuda = device.type == "cuda"
    pin = on_cuda if cfg.pin_memory is None else bool(cfg.pin_memory) and on_cuda
    # Multiples of 8 feed tensor cores; a CPU has none, so there they are only extra pad tokens (4-8% more CPU time per sample).
    multiple = (8 if on_cuda else None) if cfg.pad_multiple is None else (cfg.pad_multiple or None)
    return dict(pad_id=pad_id or 0, pad_to_multiple_of=multiple, pin_memory=pin)


def make_loader(dataset: TokenizedDataset, batch_size: int, sampler=None, *, shuffle: bool = False, seed: int = 0,
                group_by_length: bool = False, pad_id: int = 0, pad_to_multiple_of: int | None = 8,
                pin_memory: bool = False, num_workers: int = 0):
    """A DataLoader with dynamic padding; with group_by_length, batches of similar length (less padding)."""
    from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

    if sampler is None:
        g = torch.Generator().manual_seed(seed)
        sampler = RandomSampler(dataset, generator=g) if shuffle else SequentialSampler(dataset)
    # A dataset that knows how its batches are made (language-model blocks) brings its own collator.
    collate = dataset.collator_for(sampler) if hasattr(dataset, "collator_for") else PadCollator(pad_id, pad_to_multiple_of)
    # Its own generator: creating an iterator then leaves the global torch RNG (dropout) untouched,
    # which a resumed run needs to replay the same random numbers.
    common = dict(collate_fn=collate, pin_memory=pin_memory, num_workers=num_workers,
                  persistent_workers=num_workers > 0, generator=torch.Generator().manual_seed(seed))
    if group_by_length:
        batch_sampler = LengthGroupedBatchSampler(sampler, dataset.lengths, batch_size, seed=seed)
        return DataLoader(dataset, batch_sampler=batch_sampler, **common)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **common)
