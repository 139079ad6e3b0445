"""The serving benchmark's LitServe competitor and its --litserve and --int8 modes.

The competitor in-process (same answers as our classifier) runs by default; the end-to-end --quick runs of
scripts/bench_serving.py are marked `bench` (pytest -m bench).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from distrinews_lib.serving.inference import load_checkpoint, predict_proba

from .test_serving import TEXTS, make_checkpoint
from .test_serving_live import child_env

ROOT = Path(__file__).resolve().parent.parent
litserve = pytest.importorskip("litserve", reason="LitServe is a benchmark dependency (requirements-dev.txt)")


@pytest.fixture(scope="module")
def ckpt_path(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("bench") / "m.pt")


def test_litserve_competitor_serves_what_our_server_serves(ckpt_path):
    """The LitAPI decodes our request model, predicts a whole batch with our classifier, and answers our response
    model: the race compares engines, not models."""
    from distrinews_course.bench.serving_litserve import DistriNewsLitAPI
    from distrinews_lib.serving.schemas import Prediction, PredictRequest

    api = DistriNewsLitAPI(str(ckpt_path), torch_threads=0, max_batch_size=32, batch_timeout=0.002)
    api.setup("cpu")
    texts = [api.decode_request(PredictRequest(text=t)) for t in TEXTS]
    answers = [api.encode_response(y) for y in api.predict(texts)]
    expected = predict_proba(load_checkpoint(ckpt_path), TEXTS)
    assert len(answers) == len(TEXTS) and api.max_batch_size == 32
    for answer, probs in zip(answers, expected.tolist()):
        Prediction.model_validate(answer)
        assert list(answer["all_probabilities"].values()) == pytest.approx(probs, abs=1e-5)


def test_litserve_competitor_refuses_an_int8_model_that_drifts(ckpt_path, tmp_path):
    """It loads through the server's own check (loading.check_for_serving), so it refuses what our server refuses."""
    from distrinews_course.bench.serving_litserve import DistriNewsLitAPI
    from distrinews_lib.serving.inference import CheckpointError

    from .test_serving_checkpoints import tampered
    from .test_serving_int8 import outlier_weights

    path = tampered(ckpt_path, tmp_path / "outliers.pt", outlier_weights)
    api = DistriNewsLitAPI(str(path), torch_threads=0, quantize="int8", max_batch_size=32, batch_timeout=0.002)
    with pytest.raises(CheckpointError, match="would change checkpoint .* answers too much"):
        api.setup("cpu")


def live_processes_with(words: list[str]) -> list[str]:
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(w in text for w in words):
            out.append(text)
    return out


@pytest.mark.bench
def test_litserve_race_quick_mode_runs_and_leaves_nothing_behind(tmp_path, ckpt_path):
    out = tmp_path / "race.json"
    r = subprocess.run(
        [
            sys.executable,
            "scripts/bench_serving.py",
            "--litserve",
            "--quick",
            "--levels",
            "1,4",
            "--checkpoint",
            str(ckpt_path),
            "--output",
            str(out),
        ],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report["quick"] is True and report["versions"]["litserve"] and report["provenance"]["git_commit"]
    assert [row["concurrency"] for row in report["levels"]] == [1, 4]
    for row in report["levels"]:
        for name in ("ours", "litserve"):
            assert row[name]["answered"] > 0 and row[name]["failed"] == 0, row[name]
            assert {"p50", "p99"} <= set(row[name]["latency_answered_ms"]) and row[name]["server_cpu_s"] > 0
    assert set(report["headline"]["targets"]) == {"1", "4"}
    for name, competitor in report["competitors"].items():
        port = competitor["command"][competitor["command"].index("--port") + 1]
        assert not live_processes_with([str(ckpt_path), port]), f"{name} left processes behind"


@pytest.mark.bench
def test_int8_quick_mode_runs(tmp_path, ckpt_path):
    out = tmp_path / "int8.json"
    r = subprocess.run(
        [
            sys.executable,
            "scripts/bench_serving.py",
            "--int8",
            "--quick",
            "--data",
            "embedded",
            "--checkpoint",
            str(ckpt_path),
            "--output",
            str(out),
        ],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    (row,) = report["checkpoints"]
    assert report["data"]["test_texts"] == row["texts"] == 256
    assert 0 <= row["accuracy"]["fp32"] <= 1 and 0 <= row["accuracy"]["int8"] <= 1
    assert row["quantization"]["linear_layers"] > 0 and row["model_only"]["speedup"] > 0
    (level,) = row["serving"]
    assert level["concurrency"] == 16 and level["fp32"]["answered"] > 0 and level["int8"]["answered"] > 0
    assert "throughput_at_16" in row["targets"] and "accuracy" in row["targets"]


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--quantize", "int8"], "--quantize goes with --litserve"),
        (["--litserve", "--int8"], "pick one"),
        (["--checkpoint", "a.pt", "--checkpoint", "b.pt"], "several --checkpoint go with --int8 only"),
    ],
)
def test_bench_command_line_refuses_mixed_modes(argv, words, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_serving", ROOT / "scripts" / "bench_serving.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with pytest.raises(SystemExit) as stopped:
        bench.parse_args(argv)
    assert stopped.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.slow
def test_small_race_runs_inside_a_running_event_loop_and_stops_both_servers(ckpt_path):
    """Chapter 10 races from a Jupyter kernel, which already runs an asyncio loop: small_race then runs the load
    generator in a thread of its own, and both servers are gone afterwards."""
    import asyncio

    from distrinews_course.bench.serving_race import small_race

    async def from_a_loop():
        return small_race(ckpt_path, [1, 4], duration=0.4, warmup=0.1, rounds=1)

    rows = asyncio.run(from_a_loop())
    assert [row["concurrency"] for row in rows] == [1, 4]
    for row in rows:
        assert row["ours"]["answered"] > 0 and row["litserve"]["answered"] > 0, row
        assert row["ours"]["failed"] == row["litserve"]["failed"] == 0, row
    assert not live_processes_with(["distrinews_lib", str(ckpt_path)]), "a server was left running"
