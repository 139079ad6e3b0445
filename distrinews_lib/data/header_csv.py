"""CSV files with a header row: a column of texts (or several, joined) and a column of labels, each a name or an
index. csv:PATH (one file, its test split held out, or a folder of train and test files), a folder whose files have a
header (IMDB's layout is recognised), and the labels of a hub dataset that are not class indices.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from ..errors import UserError
from .csv_files import READ_ERRORS, find_split_file, first_row, is_int, open_text, unreadable
from .texts import DATASETS, IMDB_HEADER, DatasetSpec, TextOptions, TextSplits, balanced_subset, clean_review


def read_header_csv(path: str | os.PathLike, text_columns: tuple, label_column: str) -> tuple[list, list]:
    """(texts, [(raw label, line number)]) from a CSV with a header row; the named columns must be there."""
    path = Path(path)
    texts, raw = [], []
    try:
        with open_text(path) as f:
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
    except READ_ERRORS as err:
        raise unreadable(path, err, "a CSV with a header") from None
    if not texts:
        raise UserError(f"{path} holds a header but no rows.")
    return texts, raw


def label_indices(raw: list, names: list | None, path) -> tuple[list, list]:
    """Raw label values -> (0-based indices, names): each a name or an index 0..K-1; without names, the
    distinct values, sorted, become them."""
    if names is None:
        values = sorted({v for v, _ in raw}, key=lambda v: (0, int(v), "") if is_int(v) else (1, 0, v))
        names = values
    lookup = {n: i for i, n in enumerate(names)}
    lower = {n.lower(): i for i, n in enumerate(names)}
    out = []
    for value, lineno in raw:
        i = lookup.get(value, lower.get(value.lower()))
        if i is None and is_int(value) and 0 <= int(value) < len(names):
            i = int(value)
        if i is None:
            raise UserError(
                f"{path}, line {lineno}: the label '{value[:40]}' is not one of the {len(names)} label names "
                f"({', '.join(names)[:200]}) nor an index 0..{len(names) - 1}. Fix that row, or name every class "
                "with --label_names (comma-separated, in the order of the indices)."
            )
        out.append(i)
    return out, list(names)


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
    imdb_like = [c.strip().lower() for c in first_row(train_file)] == IMDB_HEADER
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
