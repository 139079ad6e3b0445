"""Benchmark the DistriNews server: micro-batching versus a naive one-request-per-forward-pass baseline.

    python scripts/bench_serving.py                    # full run (~2 minutes), writes benchmarks/serving.{json,png}
    python scripts/bench_serving.py --quick            # a couple of seconds per level (used by CI; no timing checks)
    python scripts/bench_serving.py --checkpoint checkpoints/distilbert_agnews.pt
    python scripts/bench_serving.py --overload --before 5aee7ee   # past capacity, before/after load shedding

Two servers run side by side, each `python -m distrinews_lib.serving` in its own process on
127.0.0.1: "batched" (the defaults) and the baseline "--max-batch-size 1" (every request is its own
forward pass; same app, same framework, same model thread).  This process drives POST /predict at
concurrency 1, 4, 16 and 64 for a fixed time per level, split into slices that alternate between
the two servers (each after a short unrecorded warm-up), so background load on a shared machine
hits both alike.  It reports requests/s, p50/p95/p99 latency and errors.

The load generator speaks HTTP/1.1 over plain asyncio streams with one keep-alive connection per
concurrent client: on a 2-core machine a heavier client (httpx, requests) would eat the CPU the
server is being measured on.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing the package

from distrinews_lib.errors import UserError, main_guard  # noqa: E402
from distrinews_lib.training.config import RunConfig  # noqa: E402

# Short news-like texts of varied length, so batches need padding as real traffic does.
TEXTS = [
    "Stocks rally as tech shares surge after strong quarterly earnings from chip makers.",
    "Federer beats Nadal in a five-set Wimbledon final that lasted almost five hours.",
    "Oil prices climb as OPEC agrees to cut production for the rest of the year.",
    "NASA's new telescope sends back its first images of distant galaxies.",
    "UN Security Council meets on the crisis in the region as talks stall.",
    "Microsoft releases a security update for Windows after a worm spreads across the internet.",
    "Red Sox win the World Series for the first time since 1918.",
    "Central bank raises interest rates by a quarter point, citing inflation.",
    "Scientists sequence the genome of the chimpanzee, our closest living relative.",
    "Election results delayed as officials recount ballots in three provinces.",
    "Google shares jump in their first day of trading after the IPO.",
    "Olympic swimmer sets a new world record in the 200 metres freestyle.",
]


# ----------------------------------------------------------------------------- server process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_checkpoint(folder: Path) -> Path:
    """A tiny random DistilBERT checkpoint: the benchmark measures serving, not accuracy."""
    from distrinews_lib.data.texts import AG_NEWS_LABELS
    from distrinews_lib.models.build import build_model
    from distrinews_lib.training.checkpoint import save_checkpoint

    model, tokenizer, _ = build_model(RunConfig(model="tiny", seed=0), AG_NEWS_LABELS)
    return save_checkpoint(folder / "bench_tiny.pt", model, tokenizer, AG_NEWS_LABELS,
                           {"data_source": "synthetic", "model": "tiny", "final_accuracy": 0.0, "world_size": 1},
                           max_length=64)


class Server:
    """`python -m distrinews_lib.serving` in a child process, stopped on exit."""

    def __init__(self, checkpoint: Path, port: int, extra: list[str], tree: Path = REPO):
        self.cmd = [sys.executable, "-m", "distrinews_lib.serving", "--checkpoint", str(checkpoint),
                    "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *extra]
        self.port = port
        self.tree = tree  # the checkout whose distrinews_lib serves (--overload --before: an older commit's)
        self.proc = None
        self.log = tempfile.TemporaryFile(mode="w+")

    def launch(self):
        env = dict(os.environ, PYTHONPATH=str(self.tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(self.cmd, cwd=self.tree, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        return self

    def __enter__(self):
        if self.proc is None:
            self.launch()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise UserError(f"the server exited with code {self.proc.returncode} before it was ready: "
                                f"{self.log.read()[-1500:]}")
            if asyncio.run(http_health(self.port)):
                return self
            time.sleep(0.2)
        raise UserError("the server did not answer GET /health within 120 s")

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# ----------------------------------------------------------------------------- load generator


class Connection:
    """One keep-alive HTTP/1.1 connection: POST a JSON body, read status and body."""

    def __init__(self, port: int):
        self.port = port
        self.reader = self.writer = None
        self.retry_after = None  # the last response's Retry-After, in seconds

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        status = int(status_line.split()[1])
        length, close, self.retry_after = 0, False, None
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and "close" in value.lower():
                close = True
            elif name.lower() == "retry-after":
                self.retry_after = float(value)
        payload = await self.reader.readexactly(length)
        if close:
            self.close()
        return status, payload

    def close(self):
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


async def http_health(port: int) -> bool:
    conn = Connection(port)
    try:
        status, _ = await asyncio.wait_for(conn.request("GET", "/health"), 2)
        return status == 200
    except (OSError, asyncio.TimeoutError, ValueError, IndexError, asyncio.IncompleteReadError):
        return False
    finally:
        conn.close()


async def drive(port: int, concurrency: int, duration: float, warmup: float, timeout: float = 10.0):
    """`concurrency` clients each send POST /predict back to back; only the last `duration` s count.

    Returns (latencies in s, {error kind: count}, measured seconds)."""
    bodies = [json.dumps({"text": t}).encode() for t in TEXTS]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    start = loop.time()
    record_from, stop_at = start + warmup, start + warmup + duration

    async def client(k: int):
        conn = Connection(port)
        i = k
        while True:
            t0 = loop.time()
            if t0 >= stop_at:
                break
            try:
                status, payload = await asyncio.wait_for(conn.request("POST", "/predict", bodies[i % len(bodies)]), timeout)
                ok = status == 200 and b'"label"' in payload
                kind = None if ok else f"HTTP {status}"
            except (OSError, asyncio.TimeoutError, ValueError, IndexError, asyncio.IncompleteReadError) as err:
                kind = type(err).__name__
                conn.close()
            t1 = loop.time()
            i += 1
            if t0 >= record_from:  # a request counts if it was sent inside the measured window
                if kind is None:
                    latencies.append(t1 - t0)
                else:
                    errors[kind] = errors.get(kind, 0) + 1
        conn.close()

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    elapsed = max(loop.time() - record_from, 1e-9)  # includes the tail of requests sent before stop_at
    return latencies, errors, elapsed


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def summarize(latencies, errors, elapsed, concurrency) -> dict:
    lat = sorted(latencies)
    ms = lambda v: round(v * 1000, 3)  # noqa: E731
    return {
        "concurrency": concurrency,
        "duration_s": round(elapsed, 3),
        "requests": len(lat),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "requests_per_s": round(len(lat) / elapsed, 1),
        "latency_ms": {"mean": ms(statistics.fmean(lat)) if lat else None, "p50": ms(percentile(lat, 50)),
                       "p95": ms(percentile(lat, 95)), "p99": ms(percentile(lat, 99)), "max": ms(lat[-1]) if lat else None},
    }


async def server_batching(port: int) -> dict:
    conn = Connection(port)
    try:
        _, payload = await conn.request("GET", "/health")
        return json.loads(payload).get("batching") or {}
    finally:
        conn.close()


def measure(configs: dict, checkpoint: Path, levels: list[int], duration: float, warmup: float,
            rounds: int) -> list[dict]:
    """Start every server configuration at once, then measure them in turns at each level.

    Each level is split into `rounds` slices that alternate between the configurations, so a
    burst of background load on a shared machine hits both sides alike and the ratio stays fair.
    """
    servers = {name: Server(checkpoint, free_port(), extra) for name, extra in configs.items()}
    started = [server.launch() for server in servers.values()]  # start side by side, then wait for each
    try:
        for name, server in servers.items():
            server.__enter__()
            print(f"[{name}] {shlex.join(server.cmd)}", flush=True)
        results = {name: {"name": name, "server_command": server.cmd, "levels": []} for name, server in servers.items()}
        for c in levels:
            acc = {name: ([], {}, 0.0) for name in servers}
            for _ in range(rounds):
                for name, server in servers.items():
                    lat, errs, secs = asyncio.run(drive(server.port, c, duration / rounds, warmup))
                    all_lat, all_errs, all_secs = acc[name]
                    all_lat.extend(lat)
                    for kind, n in errs.items():
                        all_errs[kind] = all_errs.get(kind, 0) + n
                    acc[name] = (all_lat, all_errs, all_secs + secs)
            for name in servers:
                row = summarize(*acc[name], c)
                results[name]["levels"].append(row)
                lat = row["latency_ms"]
                print(f"  {name:<24} concurrency {c:>3}: {row['requests_per_s']:>8.1f} req/s   p50 {lat['p50']:7.2f} ms   "
                      f"p95 {lat['p95']:7.2f} ms   p99 {lat['p99']:7.2f} ms   errors {row['errors']}", flush=True)
        for name, server in servers.items():
            results[name]["server_batching"] = asyncio.run(server_batching(server.port))
        return list(results.values())
    finally:
        for server in started:
            server.__exit__(None, None, None)


# ----------------------------------------------------------------------------- report


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def git_commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "distrinews_lib", "scripts/bench_serving.py"],
                               cwd=REPO, capture_output=True, text=True).stdout.strip()
        return sha + ("+uncommitted-changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def model_description(checkpoint: Path) -> dict:
    from distrinews_lib.serving.inference import load_checkpoint

    loaded = load_checkpoint(checkpoint)
    return {"checkpoint": str(checkpoint), "type": loaded.model.config.model_type,
            "parameters": sum(p.numel() for p in loaded.model.parameters()),
            "max_length": loaded.max_length, "metadata_model": loaded.metadata.get("model")}


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for cfg, style, color in zip(report["configs"], ("o-", "s--"), ("tab:blue", "tab:orange")):
        xs = [r["concurrency"] for r in cfg["levels"]]
        ax1.plot(xs, [r["requests_per_s"] for r in cfg["levels"]], style, color=color, label=cfg["name"])
        ax2.plot(xs, [r["latency_ms"]["p99"] for r in cfg["levels"]], style, color=color, label=f"{cfg['name']} p99")
        ax2.plot(xs, [r["latency_ms"]["p50"] for r in cfg["levels"]], style, color=color, alpha=0.35,
                 label=f"{cfg['name']} p50")
    batched = report["configs"][0]["levels"]
    for row in batched:  # the speed-up over the baseline, written above each batched point
        ratio = report["throughput_ratio_batched_over_baseline"].get(str(row["concurrency"]))
        if ratio is not None:
            ax1.annotate(f"{ratio:.1f}x", (row["concurrency"], row["requests_per_s"]), textcoords="offset points",
                         xytext=(0, 7), ha="center", fontsize=9)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(report["settings"]["concurrency_levels"], [str(c) for c in report["settings"]["concurrency_levels"]])
        ax.set_xlabel("concurrent clients")
        ax.grid(True, alpha=0.3)
        ax.legend()
    ax1.margins(y=0.12)  # room for the ratio labels
    ax1.set_ylabel("requests / s")
    ax1.set_title("Throughput (POST /predict)")
    ax2.set_ylabel("latency (ms)")
    ax2.set_yscale("log")
    ax2.axhline(100, color="grey", lw=0.8, ls=":")
    ax2.text(1, 100, " 100 ms", va="bottom", fontsize=8, color="grey")
    ax2.set_title("Latency")
    machine = report["machine"]
    fig.suptitle(f"DistriNews serving, {report['model']['type']} ({report['model']['parameters']:,} params), "
                 f"{machine['cpu_count']} CPU cores (load average {machine['load_average_1min_before']} at start)",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- overload mode (--overload)

OVERLOAD_DOC = """\
--overload: the server past its capacity, before and after load shedding (issue 12), side by side.

