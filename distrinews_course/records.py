"""A chapter's record: its key figures, written where scripts/run_course.py reads them for its summary table and
the course's site (one JSON file per chapter, named after the notebook).

    from distrinews_course.records import write_record, read_record
    write_record("01_single_gpu_baseline", {"accuracy": 0.86, ...}, headline="accuracy 86% on ...")   # last cell
    earlier = read_record("02_ddp_training")          # a later chapter reading an earlier one's figures, or None

The folder is $DISTRINEWS_COURSE_RECORDS (run_course.py sets it to runs/<timestamp>/records/), else
outputs/course/ (a chapter run by hand in Jupyter).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from distrinews_lib.files import atomic_write_json


def records_dir() -> Path:
    return Path(os.environ.get("DISTRINEWS_COURSE_RECORDS", "outputs/course"))


def write_record(notebook: str, figures: dict, headline: str) -> dict:
    """Write the chapter's record; returns it. `notebook` is the chapter's file name without .ipynb."""
    record = {"notebook": notebook, **figures, "headline": headline}
    atomic_write_json(records_dir() / f"{notebook}.json", record)
    print(headline)
    return record


def read_record(notebook: str) -> dict | None:
    """An earlier chapter's record from this course run (or the last one run by hand), or None."""
    path = records_dir() / f"{notebook}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
