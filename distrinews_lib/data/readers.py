"""Reading datasets from files: the headerless CSV of Zhang et al. 2015 (AG News also as the Kaggle CSV), a
CSV with a header, a folder of train and test files, csv:PATH. Every mistake in a file is named with its path
and line.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import zlib
from pathlib import Path
from typing import Callable

from ..errors import UserError
from .texts import (
    DATASETS,
    IMDB_HEADER,
    CleanOnRead,
    DatasetSpec,
    TextOptions,
    TextSplits,
    balanced_subset,
    clean_news,
    clean_review,
)

KAGGLE_HEADER = ["class index", "title", "description"]


def _open_text(path: Path):
    # utf-8-sig: a CSV saved by Excel starts with an invisible byte-order mark; read it as UTF-8 without it.
    with open(path, "rb") as raw:
        head = raw.read(2)
    if head == b"\x1f\x8b":
        with gzip.open(path) as packed:
            head = packed.read(2)
    if head in (b"\xff\xfe", b"\xfe\xff"):
        raise UserError(
            f'{path} is UTF-16 text (it starts with a UTF-16 byte-order mark, as Excel\'s "Unicode text" '
            'saves): save it as "CSV UTF-8" instead, then run again.'
        )
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _unreadable(path: Path, err: BaseException, what: str) -> UserError:
    if isinstance(err, OSError) and not isinstance(err, (gzip.BadGzipFile, EOFError)):
        return UserError(
            f"{path} could not be opened ({err.strerror or type(err).__name__}). Point --data/--dataset at "
            "readable CSV files."
        )
    return UserError(
        f"{path} could not be read as a UTF-8 CSV ({type(err).__name__}: {err}). A damaged download? "
        f"Fetch it again; is it really {what}?"
    )


def read_zhang_csv(
    path: str | os.PathLike,
    label_names: list | None,
    fields: tuple = ("title", "description"),
    what: str = "AG News",
    clean: Callable = clean_news,
    *,
    lazy: bool = False,
) -> tuple[list, list]:
    """(texts, 0-based labels) from a headerless Zhang et al. CSV: "class 1..K","field",... Every row is checked
    here; lazy: the texts are cleaned when read (texts.CleanOnRead), for a caller that keeps a subset."""
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
                        f"{what} rows look like {example}; fix or remove that row."
                    )
                try:
                    label = int(row[0])
                except ValueError:
                    raise UserError(
                        f"{path}, line {lineno}: the class '{row[0][:30]}' is not a number"
                        + (f" 1..{k} ({classes})." if k else " (1, 2, ...).")
                    ) from None
                if (k and not 1 <= label <= k) or label < 1:
                    raise UserError(
                        f"{path}, line {lineno}: class {label} is outside 1..{k or 'K'}"
                        + (f" ({classes})" if k else "")
                        + ". Fix the label or drop the row."
                    )
                texts.append(row[1:])
                labels.append(label - 1)
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, csv.Error, zlib.error, OSError) as err:
        raise _unreadable(
            path, err, f"{what} ({'ag_news_csv or the Kaggle CSV' if what == 'AG News' else 'a Zhang et al. CSV'})"
        ) from None
    if not texts:
        raise UserError(f"{path} holds no rows.")
    texts = CleanOnRead(texts, clean)
    return (texts if lazy else list(texts)), labels


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
                    f"{path} has no column {', '.join(map(repr, missing))} "
                    f"(its header: {', '.join(map(repr, names))[:300]}). "
                    "Name the text and label columns with --text_column and --label_column "
                    "(several text columns, comma-separated, are joined)."
                )
            t_idx = [lowered.index(c.lower()) for c in text_columns]
            l_idx = lowered.index(label_column.lower())
            for lineno, row in enumerate(reader, start=2):
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != len(names):
                    raise UserError(
                        f"{path}, line {lineno}: {len(row)} fields where the header names {len(names)}. "
                        "A quote left open or a stray comma? Fix or remove that row."
                    )
                value = row[l_idx].strip()
                if not value:
                    raise UserError(
                        f"{path}, line {lineno}: the label column '{names[l_idx]}' is empty. Give every row "
                        "a label, or remove the row."
                    )
                texts.append(clean_review(*(row[i] for i in t_idx)))
                raw.append((value, lineno))
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, csv.Error, zlib.error, OSError) as err:
        raise _unreadable(path, err, "a CSV with a header") from None
    if not texts:
        raise UserError(f"{path} holds a header but no rows.")
    return texts, raw


def label_indices(raw: list, names: list | None, path) -> tuple[list, list]:
    """Raw label values -> (0-based indices, names): each a name or an index 0..K-1; without names, the
    distinct values, sorted, become them."""
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
                "with --label_names (comma-separated, in the order of the indices)."
            )
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
            raise UserError(
                f"data folder {folder}: {name} is a broken symbolic link (to {os.readlink(candidate)}). "
                "Fix the link or copy the file there."
            )
        if candidate.is_dir():
            raise UserError(
                f"data folder {folder}: {name} is a folder, not a file. Expected the {split} split as a CSV file."
            )
        if candidate.is_file():
            return candidate
    found = sorted(p for p in folder.glob(f"{split}*.csv*") if p.suffix in (".csv", ".gz") and p.is_file())
    if len(found) == 1:
        return found[0]
    what = "several files: " + ", ".join(p.name for p in found) if found else "no file"
    raise UserError(
        f"data folder {folder}: looking for the {split} split, found {what}. Expected {split}.csv or "
        f"{split}.csv.gz (the original ag_news_csv layout, the Kaggle CSV, or a CSV with a header)."
    )


def _first_row(path: Path) -> list:
    try:
        with _open_text(path) as f:
            return next(csv.reader(f), [])
    except (UnicodeDecodeError, gzip.BadGzipFile, EOFError, csv.Error, zlib.error, OSError) as err:
        raise _unreadable(path, err, "a CSV") from None


def sniff_layout(path: Path) -> str:
    """'kaggle_ag' (AG News' Kaggle header), 'zhang' (no header: the first field is a class number), or 'header'."""
    first = [c.strip() for c in _first_row(path)]
    if [c.lower() for c in first] == KAGGLE_HEADER:
        return "kaggle_ag"
    return "zhang" if first and _is_int(first[0]) else "header"


def _classes_txt(folder: Path) -> list | None:
    path = folder / "classes.txt"
    text = path.read_text(encoding="utf-8-sig") if path.is_file() else ""
    return [line.strip() for line in text.splitlines() if line.strip()] or None


def load_folder(
    folder: str | os.PathLike, spec: DatasetSpec | None = DATASETS["ag_news"], opts: TextOptions = TextOptions()
) -> TextSplits:
    """The train/test files of a folder, in the layout its first row shows. spec: the known dataset it holds,
    None: whatever the files say (--dataset FOLDER)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise UserError(
            f"data folder {folder} does not exist. Pass a folder holding train.csv and test.csv "
            f"({spec.folder_hint if spec else 'a layout of the ones --help lists'}), "
            "or use --data synthetic / --data hub."
        )
    train_file, test_file = find_split_file(folder, "train"), find_split_file(folder, "test")
    layout = sniff_layout(train_file)
    detail = f"{train_file} + {test_file.name}"
    if layout == "header" and spec is not None and spec.key == "ag_news" and opts.text_columns is None:
        raise UserError(
            f"{train_file} starts with a header row that is not AG News' (Kaggle: Class Index,Title,Description). "
            "For another dataset, pass --dataset with its name, the folder itself (--dataset FOLDER), or csv:PATH "
            "with --text_column and --label_column."
        )
    if layout == "header":
        return load_header_csvs(train_file, test_file, spec, opts, detail, source="folder")
    if opts.text_columns or opts.label_column:
        raise UserError(
            f"{train_file} has no header row (the Zhang et al. layout: class, then the text fields), so "
            "--text_column and --label_column do not apply. Leave them out."
        )
    if spec is None and layout == "kaggle_ag":
        spec = DATASETS["ag_news"]
    names = list(opts.label_names) if opts.label_names else (list(spec.label_names) if spec else _classes_txt(folder))
    fields, what, clean = (spec.zhang_fields, spec.name, spec.clean) if spec else (None, "the dataset", clean_review)
    if fields is None:  # count the fields of the first row
        fields = tuple(f"field{i}" for i in range(1, len(_first_row(train_file) or ["", ""])))
    tr_x, tr_y = read_zhang_csv(train_file, names, fields, what, clean, lazy=True)  # take_subsets cleans the rows kept
    te_x, te_y = read_zhang_csv(test_file, names, fields, what, clean, lazy=True)
    if names is None:
        names = [str(i + 1) for i in range(max(tr_y + te_y) + 1)]
    return TextSplits(
        tr_x,
        tr_y,
        te_x,
        te_y,
        "folder",
        detail,
        full_sizes={"train": len(tr_x), "test": len(te_x)},
        label_names=names,
        name=spec.name if spec else folder.name,
    )


def load_header_csvs(
    train_file: Path,
    test_file: Path | None,
    spec: DatasetSpec | None,
    opts: TextOptions,
    detail: str,
    source: str,
    seed: int = 1234,
    test_fraction: float = 0.1,
) -> TextSplits:
    """A CSV with a header per split (or one file, whose test split is a stratified 10% held out)."""
    imdb_like = [c.strip().lower() for c in _first_row(train_file)] == IMDB_HEADER
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
    name = (
        spec.name
        if spec
        else Path(train_file).name.split(".")[0]
        if test_file is None
        else Path(train_file).parent.name
    )
    return TextSplits(
        tr_x,
        tr_y,
        te_x,
        te_y,
        source,
        detail,
        full_sizes={"train": len(tr_x), "test": len(te_x)},
        label_names=names,
        name=name,
    )


def load_csv(spec_path: str, opts: TextOptions = TextOptions()) -> TextSplits:
    """csv:PATH - a folder with train.csv and test.csv (.gz ok), or one CSV file (10% held out as the test split)."""
    path = Path(spec_path).expanduser()
    if path.is_dir():
        train_file, test_file = find_split_file(path, "train"), find_split_file(path, "test")
        return load_header_csvs(train_file, test_file, None, opts, f"{train_file} + {test_file.name}", source="csv")
    if not path.is_file():
        raise UserError(
            f"--dataset csv:{spec_path}: no such file or folder. Give a CSV file with a header row (its test "
            "split is 10% of the rows, held out), or a folder holding train.csv and test.csv."
        )
    return load_header_csvs(path, None, None, opts, str(path), source="csv")
