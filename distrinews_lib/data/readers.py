"""The headerless CSV of Zhang et al. 2015 (AG News' ag_news_csv, also as the Kaggle CSV, and the review datasets),
and a folder of train and test files in whichever layout its first row shows (a CSV with a header is header_csv.py's,
loaded only for such a folder). Every mistake in a file is named with its path and line.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Callable

from ..errors import UserError
from .csv_files import KAGGLE_HEADER, READ_ERRORS, find_split_file, first_row, open_text, sniff_layout, unreadable
from .texts import DATASETS, CleanOnRead, DatasetSpec, TextOptions, TextSplits, clean_news, clean_review


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
        with open_text(path) as f:
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
    except READ_ERRORS as err:
        raise unreadable(
            path, err, f"{what} ({'ag_news_csv or the Kaggle CSV' if what == 'AG News' else 'a Zhang et al. CSV'})"
        ) from None
    if not texts:
        raise UserError(f"{path} holds no rows.")
    texts = CleanOnRead(texts, clean)
    return (texts if lazy else list(texts)), labels


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
        from .header_csv import load_header_csvs  # a header's layout: only a folder that has one loads its reader

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
        fields = tuple(f"field{i}" for i in range(1, len(first_row(train_file) or ["", ""])))
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
