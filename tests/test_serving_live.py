"""The server as an operator runs it: real uvicorn processes on 127.0.0.1, the command line, the benchmark.

Every process here pays for importing torch, so they are started side by side, not one after another.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.serving.inference import load_checkpoint, predict_proba

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
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=child_env(**env),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )


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


# The "strict" server: the command line with small limits, so overload and slow clients show quickly.
STRICT = [
    "--max-queue",
    "2",
    "--max-queue-texts",
    "64",
    "--limit-concurrency",
    "6",
    "--header-timeout",
    "1.5",
    "--body-timeout",
    "1.5",
    "--timeout-keep-alive",
    "1",
]


@pytest.fixture(scope="module")
def server_logs(tmp_path_factory):
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="module")
def servers(ckpt_path, server_logs):
    """The ways of starting the server, side by side: plain uvicorn (checkpoint from the environment),
    `python -m distrinews_lib.serving --checkpoint` with its defaults, and the same with small limits."""
    logs = server_logs
    p1, p2, p3, p4 = free_port(), free_port(), free_port(), free_port()
    procs = {
        "uvicorn": (
            start(
                ["-m", "uvicorn", "distrinews_lib.serving.app:app", "--host", "127.0.0.1", "--port", str(p1)],
                logs / "uvicorn.log",
                DISTRINEWS_CHECKPOINT=str(ckpt_path),
            ),
            f"http://127.0.0.1:{p1}",
            logs / "uvicorn.log",
        ),
        "cli": (
            start(
                ["-m", "distrinews_lib.serving", "--checkpoint", str(ckpt_path), "--port", str(p2)], logs / "cli.log"
            ),
            f"http://127.0.0.1:{p2}",
            logs / "cli.log",
        ),
        "strict": (
            start(
                ["-m", "distrinews_lib.serving", "--checkpoint", str(ckpt_path), "--port", str(p3), *STRICT],
                logs / "strict.log",
            ),
            f"http://127.0.0.1:{p3}",
            logs / "strict.log",
        ),
        # Plain uvicorn with the flags the README gives it, the same small limits from the environment.
        "uvicorn-http": (
            start(
                [
                    "-m",
                    "uvicorn",
                    "distrinews_lib.serving.app:app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(p4),
                    "--http",
                    "distrinews_lib.serving.protocol:HttpProtocol",
                    "--limit-concurrency",
                    "6",
                    "--timeout-keep-alive",
                    "1",
                ],
                logs / "uvicorn-http.log",
                DISTRINEWS_CHECKPOINT=str(ckpt_path),
                DISTRINEWS_HEADER_TIMEOUT="1.5",
                DISTRINEWS_BODY_TIMEOUT="1.5",
            ),
            f"http://127.0.0.1:{p4}",
            logs / "uvicorn-http.log",
        ),
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
    assert health["status"] == "ok" and health["model_loaded"] and health["labels"] == AG_NEWS_LABELS
    assert health["checkpoint"]["file"] == ckpt_path.name and str(ckpt_path.parent) not in json.dumps(health)
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
            list(batched["all_probabilities"].values()), abs=1e-5
        )


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


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(body=bodies)
def test_fuzzed_bodies_on_a_real_server_never_give_5xx(url, body, http):
    for path in ("/predict", "/predict/batch"):
        r = http.post(url + path, content=body, headers=JSON)
        assert r.status_code < 500, (r.status_code, r.text)


# ----------------------------------------------------------------------------- raw HTTP helpers


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def raw_request(method: str, path: str, body: bytes = b"", extra: bytes = b"") -> bytes:
    return (
        (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
        ).encode()
        + extra
        + b"\r\n"
        + body
    )


def read_until_closed(sock: socket.socket, timeout: float, done=lambda data: False) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, `done(data)` holds, or `timeout`; and when."""
    sock.settimeout(timeout)
    start, data = time.monotonic(), b""
    try:
        while not done(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    return data, time.monotonic() - start


def whole_response(data: bytes) -> bool:
    """One whole HTTP response is in: its head, then Content-Length bytes of body. Plain uvicorn keeps the connection
    open for its keep-alive timeout after answering, so waiting for it to close costs those seconds."""
    head, sep, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head) if sep else None
    return bool(length) and len(body) >= int(length.group(1))


def health_of(base: str) -> dict:
    return httpx.get(base + "/health", timeout=30).json()


def log_lines(path: Path, since: int) -> list[str]:
    """The log's lines after the first `since`, without the access log's."""
    lines = path.read_text(errors="replace").splitlines()[since:]
    return [line for line in lines if not line.startswith("INFO:     127.0.0.1:")]


# ----------------------------------------------------------------------------- overload and abusive clients