Both servers run at once, each `python -m distrinews_lib.serving` with its defaults: "after" from this
checkout, "before" from a temporary git worktree of --before REF (each serves a tiny random model saved
by its own code: the checkpoint format changed in between). At each concurrency (256 and 1024) each
server in turn gets that many clients, each with a keep-alive connection, sending POST /predict back to
back; a client answered 503/429 waits the Retry-After it was given (a well-behaved client) and goes on.
Reported per level: requests sent, answered (200), shed (503/429), other errors, p50/p95/p99 of the
answered ones, and how many were answered within the deadline (10 s).

Then the abandoned work: 2,000 /predict requests, each sent and its connection closed at once, then 100
maximal /predict/batch calls (64 texts of 10,000 characters) likewise; after each burst a real request
is timed until it is answered (it waits behind whatever work the server still does; if it is refused
with 503 it is sent again every 0.1 s), and the server process's CPU seconds until it is idle again are
read from /proc, with its own counters where it has them.
"""

MAXIMAL_TEXT = ("Stocks rally on Wall Street as tech shares surge after strong quarterly earnings. " * 130)[:10_000]


def proc_cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_idle(pid: int, settle_s: float = 1.0, limit_s: float = 900.0) -> float:
    """Wait until the process uses (almost) no CPU for `settle_s`; return its CPU seconds then."""
    deadline = time.monotonic() + limit_s
    last = proc_cpu_seconds(pid)
    while time.monotonic() < deadline:
        time.sleep(settle_s)
        now = proc_cpu_seconds(pid)
        if now - last < 0.03 * settle_s:
            return now
        last = now
    return proc_cpu_seconds(pid)


async def drive_overload(port: int, concurrency: int, duration: float, warmup: float, timeout: float = 60.0):
    """`concurrency` clients POST /predict back to back; shed ones honour Retry-After. Records every request
    sent inside the measured window: (kind, latency s), kind one of ok, shed, an HTTP status, an error name."""
    bodies = [json.dumps({"text": t}).encode() for t in TEXTS]
    records: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    record_from, stop_at = start + warmup, start + warmup + duration

    async def client(k: int):
        conn, i = Connection(port), k
        while True:
            t0 = loop.time()
            if t0 >= stop_at:
                break
            wait = 0.0
            try:
                status, payload = await asyncio.wait_for(conn.request("POST", "/predict", bodies[i % len(bodies)]), timeout)
                if status == 200 and b'"label"' in payload:
                    kind = "ok"
                elif status in (429, 503):
                    kind, wait = "shed", conn.retry_after or 1.0
                else:
                    kind = f"HTTP {status}"
            except (OSError, asyncio.TimeoutError, ValueError, IndexError, asyncio.IncompleteReadError) as err:
                kind = type(err).__name__
                conn.close()
                wait = 0.05
            t1 = loop.time()
            i += 1
            if t0 >= record_from:
                records.append((kind, t1 - t0))
            if wait:
                await asyncio.sleep(min(wait, max(0.0, stop_at - loop.time())))
        conn.close()

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return records, loop.time() - record_from


def summarize_overload(records, elapsed: float, deadline_s: float) -> dict:
    ok = sorted(lat for kind, lat in records if kind == "ok")
    shed = sorted(lat for kind, lat in records if kind == "shed")
    errors: dict[str, int] = {}
    for kind, _ in records:
        if kind not in ("ok", "shed"):
            errors[kind] = errors.get(kind, 0) + 1
    ms = lambda v: round(v * 1000, 1)  # noqa: E731
    sent = len(records)
    return {
        "sent": sent, "answered": len(ok), "shed": len(shed), "errors": sum(errors.values()), "error_kinds": errors,
        "shed_fraction": round(len(shed) / sent, 4) if sent else None,
        "answered_per_s": round(len(ok) / elapsed, 1),
        "answered_within_deadline": sum(1 for v in ok if v <= deadline_s),
        "latency_answered_ms": {"p50": ms(percentile(ok, 50)), "p95": ms(percentile(ok, 95)),
                                "p99": ms(percentile(ok, 99)), "max": ms(ok[-1]) if ok else None},
        "latency_shed_ms": {"p50": ms(percentile(shed, 50)), "p99": ms(percentile(shed, 99))} if shed else None,
        "measured_s": round(elapsed, 2),
    }


async def send_and_close(port: int, requests: list[bytes], parallel: int = 100) -> float:
    """Send each request on its own connection and close it at once, `parallel` at a time; seconds taken."""
    sem = asyncio.Semaphore(parallel)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(raw: bytes):
        async with sem:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(raw)
                await writer.drain()
                writer.close()
            except OSError:
                pass

    await asyncio.gather(*(one(r) for r in requests))
    return loop.time() - start


def raw_post(path: str, payload: dict) -> bytes:
    body = json.dumps(payload).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def health_json(port: int) -> dict:
    conn = Connection(port)
    try:
        _, payload = await asyncio.wait_for(conn.request("GET", "/health"), 60)
        return json.loads(payload)
    finally:
        conn.close()


def work_counters(health: dict) -> dict:
    """What the server says it computed; the old server counts /predict texts only as batches x mean size."""
    b = health.get("batching") or {}
    texts, estimated = b.get("texts_run"), False
    if texts is None:  # the old server: batches x their mean size (rounded to 2 decimals), so approximate
        texts, estimated = b.get("batches_run", 0) * (b.get("mean_batch_size") or 0), True
    return {"predict_texts_run": texts, "estimated": estimated, "batch_calls_run": b.get("batch_calls_run"),
            "queue": health.get("queue")}


def abandoned_burst(server: "Server", requests: list[bytes]) -> dict:
    """Send-and-close every request, time one real request right after, then the CPU the server spent."""
    port, pid = server.port, server.proc.pid
    cpu0 = wait_idle(pid)
    before = work_counters(asyncio.run(health_json(port)))
    sent_s = asyncio.run(send_and_close(port, requests))

    async def probe():
        # Polls every 0.1 s until answered: this measures when the server is free for real work again, not
        # how a client honouring Retry-After would fare (the first Retry-After is recorded too).
        t, statuses, retry_after = time.perf_counter(), [], None
        while True:
            conn = Connection(port)
            try:
                status, _ = await asyncio.wait_for(conn.request("POST", "/predict", json.dumps({"text": TEXTS[0]}).encode()), 900)
            finally:
                conn.close()
            statuses.append(status)
            if status not in (429, 503) or time.perf_counter() - t > 900:
                return statuses, time.perf_counter() - t, retry_after
            retry_after = retry_after or conn.retry_after
            await asyncio.sleep(0.1)

    statuses, probe_s, retry_after = asyncio.run(probe())
    status = statuses[-1]
    cpu1 = wait_idle(pid)
    after = work_counters(asyncio.run(health_json(port)))
    texts = max(0, round(after["predict_texts_run"] - before["predict_texts_run"]) - 1)  # not the probe
    calls = (after["batch_calls_run"] - before["batch_calls_run"]) if after["batch_calls_run"] is not None else None
    delta = {"predict_texts_run": texts, "batch_calls_run": calls}
    if after["estimated"]:
        delta["note"] = "server reports /predict texts only approximately and /predict/batch calls not at all"
    queue = {k: v - (before["queue"] or {}).get(k, 0) for k, v in (after["queue"] or {}).items()
             if isinstance(v, int) and k not in ("max_requests", "max_texts", "waiting_requests", "waiting_texts")}
    return {"requests": len(requests), "burst_sent_s": round(sent_s, 2), "probe_status": status,
            "probe_wait_s": round(probe_s, 3), "probe_refused": len(statuses) - 1, "probe_first_retry_after": retry_after,
            "server_cpu_s": round(cpu1 - cpu0, 2),
            "computed": delta, "server_queue_counters": queue or None}


def make_checkpoint_with(tree: Path, folder: Path) -> Path:
    """A tiny random model (seed 0) saved by `tree`'s own distrinews_lib, in `tree`'s checkpoint format."""
    folder.mkdir(parents=True, exist_ok=True)
    # Both library layouts (before and after the reshape), so `--before` can point at an older tree.
    code = ("import sys\n"
            "try:\n"
            "    from distrinews_lib.data.texts import AG_NEWS_LABELS\n"
            "    from distrinews_lib.training.checkpoint import save_checkpoint\n"
            "    from distrinews_lib.training.config import RunConfig\n"
            "    from distrinews_lib.models.build import build_model\n"
            "    m, t, _ = build_model(RunConfig(model='tiny', seed=0), AG_NEWS_LABELS)\n"
            "except ImportError:\n"
            "    from distrinews_lib import AG_NEWS_LABELS\n"
            "    from distrinews_lib.checkpoint import save_checkpoint\n"
            "    from distrinews_lib.config import RunConfig\n"
            "    from distrinews_lib.model import build_model\n"
            "    m, t, _ = build_model(RunConfig(model='tiny', seed=0), AG_NEWS_LABELS)\n"
            "save_checkpoint(sys.argv[1], m, t, AG_NEWS_LABELS, {'data_source': 'synthetic', 'model': 'tiny', "
            "'final_accuracy': 0.0, 'world_size': 1}, max_length=64)")
    path = folder / "bench_tiny.pt"
    env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code, str(path)], cwd=tree, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise UserError(f"could not make a checkpoint with the code in {tree}: {r.stderr[-800:]}")
    return path


def commit_of(tree: Path) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def plot_overload(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ("before", "after") if n in report["servers"]]
    colors = {"before": "tab:orange", "after": "tab:blue"}
    levels = report["settings"]["concurrency_levels"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(levels))]
        rows = [next(r for r in report["levels"] if r["concurrency"] == c)[name] for c in levels]
        axes[0].bar(xs, [r["latency_answered_ms"]["p99"] for r in rows], width, color=colors[name], label=name)
        axes[1].bar(xs, [100 * (r["shed_fraction"] or 0) for r in rows], width, color=colors[name], label=name)
    for ax, title, unit in ((axes[0], "p99 latency of answered requests", "ms"),
                            (axes[1], "requests shed (503 + Retry-After)", "% of sent")):
        ax.set_xticks(range(len(levels)), [f"{c} clients" for c in levels])
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)
    bursts = list(report["abandoned"][names[0]])
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(bursts))]
        axes[2].bar(xs, [report["abandoned"][name][b]["probe_wait_s"] for b in bursts], width, color=colors[name],
                    label=name)
    axes[2].set_xticks(range(len(bursts)), [report["abandoned"][names[0]][b]["label"] for b in bursts], fontsize=8)
    axes[2].set_yscale("log")
    axes[2].set_ylabel("s (log)")
    axes[2].set_title("wait of a real request sent after\nrequests whose clients left", fontsize=10)
    axes[2].legend()
    axes[2].grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"DistriNews server past its capacity, tiny model, {report['provenance']['machine']} "
                 f"(load average {report['provenance']['load_average_at_start']} at start)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def overload_main(args) -> None:
    try:
        from distrinews_lib.bench.provenance import provenance
    except ImportError:  # older layout
        from distrinews_lib.perf import provenance

    levels = [int(x) for x in args.levels.split(",")] if args.levels_given else ([8] if args.quick else [256, 1024])
    duration = args.duration if args.duration is not None else (1.0 if args.quick else 20.0)
    warmup = args.warmup if args.warmup is not None else (0.3 if args.quick else 2.0)
    n_single, n_batch = (20, 2) if args.quick else (2000, 100)
    deadline_s = 10.0
    info = provenance()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="distrinews-overload-") as tmp:
        tmp = Path(tmp)
        trees = {"after": REPO}
        if args.before:
            before_tree = tmp / "before"
            r = subprocess.run(["git", "worktree", "add", "--detach", str(before_tree), args.before], cwd=REPO,
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise UserError(f"--before {args.before}: git worktree add failed: {r.stderr.strip()[:300]}")
            trees = {"before": before_tree, "after": REPO}
        commits = {name: commit_of(tree) for name, tree in trees.items()}
        try:
            servers = {name: Server(make_checkpoint_with(tree, tmp / f"ckpt_{name}"), free_port(), [], tree=tree)
                       for name, tree in trees.items()}
            for server in servers.values():
                server.launch()
            try:
                for name, server in servers.items():
                    server.__enter__()
                    print(f"[{name}] {commit_of(server.tree)[:12]}: {shlex.join(server.cmd)}", flush=True)
                results = []
                for c in levels:
                    row = {"concurrency": c}
                    for name, server in servers.items():
                        wait_idle(server.proc.pid)
                        records, elapsed = asyncio.run(drive_overload(server.port, c, duration, warmup))
                        row[name] = summarize_overload(records, elapsed, deadline_s)
                        r = row[name]
                        print(f"  {name:<6} c={c:>5}: sent {r['sent']:>6}  answered {r['answered']:>6}  shed {r['shed']:>6}  "
                              f"errors {r['errors']:>4}  p99 answered {r['latency_answered_ms']['p99']} ms", flush=True)
                    results.append(row)
                bursts = {
                    "predict": (f"{n_single} /predict", [raw_post("/predict", {"text": TEXTS[i % len(TEXTS)]})
                                                         for i in range(n_single)]),
                    "batch": (f"{n_batch} maximal /predict/batch", [raw_post("/predict/batch", {"texts": [MAXIMAL_TEXT] * 64})
                                                                  for _ in range(n_batch)]),
                }
                abandoned = {}
                for name, server in servers.items():
                    abandoned[name] = {}
                    for key, (label, requests) in bursts.items():
                        res = abandoned_burst(server, requests)
                        res["label"] = label
                        abandoned[name][key] = res
                        print(f"  {name:<6} {label} sent and closed: a real request then waited {res['probe_wait_s']} s; "
                              f"server CPU {res['server_cpu_s']} s; computed {res['computed']}", flush=True)
            finally:
                for server in servers.values():
                    server.__exit__(None, None, None)
        finally:
            if args.before:
                subprocess.run(["git", "worktree", "remove", "--force", str(tmp / "before")], cwd=REPO,
                               capture_output=True)
    report = {
        "what": "the server past its capacity (POST /predict at high concurrency) and work for clients that left: "
                "before and after load shedding (issue 12), measured side by side in one run",
        "quick": args.quick,
        "provenance": info,
        "servers": {name: {"git_commit": commits[name], "command": s.cmd, "settings": "defaults"}
                    for name, s in servers.items()},
        "settings": {"concurrency_levels": levels, "duration_s": duration, "warmup_s": warmup,
                     "deadline_s_of_after": deadline_s,
                     "client": "asyncio HTTP/1.1 in this process, one keep-alive connection per client, back to back; "
                               "a shed client (503/429) waits its Retry-After, then goes on; 60 s client timeout",
                     "method": OVERLOAD_DOC},
        "levels": results,
        "abandoned": abandoned,
        "wall_time_s": round(time.time() - started, 1),
    }
    report["headline"] = overload_headline(report)
    out = args.output if args.output_given else REPO / "benchmarks" / "serving_overload.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    png = args.plot or out.with_suffix(".png")
    plot_overload(report, png)
    print("\n" + "\n".join(report["headline"]["lines"]))
    print(f"wrote {out} and {png}")


def overload_headline(report: dict) -> dict:
    lines = []
    for row in report["levels"]:
        for name in ("before", "after"):
            if name in row:
                r = row[name]
                lines.append(f"c={row['concurrency']} {name}: shed {r['shed']} of {r['sent']} "
                             f"({100 * (r['shed_fraction'] or 0):.1f}%), p99 of answered "
                             f"{r['latency_answered_ms']['p99']} ms, answered within {report['settings']['deadline_s_of_after']:g} s: "
                             f"{r['answered_within_deadline']} of {r['answered']}, errors {r['errors']}")
    for name, bursts in report["abandoned"].items():
        for b in bursts.values():
            lines.append(f"{name}: {b['label']} sent and closed -> a real request waited {b['probe_wait_s']} s, "
                         f"server CPU {b['server_cpu_s']} s, computed {b['computed']}")
    return {"lines": lines}


# ----------------------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", type=Path, default=None,
                   help="checkpoint to serve (default: a tiny random model made in a temporary folder)")
    p.add_argument("--quick", action="store_true", help="about 2 s per level: checks the benchmark runs, not how fast")
    p.add_argument("--duration", type=float, default=None, help="measured seconds per level (default 8, quick 1.5)")
    p.add_argument("--warmup", type=float, default=None, help="unrecorded seconds before each level (default 1, quick 0.3)")
    p.add_argument("--rounds", type=int, default=None,
                   help="alternating slices per level and configuration (default 3, quick 1)")
    p.add_argument("--levels", default=None, help="concurrency levels, comma separated (default 1,4,16,64; "
                                                  "with --overload 256,1024)")
    p.add_argument("--max-batch-size", type=int, default=None, help="batched server's --max-batch-size (default: the server's)")
    p.add_argument("--batch-window-ms", type=float, default=None, help="batched server's --batch-window-ms (default: the server's)")
    p.add_argument("--no-baseline", action="store_true", help="measure only the batched server (for tuning runs)")
    p.add_argument("--overload", action="store_true",
                   help="measure overload and abandoned work instead: concurrency 256 and 1024 (see OVERLOAD_DOC); "
                        "writes benchmarks/serving_overload.{json,png}")
    p.add_argument("--before", default=None, metavar="REF",
                   help="with --overload: also measure the server of this git commit, side by side (a temporary worktree)")
    p.add_argument("--output", type=Path, default=None, help="JSON results file (default benchmarks/serving.json, "
                                                             "or serving_overload.json with --overload)")
    p.add_argument("--plot", type=Path, default=None, help="PNG figure (default: beside --output, .png)")
    args = p.parse_args(argv)
    args.levels_given, args.output_given = args.levels is not None, args.output is not None
    if args.levels is None:
        args.levels = "1,4,16,64"
    if args.output is None:
        args.output = REPO / "benchmarks" / "serving.json"
    if args.before and not args.overload:
        p.error("--before goes with --overload")
    return args


@main_guard
def main(argv=None):
    args = parse_args(argv)
    if args.overload:
        return overload_main(args)
    import torch

    duration = args.duration if args.duration is not None else (1.5 if args.quick else 8.0)
    warmup = args.warmup if args.warmup is not None else (0.3 if args.quick else 0.5)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    try:
        levels = [int(x) for x in args.levels.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--levels {args.levels!r} must be comma-separated integers such as 1,4,16,64") from None
    if not levels or min(levels) < 1:
        raise UserError("--levels needs at least one concurrency of 1 or more")

    with tempfile.TemporaryDirectory(prefix="distrinews-bench-") as tmp:
        checkpoint = args.checkpoint or make_checkpoint(Path(tmp))
        if args.checkpoint is not None and not args.checkpoint.is_file():
            raise UserError(f"--checkpoint {args.checkpoint} does not exist")
        batched_extra = []
        if args.max_batch_size is not None:
            batched_extra += ["--max-batch-size", str(args.max_batch_size)]
        if args.batch_window_ms is not None:
            batched_extra += ["--batch-window-ms", str(args.batch_window_ms)]
        started = time.time()
        load_before = load_average()
        wanted = {"batched": batched_extra}
        if not args.no_baseline:
            wanted["baseline (no batching)"] = ["--max-batch-size", "1"]
        configs = measure(wanted, checkpoint, levels, duration, warmup, rounds)
        model = model_description(checkpoint)
        if args.checkpoint is None:
            model["checkpoint"] = "tiny random DistilBERT made by this script (build_model(RunConfig(model='tiny', seed=0), AG_NEWS_LABELS), max_length 64)"

    batched, baseline = configs[0], configs[-1]
    ratios = {str(b["concurrency"]): round(b["requests_per_s"] / max(a["requests_per_s"], 1e-9), 2)
              for b, a in zip(batched["levels"], baseline["levels"])} if len(configs) > 1 else {}
    report = {
        "what": "POST /predict throughput and latency, micro-batched server vs the same server with --max-batch-size 1",
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": args.quick,
        "machine": {"platform": platform.platform(), "machine": platform.machine(), "cpu": cpu_name(),
                    "cpu_count": os.cpu_count(), "python": platform.python_version(),
                    # Other work on the machine changes the figures (a busy CPU hurts the baseline most).
                    "load_average_1min_before": load_before, "load_average_1min_after": load_average()},
        "versions": {"torch": torch.__version__,
                     **_versions("transformers", "fastapi", "uvicorn", "pydantic", "httptools", "uvloop")},
        # uvicorn picks its HTTP parser and event loop by what is installed: the C ones are much cheaper.
        "uvicorn_http": "httptools" if importlib.util.find_spec("httptools") else "h11",
        "uvicorn_loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        "git_commit": git_commit(),
        "model": model,
        "settings": {"concurrency_levels": levels, "duration_s": duration, "warmup_s_per_slice": warmup,
                     "rounds": rounds,
                     "method": "both servers run at once; each level is measured in `rounds` alternating slices "
                               "of duration/rounds seconds per server, after an unrecorded warm-up per slice",
                     "client": "asyncio HTTP/1.1, one keep-alive connection per concurrent client, separate process"},
        "configs": configs,
        "throughput_ratio_batched_over_baseline": ratios,
        "wall_time_s": round(time.time() - started, 1),
    }
    c16 = next((r for r in batched["levels"] if r["concurrency"] == 16), None)
    if c16 is not None and ratios:
        report["target_at_concurrency_16"] = {
            "goal": ">= 3x baseline requests/s, p99 < 100 ms, 0 errors",
            "ratio": ratios["16"], "p99_ms": c16["latency_ms"]["p99"], "errors": c16["errors"],
            "met": ratios["16"] >= 3 and c16["latency_ms"]["p99"] < 100 and c16["errors"] == 0,
        }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    png = args.plot or args.output.with_suffix(".png")
    plot(report, png)
    print("\nbatched / baseline requests/s: " + ", ".join(f"c={c}: {r}x" for c, r in ratios.items()))
    if "target_at_concurrency_16" in report:
        t = report["target_at_concurrency_16"]
        print(f"target at concurrency 16 ({t['goal']}): ratio {t['ratio']}x, p99 {t['p99_ms']} ms, "
              f"errors {t['errors']} -> {'met' if t['met'] else 'NOT met'}")
    print(f"wrote {args.output} and {png}")


def _versions(*names):
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


if __name__ == "__main__":
    main()
