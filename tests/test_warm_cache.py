"""Warm-cache hub offline (HPC compute nodes): with HF_HUB_OFFLINE=1 (or HF_DATASETS_OFFLINE=1) and a cache that
holds them, `--data hub` / `--dataset <hub id>` and `--model <hub id>` load from the cache without any request;
an empty cache stops with the cache's path and the command that fills it on a login node.

The cache is real and small, built in a temporary HF_HOME (tests/hf_cache.py): a few hundred real IMDB reviews
and AG News rows prepared by `datasets`' own builder, and a tiny DistilBERT saved under a hub id."""

from __future__ import annotations

import pytest

from distrinews_lib import hub
from distrinews_lib.data import hub_data, sources
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.errors import UserError
from distrinews_lib.models.build import build_model
from distrinews_lib.training.config import RunConfig

from .helpers import SCRIPTS, run_script
from .hf_cache import cache_dataset, cache_model
from .test_datasets import IMDB, imdb_rows, needs_imdb

MODEL_ID = "distrinews-test/tiny-distilbert"


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("hf_home")
    ag = sources.load_embedded()
    cache_dataset(
        home / "datasets",
        "fancyzhx/ag_news",
        {"train": (ag.train_texts[:200], ag.train_labels[:200]), "test": (ag.test_texts[:80], ag.test_labels[:80])},
        ag.label_names,
    )
    if IMDB.is_dir():
        cache_dataset(
            home / "datasets",
            "stanfordnlp/imdb",
            {
                split: ([r["text"] for r in rows], [int(r["label"]) for r in rows])
                for split, rows in (("train", imdb_rows("train", 200)), ("test", imdb_rows("test", 100)))
            },
            ["neg", "pos"],
        )  # the hub's own ClassLabel names; the course shows negative/positive
        rows = imdb_rows("train", 40)  # real reviews in amazon_polarity's columns (label, title, content)
        cache_dataset(
            home / "datasets",
            "fancyzhx/amazon_polarity",
            {
                "train": ([("Review", r["text"]) for r in rows[:30]], [int(r["label"]) for r in rows[:30]]),
                "test": ([("Review", r["text"]) for r in rows[30:]], [int(r["label"]) for r in rows[30:]]),
            },
            ["negative", "positive"],
            text_columns=("title", "content"),
        )
    model, tokenizer, _ = build_model(RunConfig(model="tiny", seed=0), AG_NEWS_LABELS)
    cache_model(home / "hub", MODEL_ID, model, tokenizer)
    return home


@pytest.fixture
def offline(hf_home, monkeypatch):
    for var in ("HF_DATASETS_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "DISTRINEWS_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_probe(*a, **k):
        raise AssertionError("offline: the hub must not be probed")

    monkeypatch.setattr(hub, "hub_reachable", no_probe)
    monkeypatch.setattr(sources, "hub_reachable", no_probe)
    monkeypatch.setattr(hub_data, "hub_reachable", no_probe)
    return hf_home


def test_ag_news_loads_from_the_cache_without_a_request(offline):
    assert hub.dataset_cached("fancyzhx/ag_news")
    s = sources.load_dataset_splits("ag_news", sources.resolve_source("hub", "ag_news"))
    assert (len(s.train_texts), len(s.test_texts)) == (200, 80) and s.source == "hub"
    assert s.label_names == ["World", "Sports", "Business", "Sci/Tech"] and "from the cache" in s.detail
    assert s.train_texts[0] == sources.load_embedded().train_texts[0]


@needs_imdb
def test_imdb_by_name_and_by_hub_id_from_the_cache_with_datasets_offline_only(offline, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert sources.resolve_source("auto", "imdb") == "hub"  # auto: the cache, since the hub is not to be asked
    s = sources.load_dataset_splits("imdb", "hub", num_samples=100, seed=3)
    assert s.label_names == ["negative", "positive"] and len(s.train_texts) == 100 and len(s.test_texts) == 100
    assert s.class_counts("train") == [50, 50]
    by_id = sources.load_dataset_splits(sources.resolve_dataset("hub:stanfordnlp/imdb"), "hub")
    assert by_id.label_names == ["negative", "positive"]  # a known dataset's id gets its known names
    generic = hub_data.load_hub("stanfordnlp/imdb", spec=None)
    assert generic.test_texts == by_id.test_texts


@needs_imdb
def test_amazon_polarity_joins_title_and_content(offline):
    s = sources.load_dataset_splits("amazon_polarity", sources.resolve_source("auto", "amazon_polarity"))
    assert s.label_names == ["negative", "positive"] and len(s.train_texts) == 30
    assert all(t.startswith("Review. ") for t in s.train_texts)


def test_a_model_loads_from_the_cache_by_its_hub_id(offline):
    model, tokenizer, info = build_model(RunConfig(model=MODEL_ID), ["negative", "positive"])
    assert info.kind == "hub" and model.config.num_labels == 2 and model.config.id2label[1] == "positive"


def test_an_empty_cache_names_the_cache_and_the_download_command(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError) as err:
        hub_data.load_hub("stanfordnlp/imdb")
    text = " ".join(str(err.value).split())
    assert str(tmp_path / "empty" / "datasets") in text and "load_dataset('stanfordnlp/imdb')" in text
    assert "login node" in text and "HF_HUB_OFFLINE=1" in text
    with pytest.raises(UserError) as err:
        build_model(RunConfig(model="distrinews-test/not-there"), AG_NEWS_LABELS)
    text = " ".join(str(err.value).split())
    assert str(tmp_path / "empty" / "hub") in text and "hf download distrinews-test/not-there" in text


@pytest.mark.slow
@needs_imdb
def test_training_offline_from_the_warm_cache_end_to_end(hf_home, tmp_path):
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "DISTRINEWS_DATA_DIR": ""}
    r = run_script(
        [
            SCRIPTS / "train_single.py",
            "--config",
            "cpu_smoke",
            "--dataset",
            "imdb",
            "--data",
            "hub",
            "--model",
            MODEL_ID,
            "--epochs",
            "1",
            "--max_length",
            "32",
            "--no-progress",
            "--threads",
            "1",
            "--output",
            tmp_path / "run",
            "--checkpoint",
            tmp_path / "m.pt",
        ],
        env=env,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "from the cache" in r.stdout and f"model: {MODEL_ID} (hub" in r.stdout
    assert "labels negative, positive" in r.stdout
    empty = run_script(
        [
            SCRIPTS / "train_single.py",
            "--config",
            "cpu_smoke",
            "--dataset",
            "imdb",
            "--data",
            "hub",
            "--model",
            "custom",
            "--output",
            tmp_path / "run2",
            "--no-progress",
        ],
        env={**env, "HF_HOME": str(tmp_path / "empty")},
        timeout=240,
    )
    assert empty.returncode == 2 and "Traceback" not in empty.stderr
    assert "login node" in empty.stderr and str(tmp_path / "empty") in " ".join(empty.stderr.split())