def test_overload_is_shed_with_503_and_retry_after(servers, loaded):
    """Six maximal /predict/batch calls whose bodies complete at the same moment, against a queue of 64 texts: one
    runs, at most one waits, the rest are refused at once with 503 and Retry-After instead of queueing without end."""
    base = servers["strict"]
    texts = [TEXTS[i % len(TEXTS)] + " word" * 1500 for i in range(64)]
    request = raw_request(
        "POST", "/predict/batch", json.dumps({"texts": texts}).encode(), extra=b"Connection: close\r\n"
    )
    shed_before = health_of(base)["queue"]["shed"]
    socks = [socket.create_connection(("127.0.0.1", port_of(base))) for _ in range(6)]
    try:
        # Every body but its last byte first, then the six last bytes back to back: no call can reach the queue
        # before all six are in, so the queue's bound decides who is refused, not how fast this machine sends or
        # classifies. (The server runs the handlers of bodies completed together one after another, without the
        # model's answer in between: of those, the first takes the free place in the queue, the rest are shed.)
        for sock in socks:
            sock.sendall(request[:-1])
        for sock in socks:
            sock.sendall(request[-1:])
        answers = [read_until_closed(sock, 120)[0] for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    responses = []
    for data in answers:
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        responses.append((int(lines[0].split()[1]), headers, json.loads(body)))
    codes = sorted(status for status, _, _ in responses)
    assert set(codes) <= {200, 503} and codes.count(503) >= 3 and 200 in codes, codes
    expected = predict_proba(loaded, texts).tolist()
    for status, headers, body in responses:
        if status == 503:
            assert "overloaded" in body["detail"] and int(headers["retry-after"]) >= 1
            # Refused only because the queue was full: another call's 64 texts were waiting.
            assert "with 64 texts are already waiting" in body["detail"], body["detail"]
        else:
            for result, p in zip(body["results"], expected):
                assert_matches(result, p)
    assert health_of(base)["queue"]["shed"] - shed_before == codes.count(503)


@pytest.mark.parametrize("how", ["strict", "uvicorn-http"])
def test_connection_limit_answers_503_with_retry_after(servers, how):
    base = servers[how]  # --limit-concurrency 6
    idle = [socket.create_connection(("127.0.0.1", port_of(base))) for _ in range(6)]
    try:
        with socket.create_connection(("127.0.0.1", port_of(base))) as sock:
            sock.sendall(raw_request("GET", "/health"))
            data, _ = read_until_closed(sock, 10)
    finally:
        for s in idle:
            s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), data[:300]
    assert b"retry-after: 1" in head.lower() and b"connection: close" in head.lower()
    assert "limit of 6 connections" in json.loads(body)["detail"]


PATIENCE = 60  # a hang guard, not a speed bound: the server closes at its 1.5 s timeout on any machine
SLOW_CLIENTS = [(how, what) for how in ("strict", "uvicorn-http") for what in ("headers", "body", "nothing")]


@pytest.fixture(scope="module")
def slow_clients(servers):
    """Every slow client below at once, each on a connection of its own (3 per server, under its limit of 6): each
    waits out its server's 1.5 s timeout, so side by side they take one timeout instead of six."""
    from concurrent.futures import ThreadPoolExecutor

    def one(case):
        how, what = case
        with socket.create_connection(("127.0.0.1", port_of(servers[how]))) as sock:
            if what == "headers":
                sock.sendall(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
            elif what == "body":
                sock.sendall(raw_request("POST", "/predict", b'{"text": "a slow body"}')[:-5])
            return read_until_closed(sock, PATIENCE)

    with ThreadPoolExecutor(len(SLOW_CLIENTS)) as pool:
        return dict(zip(SLOW_CLIENTS, pool.map(one, SLOW_CLIENTS)))


@pytest.mark.parametrize("how", ["strict", "uvicorn-http"])
@pytest.mark.parametrize("what", ["headers", "body", "nothing"])
def test_slow_client_is_cut_off(slow_clients, how, what):
    """Header and body timeouts of 1.5 s: a client that trickles (or sends nothing) is answered 408 and
    closed instead of holding a connection for ever."""
    data, waited = slow_clients[how, what]
    # Closed by the server (after its 1.5 s timeout), not left open until our own patience ran out.
    assert waited < PATIENCE, f"the connection stayed open {waited:.1f} s"
    if what == "nothing":
        assert data == b""
    else:
        assert data.startswith(b"HTTP/1.1 408"), data[:200]
        words = "request headers were not received" if what == "headers" else "request body was not received"
        assert words in json.loads(data.partition(b"\r\n\r\n")[2])["detail"]


def test_idle_keep_alive_connection_is_closed(servers):
    base = servers["strict"]  # --timeout-keep-alive 1
    with socket.create_connection(("127.0.0.1", port_of(base))) as sock:
        sock.sendall(raw_request("GET", "/health"))
        data, waited = read_until_closed(sock, 15)  # the answer, then nothing until the server closes
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"}") and waited < 5, (data[-100:], waited)


