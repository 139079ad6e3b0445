"""A dataset's CSV files, opened the same way by every reader: gzip or not, UTF-8 with or without Excel's byte-order
mark, one clear error for UTF-16 or a damaged file; a folder's train and test files; the layout its first row shows."""

from __future__ import annotations

import csv
import gzip
import io
import os
import zlib
from pathlib import Path

from ..errors import UserError

KAGGLE_HEADER = ["class index", "title", "description"]
# What a damaged or foreign file raises while it is read as CSV text: each reader turns it into unreadable(...).
READ_ERRORS = (UnicodeDecodeError, gzip.BadGzipFile, EOFError, csv.Error, zlib.error, OSError)


def open_text(path: Path):
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


def unreadable(path: Path, err: BaseException, what: str) -> UserError:
    if isinstance(err, OSError) and not isinstance(err, (gzip.BadGzipFile, EOFError)):
        return UserError(
            f"{path} could not be opened ({err.strerror or type(err).__name__}). Point --data/--dataset at "
            "readable CSV files."
        )
    return UserError(
        f"{path} could not be read as a UTF-8 CSV ({type(err).__name__}: {err}). A damaged download? "
        f"Fetch it again; is it really {what}?"
    )


def is_int(v: str) -> bool:
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


def first_row(path: Path) -> list:
    try:
        with open_text(path) as f:
            return next(csv.reader(f), [])
    except READ_ERRORS as err:
        raise unreadable(path, err, "a CSV") from None


def sniff_layout(path: Path) -> str:
    """'kaggle_ag' (AG News' Kaggle header), 'zhang' (no header: the first field is a class number), or 'header'."""
    first = [c.strip() for c in first_row(path)]
    if [c.lower() for c in first] == KAGGLE_HEADER:
        return "kaggle_ag"
    return "zhang" if first and is_int(first[0]) else "header"
