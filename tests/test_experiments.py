"""Experiment YAMLs (configs/experiments) are full, valid configurations; the runner and the plots work on the
committed experiments (experiments/<name>/, from real runs)."""

from __future__ import annotations

import json

import pytest

from distrinews_lib.training import config

from .helpers import ROOT, SCRIPTS, run_script

EXPERIMENTS = sorted((ROOT / "configs" / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_experiment_is_a_full_valid_config(path):
    _, values = config.read_preset(str(path), ddp=True)
    for key in (
        "dataset",
        "data",
        "model",
        "tokenizer",
        "epochs",
        "batch_size",
        "lr",
        "max_length",
        "amp",
        "processes",
        "backend",
        "seed",
    ):
        assert key in values, f"{path.name} does not set {key}: an experiment states everything it depends on"
    cfg = config.parse("t", ["--config", str(path)], ddp=True)
    assert cfg.experiment == path.stem and cfg.output == f"experiments/{path.stem}"
    assert cfg.checkpoint == f"experiments/{path.stem}/model.pt"
    assert cfg.batch_size * cfg.processes == 32, "the 1- and 2-process runs compare at the same global batch"


def test_an_experiment_launched_with_the_wrong_number_of_processes_is_refused(tmp_path):
    r = run_script(
        [
            SCRIPTS / "train_single.py",
            "--config",
            ROOT / "configs" / "experiments" / "agnews_custom_2p.yaml",
            "--output",
            tmp_path,
            "--checkpoint",
            tmp_path / "m.pt",
        ],
        timeout=120,
    )
    assert r.returncode == 2 and "asks for 2 process(es)" in " ".join(r.stderr.split()), r.stderr[-1500:]
    assert "run_experiment.py agnews_custom_2p" in " ".join(r.stderr.split())


def test_the_runner_lists_what_each_experiment_runs():
    r = run_script([SCRIPTS / "run_experiment.py", "--list"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert "imdb_custom_2p: OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 scripts/train_ddp.py" in r.stdout
    assert "imdb_custom_1p: OMP_NUM_THREADS=1 python scripts/train_single.py" in r.stdout


def test_the_committed_experiments_plot_and_meet_their_targets(tmp_path):
    folders = [p.parent for p in (ROOT / "experiments").glob("*/metrics.json")]
    if not folders:
        pytest.skip("no experiment has been run in this checkout")
    r = run_script([SCRIPTS / "plot_results.py", "--out", tmp_path], timeout=120)
    assert r.returncode == 0, r.stderr
    for name in ("accuracy_per_epoch.png", "time_per_epoch.png", "scaling.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    summary = json.loads((tmp_path / "summary.json").read_text())
    pairs = {(p["single"], p["multi"]) for p in summary["scaling"]}
    assert {
        ("agnews_custom_1p", "agnews_custom_2p"),
        ("agnews_tiny_1p", "agnews_tiny_2p"),
        ("imdb_custom_1p", "imdb_custom_2p"),
    } <= pairs
    record = json.loads((ROOT / "benchmarks" / "accuracy.json").read_text())
    assert record["headline"] and record["custom_hash"]["all_met"], "the older sections are kept, the new one met"


@pytest.mark.bench
@pytest.mark.slow
def test_the_speedup_measurement_runs_the_real_scripts(tmp_path):
    r = run_script(
        [
            SCRIPTS / "measure_speedup.py",
            "--quick",
            "--pairs",
            "agnews_custom_1p",
            "--record",
            tmp_path / "speedup.json",
        ],
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    section = json.loads((tmp_path / "speedup.json").read_text())["custom_hash_speedup"]
    (pair,) = section["pairs"]
    assert pair["single"] == "agnews_custom_1p" and pair["multi"] == "agnews_custom_2p" and pair["speedup"] > 0
    assert pair["allreduce_mb_per_step"] == pytest.approx(17.9, abs=0.2)  # 4.47M fp32 gradients per step