@pytest.mark.parametrize("how", ["cli", "uvicorn", "uvicorn-http"])
@pytest.mark.parametrize("what", ["a 16 MB header", "100,000 headers"])
def test_oversized_headers_get_431(servers, how, what):
    """The command line (and uvicorn with --http ...HttpProtocol) refuses them while they arrive; plain uvicorn
    reads them, then the app refuses them."""
    base = servers[how]
    if what == "a 16 MB header":
        extra = b"X-Big: " + b"a" * (16 * 1024 * 1024) + b"\r\n"
    else:
        extra = b"".join(b"X-%d: y\r\n" % i for i in range(100_000))
    request = raw_request("GET", "/health", extra=extra)
    with socket.create_connection(("127.0.0.1", port_of(base))) as sock:
        sent = 0
        try:
            for i in range(0, len(request), 1 << 16):
                sent += sock.send(request[i : i + (1 << 16)])
        except OSError:
            pass  # the server answered and closed before the client finished sending
        data, _ = read_until_closed(sock, 30, done=whole_response)
    assert data.startswith(b"HTTP/1.1 431"), data[:200]
    if how != "uvicorn" and what == "a 16 MB header":
        assert sent < len(request) // 2, "the server should refuse long before the whole header is in"


@pytest.mark.parametrize("how", ["cli", "uvicorn"])
def test_pipelining_client_that_half_closes_gives_at_most_one_log_line(servers, server_logs, how):
    base, log = servers[how], server_logs / f"{how}.log"
    since = len(log.read_text(errors="replace").splitlines())
    body = json.dumps({"text": "Stocks rally on Wall Street."}).encode()
    connections = 4
    for _ in range(connections):
        with socket.create_connection(("127.0.0.1", port_of(base))) as sock:
            sock.sendall(raw_request("POST", "/predict", body) * 2)
            sock.shutdown(socket.SHUT_WR)
            read_until_closed(sock, 10)
    time.sleep(1.5)  # let the server finish (and log) whatever it does with them
    new = log_lines(log, since)
    text = "\n".join(new)
    assert "Traceback" not in text and "Exception in ASGI application" not in text and "unexpected error" not in text, (
        text
    )
    assert len(new) <= connections, text


@pytest.mark.parametrize("how", ["cli", "uvicorn"])
def test_work_for_clients_that_left_is_dropped(servers, how):
    """Requests sent and closed at once, as a client that gives up would: (almost) none of their texts may reach
    the model, and a request sent right after them is answered promptly."""
    base = servers[how]
    single = raw_request("POST", "/predict", json.dumps({"text": TEXTS[1]}).encode())
    batch_body = json.dumps({"texts": [TEXTS[3] + " word" * 1500] * 64}).encode()
    batch = raw_request("POST", "/predict/batch", batch_body)

    async def send_and_close(request):
        _, writer = await asyncio.open_connection("127.0.0.1", port_of(base))
        writer.write(request)
        await writer.drain()
        writer.close()

    async def burst():
        await asyncio.gather(*(send_and_close(single) for _ in range(200)))
        await asyncio.gather(*(send_and_close(batch) for _ in range(20)))

    # What the abandoned work costs on THIS machine, now: one batch call like the burst's, answered.
    start = time.monotonic()
    assert (
        httpx.post(
            base + "/predict/batch", content=batch_body, headers={"Content-Type": "application/json"}, timeout=120
        ).status_code
        == 200
    )
    one_batch_s = time.monotonic() - start
    before = health_of(base)
    asyncio.run(burst())
    start = time.monotonic()
    probe = httpx.post(base + "/predict", json={"text": "probe"}, timeout=120)
    probe_s = time.monotonic() - start
    time.sleep(max(1.0, 2 * one_batch_s))  # anything still running finishes
    after = health_of(base)
    singles = after["batching"]["texts_run"] - before["batching"]["texts_run"] - 1  # minus the probe
    batches = after["batching"]["batch_calls_run"] - before["batching"]["batch_calls_run"]
    sent = 200 + 20 * 64  # texts whose clients left at once
    computed = singles + 64 * batches
    skipped = {k: after["queue"][k] - before["queue"][k] for k in ("abandoned", "shed", "texts_dropped")}
    story = dict(
        singles=singles, batches=batches, probe_s=round(probe_s, 3), one_batch_s=round(one_batch_s, 3), **skipped
    )
    assert probe.status_code == 200
    # Without dropping, the probe would wait behind the 20 batch calls: 20x one batch call's time on this machine.
    assert probe_s < 20 * one_batch_s / 2, (
        f"a request sent after the burst waited as if the abandoned work ran: {story}"
    )
    # What still ran is what the model had taken before the server saw the client leave (the command line's protocol
    # sees it at once, plain uvicorn a moment later): a small part of what was sent, however fast the machine.
    assert computed <= sent // 10, story
    assert skipped["abandoned"] + skipped["shed"] > 0 and skipped["texts_dropped"] > 0, story


