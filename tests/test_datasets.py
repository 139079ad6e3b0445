"""Every dataset loader on small real samples, label names from the data or a flag, the class balance report,
and bad input refused with one paragraph (exit code 2 from the scripts), never a traceback.

Real samples: a few rows of IMDB (../shared/data/imdb) and of AG News (the sample embedded in the package),
written at test time into temporary folders in each layout the loaders read. Amazon and Yelp polarity have no
local copy here: their layouts are exercised with real IMDB reviews written in those layouts."""

from __future__ import annotations

import csv
import functools
import gzip
import io
from collections import Counter

import pytest

from distrinews_lib.data import header_csv, sources, texts
from distrinews_lib.errors import UserError
from distrinews_lib.training import config

from .helpers import ROOT, SCRIPTS, run_script

IMDB = ROOT.parent / "shared" / "data" / "imdb"
needs_imdb = pytest.mark.skipif(not IMDB.is_dir(), reason=f"real IMDB not present at {IMDB}")


@functools.lru_cache(maxsize=None)
def _all_imdb_rows(split: str) -> tuple:
    with gzip.open(IMDB / f"{split}.csv.gz", "rt", encoding="utf-8", newline="") as f:
        return tuple(csv.DictReader(f))


def imdb_rows(split: str, n: int) -> list:
    """n real IMDB rows (dicts id, rating, label, text), half negative and half positive."""
    rows = _all_imdb_rows(split)
    return list(rows[: n // 2] + rows[-(n - n // 2) :])  # the files are sorted: negatives, then positives


def write_csv(path, rows, header=None, gz=False, bom=False):
    buf = io.StringIO()
    w = csv.writer(buf)
    if header:
        w.writerow(header)
    w.writerows(rows)
    text = ("\ufeff" if bom else "") + buf.getvalue()
    if gz:
        with gzip.open(path, "wt", encoding="utf-8", newline="") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8", newline="")
    return path


@pytest.fixture(scope="module")
def imdb_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("imdb")
    for split, n in (("train", 40), ("test", 20)):
        rows = imdb_rows(split, n)
        write_csv(
            folder / f"{split}.csv.gz",
            [[r["id"], r["rating"], r["label"], r["text"]] for r in rows],
            header=texts.IMDB_HEADER,
            gz=True,
        )
    return folder


# ---------------------------------------------------------------- known datasets from folders


@needs_imdb
def test_imdb_csv_folder_gives_negative_positive_and_clean_text(imdb_folder):
    s = sources.load_dataset_splits("imdb", str(imdb_folder))
    assert s.label_names == ["negative", "positive"] and s.name == "IMDB"
    assert (len(s.train_texts), len(s.test_texts)) == (40, 20)
    assert Counter(s.train_labels) == {0: 20, 1: 20}
    assert not any("<br" in t for t in s.train_texts), "IMDB's <br /> line breaks are spaces"
    assert "negative 20 (50.0%), positive 20 (50.0%)" in s.balance()


@needs_imdb
def test_a_folder_given_as_dataset_is_recognised_by_its_header(imdb_folder):
    dataset = sources.resolve_dataset(str(imdb_folder))
    assert dataset.startswith("folder:")
    s = sources.load_dataset_splits(dataset, sources.resolve_source("auto", dataset))
    assert s.label_names == ["negative", "positive"] and s.title.startswith("IMDB")


def test_a_headerless_folder_is_named_by_its_dataset_or_by_its_class_numbers():
    s = sources.load_dataset_splits("ag_news", str(sources.EMBEDDED_DIR), 80, 40, seed=1)
    assert s.label_names == ["World", "Sports", "Business", "Sci/Tech"]
    assert Counter(s.train_labels) == {0: 20, 1: 20, 2: 20, 3: 20}
    # --dataset FOLDER does not guess which dataset it is: without classes.txt the classes keep their numbers
    anon = sources.load_dataset_splits(sources.resolve_dataset(str(sources.EMBEDDED_DIR)), "folder", 80, 40, seed=1)
    assert anon.label_names == ["1", "2", "3", "4"] and anon.train_labels == s.train_labels


@needs_imdb
@pytest.mark.parametrize("dataset, fields", [("yelp_polarity", 1), ("amazon_polarity", 2)])
def test_zhang_layouts_of_yelp_and_amazon_polarity(tmp_path, dataset, fields):
    for split in (
        "train",
        "test",
    ):  # real reviews in the layout of yelp_review_polarity_csv / amazon_review_polarity_csv
        rows = imdb_rows(split, 10)
        body = [
            [str(int(r["label"]) + 1), *(["A title"] if fields == 2 else []), r["text"].replace("\n", "\\n")]
            for r in rows
        ]
        write_csv(tmp_path / f"{split}.csv", body)
    s = sources.load_dataset_splits(dataset, str(tmp_path))
    assert s.label_names == ["negative", "positive"]
    assert Counter(s.train_labels) == {0: 5, 1: 5}
    if fields == 2:
        assert all(t.startswith("A title. ") for t in s.train_texts)


def test_a_zhang_folder_with_classes_txt_takes_its_names(tmp_path):
    for split in ("train", "test"):
        write_csv(tmp_path / f"{split}.csv", [["1", "it was bad"], ["2", "it was good"], ["3", "it was fine"]])
    (tmp_path / "classes.txt").write_text("bad\ngood\nfine\n")
    s = sources.load_dataset_splits(sources.resolve_dataset(str(tmp_path)), "folder")
    assert s.label_names == ["bad", "good", "fine"] and s.train_labels == [0, 1, 2]


# ---------------------------------------------------------------- csv:PATH


@needs_imdb
def test_csv_folder_with_named_columns_and_text_labels(tmp_path):
    for split in ("train", "test"):
        rows = imdb_rows(split, 12)
        write_csv(
            tmp_path / f"{split}.csv",
            [[r["rating"], "neg" if r["label"] == "0" else "pos", "Title", r["text"]] for r in rows],
            header=["stars", "verdict", "headline", "body"],
        )
    opts = texts.TextOptions(text_columns=("headline", "body"), label_column="verdict")
    s = sources.load_dataset_splits(sources.resolve_dataset(f"csv:{tmp_path}"), "csv", opts=opts)
    assert s.label_names == ["neg", "pos"] and s.source == "csv"
    assert Counter(s.train_labels) == {0: 6, 1: 6} and s.train_texts[0].startswith("Title. ")
    named = texts.TextOptions(text_columns=("body",), label_column="verdict", label_names=("pos", "neg"))
    flipped = sources.load_dataset_splits(sources.resolve_dataset(f"csv:{tmp_path}"), "csv", opts=named)
    assert flipped.label_names == ["pos", "neg"] and flipped.train_labels == [1 - y for y in s.train_labels]


@needs_imdb
def test_csv_single_file_holds_out_a_stratified_tenth_and_reads_a_bom(tmp_path):
    rows = imdb_rows("train", 100)
    path = write_csv(
        tmp_path / "reviews.csv", [[r["text"], r["label"]] for r in rows], header=["text", "label"], bom=True
    )
    s = sources.load_dataset_splits(
        sources.resolve_dataset(f"csv:{path}"), "csv", opts=texts.TextOptions(label_names=("negative", "positive"))
    )
    assert (len(s.train_texts), len(s.test_texts)) == (90, 10)
    assert Counter(s.test_labels) == {0: 5, 1: 5} and not set(s.test_texts) & set(s.train_texts)
    assert "held out" in s.detail and s.label_names == ["negative", "positive"]


def test_numeric_labels_without_names_are_named_by_their_values(tmp_path):
    write_csv(tmp_path / "train.csv", [["good", "2"], ["bad", "1"], ["fine", "10"]], header=["text", "label"])
    write_csv(tmp_path / "test.csv", [["ok", "2"]], header=["text", "label"])
    s = header_csv.load_csv(str(tmp_path))
    assert s.label_names == ["1", "2", "10"] and s.train_labels == [1, 0, 2] and s.test_labels == [1]


# ---------------------------------------------------------------- bad input: one paragraph, never a traceback


def test_bad_input_gets_a_clear_message(tmp_path):
    header = ["text", "label"]
    write_csv(tmp_path / "train.csv", [["fine", "0"], ["bad", "1"]], header=header)
    write_csv(tmp_path / "test.csv", [["so so", "2"]], header=header)
    opts = texts.TextOptions(label_names=("negative", "positive"))
    with pytest.raises(UserError, match=r"test\.csv, line 2: the label '2' is not one of the 2 label names"):
        header_csv.load_csv(str(tmp_path), opts)
    with pytest.raises(UserError, match=r"has no column 'review'.*--text_column"):
        header_csv.load_csv(str(tmp_path), texts.TextOptions(text_columns=("review",)))
    with pytest.raises(UserError, match="not a dataset the course knows"):
        sources.resolve_dataset("imbd")
    with pytest.raises(UserError, match="no such file or folder"):
        sources.resolve_dataset(f"csv:{tmp_path / 'nope.csv'}")
    utf16 = tmp_path / "u16.csv"
    utf16.write_bytes("text,label\nfine,0\n".encode("utf-16"))
    with pytest.raises(UserError, match="UTF-16"):
        header_csv.load_csv(str(utf16))
    with pytest.raises(UserError, match="AG News only"):
        sources.resolve_source("embedded", "imdb")
    with pytest.raises(UserError, match="--label_names gives 3 names"):
        sources.load_dataset_splits("ag_news", "embedded", opts=texts.TextOptions(label_names=("a", "b", "c")))


def test_label_names_flag_is_checked_like_every_flag():
    with pytest.raises(UserError, match="more than once"):
        config.parse("t", ["--label_names", "a,b,a", "--config", "cpu_smoke"])
    with pytest.raises(UserError, match="at least two classes"):
        config.parse("t", ["--label_names", "solo", "--config", "cpu_smoke"])
    cfg = config.parse("t", ["--dataset", "imdb", "--label_names", "neg, pos", "--config", "cpu_smoke"])
    assert texts.TextOptions.from_config(cfg).label_names == ("neg", "pos")


def test_a_bad_dataset_from_the_script_is_one_paragraph_and_exit_code_2(tmp_path):
    write_csv(tmp_path / "train.csv", [["fine", "0"]], header=["text", "label"])
    r = run_script(
        [
            SCRIPTS / "train_single.py",
            "--config",
            "cpu_smoke",
            "--dataset",
            f"csv:{tmp_path / 'train.csv'}",
            "--text_column",
            "review",
            "--output",
            tmp_path / "run",
            "--no-progress",
        ],
        timeout=120,
    )
    assert r.returncode == 2, r.stdout[-1500:] + r.stderr[-1500:]
    assert "has no column 'review'" in " ".join(r.stderr.split()) and "Traceback" not in r.stderr
