"""gpu_check's stages read: what each stage's output says (the parsers of pytest's summary, a training run's log
and metrics, bench_train's JSON), and the serving stage, which starts the API on the GPU, asks it and stops it.
scripts/gpu_check.py is the entry point; its docstring lists the stages."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from .. import ROOT

REPO = ROOT  # the checkout the server runs from
CUDA_SKIP = re.compile(r"needs (a )?CUDA", re.I)  # a skip reason that must not appear on a CUDA machine


def parse_pytest(stage, res, out) -> dict:
    summary = re.findall(r"(\d+) (passed|failed|skipped|error|errors|deselected)", res.output)
    counts = {k.rstrip("s") if k.startswith("error") else k: int(n) for n, k in summary}
    skipped = [line for line in res.output.splitlines() if line.startswith("SKIPPED")]
    wrongly = [line for line in skipped if CUDA_SKIP.search(line)]
    ok = res.ok and not wrongly and counts.get("passed", 0) > 0
    return {
        "status": "ok" if ok else "FAILED",
        "counts": counts,
        "skipped": skipped,
        "skipped_for_want_of_cuda": wrongly,
    }


def parse_training(stage, res, out) -> dict:
    text = res.output
    if stage.name == "train_bf16" and res.returncode == 2 and "no bf16 in hardware" in text:
        return {
            "status": "ok",
            "refused_as_designed": True,
            "message": next((line for line in text.splitlines() if "bf16" in line), ""),
        }
    metrics = Path(stage.out) / "metrics.json"
    if not res.ok or not metrics.is_file():
        return {"status": "FAILED"}
    m = json.loads(metrics.read_text())
    ep = m["epochs"][-1]
    mfu = re.findall(r"MFU ([\d.]+)%", text)
    amp = re.search(r"\| ((?:bf16|fp16|AMP)[^|\n]*)$", text, re.M)
    got = {
        "status": "ok",
        "samples_per_s": ep["samples_per_s"],
        "tokens_per_s": ep["tokens_per_s"],
        "epoch_seconds": ep["epoch_time_s"],
        "val_accuracy": ep["val_accuracy"],
        "train_texts": m["data"]["train_size"],
        "mfu": float(mfu[-1]) / 100 if mfu else None,
        "amp": amp.group(1).strip() if amp else None,
        "model": m["model"]["resolved"],
        "data": m["data"]["source"],
        "world_size": m["ddp"]["world_size"],
        "backend": m["ddp"]["backend"],
        "checkpoint": str(Path(stage.out) / "model.pt"),
    }
    if stage.name == "ddp_nccl":
        same = re.search(r"parameters identical on all (\d+) ranks: (True|False)", text)
        got["params_identical"] = bool(same and same.group(2) == "True")
        if got["backend"] != "nccl" or not got["params_identical"]:
            got["status"] = "FAILED"
    return got


def parse_bench(stage, res, out) -> dict:
    path = Path(stage.out)
    if not res.ok or not path.is_file():
        return {"status": "FAILED"}
    b = json.loads(path.read_text())
    return {"status": "ok", "json": str(path), "headline": b.get("headline"), "targets": b.get("targets")}


def parse_graphs(stage, res, out) -> dict:
    path = Path(stage.out)
    if not path.is_file():
        return {"status": "FAILED"}
    g = json.loads(path.read_text())
    return {"status": "ok" if res.ok and g.get("ok") else "FAILED", "json": str(path), "graphs": g}


def parse_course(stage, res, out) -> dict:
    """run_course.py's summary.json as the course's GPU record (benchmarks/course_gpu_<machine>.json): per chapter
    its status, seconds and key figures, and the machine, preset and processes it ran with."""
    from . import provenance

    runs = sorted(Path(stage.cmd[stage.cmd.index("--runs-dir") + 1]).glob("*/summary.json"))
    if not runs:
        return {"status": "FAILED", "why": "run_course.py wrote no summary.json"}
    summary = json.loads(runs[-1].read_text())
    chapters = [
        {
            "chapter": nb["name"],
            "status": nb["status"],
            "seconds": round(nb["seconds"], 1) if nb.get("seconds") is not None else None,
            "key_figures": nb.get("headline", ""),
            "record": nb.get("record") or {},
            **({"error": nb["error"]} if nb.get("error") else {}),
        }
        for nb in summary["notebooks"]
    ]
    earlier = json.loads(Path(stage.out).read_text()) if Path(stage.out).is_file() else {}
    ran = {c["chapter"] for c in chapters}
    parts = [*earlier.get("parts", []), {"chapters": sorted(ran), "seconds": summary["seconds"]}]
    chapters = sorted([c for c in earlier.get("chapters", []) if c["chapter"] not in ran] + chapters,
                      key=lambda c: c["chapter"])  # fmt: skip
    n_ok = sum(c["status"] == "ok" for c in chapters)
    record = {
        "benchmark": "course_gpu",
        **provenance.provenance(),
        "device": summary["machine"].get("gpus") or summary["machine"],
        "preset": summary["preset"],
        "nproc": summary["nproc"],
        "chapters_ok": f"{n_ok} of {len(chapters)}",
        "seconds": sum(p["seconds"] for p in parts),
        "parts": parts,  # one per run_course.py launch (a device call may not hold the whole course)
        "note": "one GPU, offline: the embedded AG News sample and the tiny model; a chapter that compares 1 process "
        "with 2 runs as on Colab's single GPU (it says so in its first cell)",
        "chapters": chapters,
    }
    Path(stage.out).parent.mkdir(parents=True, exist_ok=True)
    Path(stage.out).write_text(json.dumps(provenance.as_jsonable(record), indent=1))
    ok = res.ok and all(c["status"] == "ok" for c in chapters if c["chapter"] in ran)
    return {"status": "ok" if ok else "FAILED", "json": stage.out, "chapters_ok": record["chapters_ok"]}


PARSERS = {
    "graphs": parse_graphs,
    "notebooks": parse_course,
    "cuda_tests": parse_pytest,
    "train_fp16": parse_training,
    "train_bf16": parse_training,
    "ddp_nccl": parse_training,
    "bench_train": parse_bench,
}


def serving_stage(stage, run_dir: Path, texts: list, device: str = "cuda") -> dict:
    """Start the server on `device` in the background, ask it, stop it."""
    from distrinews_lib.distributed import free_port

    checkpoint = Path(stage.out)
    if not checkpoint.is_file():
        return {"status": "FAILED", "why": f"no checkpoint at {checkpoint} (train_fp16 failed or did not run)"}
    port = free_port()
    log = open(run_dir / "serving.log", "w")
    cmd = [
        sys.executable,
        "-m",
        "distrinews_lib.serving",
        "--checkpoint",
        str(checkpoint),
        "--device",
        device,
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    out = {"command": " ".join(cmd), "log": str(run_dir / "serving.log")}
    try:
        deadline = time.time() + stage.timeout
        health = None
        while time.time() < deadline and proc.poll() is None:
            try:
                health = http_json(f"{base}/health")
                if health.get("status") == "ok":
                    break
            except OSError:
                time.sleep(0.5)
        if not health or health.get("status") != "ok":
            return {
                **out,
                "status": "FAILED",
                "why": f"no healthy server within {stage.timeout:.0f} s (exit code {proc.poll()})",
            }
        latencies = []
        for text in texts[:50]:
            t = time.perf_counter()
            http_json(f"{base}/predict", {"text": text})
            latencies.append(time.perf_counter() - t)
        t = time.perf_counter()
        batch = http_json(f"{base}/predict/batch", {"texts": texts[:64]})
        batch_s = time.perf_counter() - t
        latencies.sort()
        answers = len(batch.get("results", []))
        ok = str(health.get("device", "")).startswith(device) and answers == len(texts[:64])
        return {
            **out,
            "status": "ok" if ok else "FAILED",
            "device": health.get("device"),
            "single_request_latency_ms": {
                "p50": 1000 * latencies[len(latencies) // 2],
                "p95": 1000 * latencies[int(0.95 * (len(latencies) - 1))],
            },
            "batch_of_64_ms": 1000 * batch_s,
            "batch_answers": answers,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def http_json(url: str, body: dict | None = None) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode() if body is not None else None, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())