def test_docs_and_head_health_on_a_real_server(servers):
    import re

    base = servers["cli"]
    head = httpx.head(base + "/health", timeout=30)
    assert head.status_code == 200 and head.content == b""
    page = httpx.get(base + "/docs", timeout=30).text
    assets = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert len(assets) == 3 and all(a.startswith("/docs/assets/") for a in assets), assets
    for asset in assets:
        assert httpx.get(base + asset, timeout=30).status_code == 200


# ----------------------------------------------------------------------------- failing startups


@pytest.fixture(scope="module")
def failed_startups(tmp_path_factory, ckpt_path):
    """Servers that must refuse to start, launched together as real processes; their exit codes and output.
    (Every kind of refused checkpoint is checked against the command line's main in test_serving_checkpoints.py.)"""
    from .test_serving_checkpoints import make_bad_checkpoints

    paths = make_bad_checkpoints(tmp_path_factory.mktemp("bad"), ckpt_path)
    port = str(free_port())  # never bound: each of them must stop before listening
    cases = {
        f"cli-{what}": (["-m", "distrinews_lib.serving", "--checkpoint", str(paths[what]), "--port", port], {})
        for what in ("missing", "unclassifiable")
    }
    cases.update(
        {
            f"uvicorn-{what}": (
                ["-m", "uvicorn", "distrinews_lib.serving.app:app", "--port", port],
                {"DISTRINEWS_CHECKPOINT": str(paths[what])},
            )
            for what in ("missing", "corrupt", "unclassifiable")
        }
    )
    procs = {
        name: subprocess.Popen(
            [sys.executable, *args],
            cwd=ROOT,
            env=child_env(**env),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        for name, (args, env) in cases.items()
    }
    out = {}
    for name, proc in procs.items():
        try:
            text, _ = proc.communicate(timeout=STARTUP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
        out[name] = (proc.returncode, text)
    return out, paths


# The command line exits with 2 (a user's error, as documented) for every checkpoint that cannot serve, including
# one that loads but cannot classify (it used to exit 3 for that one); plain uvicorn uses its own code for a
# failed startup, 3.
@pytest.mark.parametrize(
    "how,what,code",
    [
        ("cli", "missing", 2),
        ("cli", "unclassifiable", 2),
        ("uvicorn", "missing", 3),
        ("uvicorn", "corrupt", 3),
        ("uvicorn", "unclassifiable", 3),
    ],
)
def test_bad_checkpoint_stops_startup_with_one_clear_message(failed_startups, how, what, code):
    from .test_serving_checkpoints import REFUSALS

    results, paths = failed_startups
    rc, text = results[f"{how}-{what}"]
    assert rc == code, text
    assert str(paths[what]) in text
    assert REFUSALS[what] in " ".join(text.split()), text
    assert "Traceback" not in text
    assert "Uvicorn running" not in text  # it never started listening


# ----------------------------------------------------------------------------- the benchmark


@pytest.mark.bench
def test_benchmark_quick_mode_runs(tmp_path):
    out = tmp_path / "serving.json"
    r = subprocess.run(
        [
            sys.executable,
            "scripts/bench_serving.py",
            "--quick",
            "--levels",
            "1,4",
            "--duration",
            "0.5",
            "--output",
            str(out),
        ],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
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


@pytest.mark.bench
def test_benchmark_overload_quick_mode_runs(tmp_path):
    out = tmp_path / "serving_overload.json"
    r = subprocess.run(
        [sys.executable, "scripts/bench_serving.py", "--overload", "--quick", "--output", str(out)],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert report["quick"] is True and report["provenance"]["git_commit"] and report["provenance"]["command"]
    (row,) = report["levels"]
    after = row["after"]
    assert after["sent"] > 0 and after["answered"] + after["shed"] + after["errors"] == after["sent"]
    assert {"p50", "p95", "p99"} <= set(after["latency_answered_ms"])
    for burst in report["abandoned"]["after"].values():
        assert burst["probe_status"] == 200 and burst["computed"]["batch_calls_run"] <= 1  # at most one in the model
    assert out.with_suffix(".png").stat().st_size > 1000
