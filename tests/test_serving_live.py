"""The server as an operator runs it: real uvicorn processes on 127.0.0.1, the command line, the benchmark.

Every process here pays for importing torch, so they are started side by side, not one after another.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from distrinews_lib import LABEL_NAMES
from distrinews_lib.checkpoint import load_checkpoint, predict_proba

from .test_serving import BAD_INPUTS, JSON, TEXTS, assert_matches, bodies, make_checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**extra) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def start(args, log_path: Path, **env) -> subprocess.Popen:
    log = open(log_path, "w")
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=child_env(**env), stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def wait_ready(proc: subprocess.Popen, url: str, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"server at {url} not ready after {STARTUP_TIMEOUT} s:\n{log_path.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@pytest.fixture(scope="module")
def ckpt_path(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("live") / "m.pt")


@pytest.fixture(scope="module")
def loaded(ckpt_path):
    return load_checkpoint(ckpt_path)


@pytest.fixture(scope="module")
def servers(ckpt_path, tmp_path_factory):
    """Both ways of starting the server, side by side: plain uvicorn (checkpoint from the environment)
    and `python -m distrinews_lib.serving --checkpoint`."""
    logs = tmp_path_factory.mktemp("logs")
    p1, p2 = free_port(), free_port()
    procs = {
        "uvicorn": (start(["-m", "uvicorn", "distrinews_lib.serving.app:app", "--host", "127.0.0.1", "--port", str(p1)],
                          logs / "uvicorn.log", DISTRINEWS_CHECKPOINT=str(ckpt_path)), f"http://127.0.0.1:{p1}",
                    logs / "uvicorn.log"),
        "cli": (start(["-m", "distrinews_lib.serving", "--checkpoint", str(ckpt_path), "--port", str(p2)],
                      logs / "cli.log"), f"http://127.0.0.1:{p2}", logs / "cli.log"),
    }
    try:
        for proc, url, log in procs.values():
            wait_ready(proc, url, log)
        yield {name: url for name, (_, url, _) in procs.items()}
    finally:
        for proc, _, log in procs.values():
            stop(proc)


@pytest.fixture(scope="module")
def url(servers):
    return servers["uvicorn"]


@pytest.fixture(scope="module")
def http():
    # Generous timeout: CI machines can be busy, and a slow answer is not what these tests check.
    with httpx.Client(timeout=60) as client:
        yield client


# ----------------------------------------------------------------------------- a running server


@pytest.mark.parametrize("how", ["uvicorn", "cli"])
def test_health_and_predict_on_a_real_server(servers, how, ckpt_path, loaded, http):
    base = servers[how]
    health = http.get(base + "/health").json()
    assert health["status"] == "ok" and health["model_loaded"] and health["labels"] == LABEL_NAMES
    assert health["checkpoint"]["path"] == str(ckpt_path)
    assert health["checkpoint"]["world_size"] == 2 and health["checkpoint"]["data_source"] == "synthetic"
    expected = predict_proba(loaded, TEXTS).tolist()
    for text, p in zip(TEXTS, expected):
        r = http.post(base + "/predict", json={"text": text})
        assert r.status_code == 200, r.text
        assert_matches(r.json(), p)


def test_batch_on_a_real_server_equals_single_results(url, loaded, http):
    r = http.post(url + "/predict/batch", json={"texts": TEXTS})
    assert r.status_code == 200
    results = r.json()["results"]
    for result, p in zip(results, predict_proba(loaded, TEXTS).tolist()):
        assert_matches(result, p)
    for text, batched in zip(TEXTS, results):
        single = http.post(url + "/predict", json={"text": text}).json()
        assert single["label"] == batched["label"]
        assert list(single["all_probabilities"].values()) == pytest.approx(
            list(batched["all_probabilities"].values()), abs=1e-5)


def test_concurrent_requests_on_a_real_server_each_get_their_own_answer(url, loaded, http):
    texts = [TEXTS[i % len(TEXTS)] + " more" * (i % 9) for i in range(64)]

    async def fire():
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=url, limits=limits) as c:
            return await asyncio.gather(*(c.post("/predict", json={"text": t}) for t in texts))

    responses = asyncio.run(fire())
    for r, p in zip(responses, predict_proba(loaded, texts).tolist()):
        assert r.status_code == 200
        assert_matches(r.json(), p)
    batching = http.get(url + "/health").json()["batching"]
    assert batching["batches_run"] >= 1 and batching["mean_batch_size"] >= 1


@pytest.mark.parametrize("path,body,status,words", BAD_INPUTS, ids=[f"{p}:{b[:30]!r}" for p, b, _, _ in BAD_INPUTS])
def test_bad_input_on_a_real_server(url, path, body, status, words, http):
    r = http.post(url + path, content=body, headers=JSON)
    assert r.status_code == status, r.text
    for word in words:
        assert word in r.json()["detail"]


def test_absurd_body_on_a_real_server_is_413(url, http):
    from distrinews_lib.serving.schemas import MAX_BODY_BYTES

    r = http.post(url + "/predict", content=b"x" * (MAX_BODY_BYTES + 1), headers=JSON)
    assert r.status_code == 413


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_fuzzed_bodies_on_a_real_server_never_give_5xx(url, body, http):
    for path in ("/predict", "/predict/batch"):
        r = http.post(url + path, content=body, headers=JSON)
        assert r.status_code < 500, (r.status_code, r.text)


# ----------------------------------------------------------------------------- failing startups


@pytest.fixture(scope="module")
def failed_startups(tmp_path_factory):
    """Four servers that must refuse to start, launched together; their exit codes and output."""
    tmp = tmp_path_factory.mktemp("bad")
    missing, corrupt = tmp / "missing.pt", tmp / "corrupt.pt"
    corrupt.write_bytes(b"PK\x03\x04 this is a truncated zip, not a checkpoint")
    port = str(free_port())  # never bound: each of them must stop before listening
    cases = {
        "cli-missing": (["-m", "distrinews_lib.serving", "--checkpoint", str(missing), "--port", port], {}),
        "cli-corrupt": (["-m", "distrinews_lib.serving", "--checkpoint", str(corrupt), "--port", port], {}),
        "uvicorn-missing": (["-m", "uvicorn", "distrinews_lib.serving.app:app", "--port", port],
                            {"DISTRINEWS_CHECKPOINT": str(missing)}),
        "uvicorn-corrupt": (["-m", "uvicorn", "distrinews_lib.serving.app:app", "--port", port],
                            {"DISTRINEWS_CHECKPOINT": str(corrupt)}),
    }
    procs = {name: subprocess.Popen([sys.executable, *args], cwd=ROOT, env=child_env(**env), text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
             for name, (args, env) in cases.items()}
    out = {}
    for name, proc in procs.items():
        try:
            text, _ = proc.communicate(timeout=STARTUP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
        out[name] = (proc.returncode, text)
    return out, {"missing": missing, "corrupt": corrupt}


@pytest.mark.parametrize("how,what,code", [("cli", "missing", 2), ("cli", "corrupt", 2),
                                           ("uvicorn", "missing", 3), ("uvicorn", "corrupt", 3)])
def test_bad_checkpoint_stops_startup_with_one_clear_message(failed_startups, how, what, code):
    results, paths = failed_startups
    rc, text = results[f"{how}-{what}"]
    assert rc == code, text
    assert str(paths[what]) in text
    assert ("not found" if what == "missing" else "could not be read") in text
    assert "Traceback" not in text
    assert "Uvicorn running" not in text  # it never started listening


# ----------------------------------------------------------------------------- the benchmark


def test_benchmark_quick_mode_runs(tmp_path):
    out = tmp_path / "serving.json"
    r = subprocess.run([sys.executable, "scripts/bench_serving.py", "--quick", "--levels", "1,4", "--duration", "0.5",
                        "--output", str(out)], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report["quick"] is True and report["versions"]["torch"] and report["machine"]["cpu"]
    assert [c["name"] for c in report["configs"]] == ["batched", "baseline (no batching)"]
    for cfg in report["configs"]:
        assert [row["concurrency"] for row in cfg["levels"]] == [1, 4]
        for row in cfg["levels"]:
            assert row["requests"] > 0 and row["errors"] == 0
            assert {"p50", "p95", "p99"} <= set(row["latency_ms"])
    assert set(report["throughput_ratio_batched_over_baseline"]) == {"1", "4"}
    assert out.with_suffix(".png").stat().st_size > 1000
