"""A serving process started from a notebook cell as an operator starts it (chapter 10), and always stopped again.

    server = start_server("checkpoints/distilbert_agnews.pt")     # python -m distrinews_lib.serving, a free port
    status, answer = call(server.base, "POST", "/predict", {"text": "..."})
    stop_server(server)
    left_behind(server)                                         # afterwards: nothing of it is left
    with running_server("checkpoints/distilbert_agnews.pt", "--max-batch-size", "1") as srv: ...

A server does not end by itself, so: `subprocess.Popen` (never `!python ...`, which blocks the cell) on a free port
with its log in a file; wait for /health with a deadline, and if the process exits first raise ServerDidNotStart with
its exit code and its own words; stop it with SIGTERM to its process group (SIGKILL only if it has not exited after
10 s). Linux also sends it SIGTERM when the notebook's kernel dies, so a crashed kernel leaves no server behind.
HTTP goes through urllib from the standard library.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from distrinews_lib.distributed import free_port


class ServerDidNotStart(RuntimeError):
    """The server process exited before /health said ok: its exit code and the last lines it wrote."""

    def __init__(self, exit_code: int, log: str):
        self.exit_code, self.log = exit_code, log
        super().__init__(f"the server exited with code {exit_code} before it was ready; it said:\n{log}")


def serve_command(checkpoint, port: int, *flags) -> list[str]:
    """The operator's command line: the server's CLI on 127.0.0.1:`port`, warnings-only logs, any extra flags."""
    return [
        sys.executable,
        "-m",
        "distrinews_lib.serving",
        "--checkpoint",
        str(checkpoint),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *map(str, flags),
    ]


def _request(base, method, path, body=None, timeout=30):
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw, headers = resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as err:
        status, raw, headers = err.code, err.read(), err.headers
    if not raw:  # HEAD: headers only
        return status, None, headers
    parsed = json.loads(raw) if "json" in headers.get("Content-Type", "") else raw.decode("utf-8", "replace")
    return status, parsed, headers


def call(base, method, path, body=None, timeout=30):
    """(status, parsed JSON or text) for one HTTP request; 4xx/5xx answers are returned, not raised. `body`: a Python
    object sent as JSON, or bytes sent as they are."""
    status, parsed, _ = _request(base, method, path, body, timeout)
    return status, parsed


def batch_sender(base, timeout=30):
    """send(texts) -> (status, answer, retry_after): one POST /predict/batch of `texts`; retry_after is the seconds
    a 503's Retry-After header asks the client to wait (None without one)."""

    def send(texts):
        status, answer, headers = _request(base, "POST", "/predict/batch", {"texts": list(texts)}, timeout)
        wait = headers.get("Retry-After")
        return status, answer, float(wait) if wait is not None else None

    return send


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log_path: Path
    command: list
    ready_after_s: float | None = None
    signals_sent: list = field(default_factory=list)

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n=20):
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:]) if self.log_path.exists() else ""


def _die_with_parent() -> None:
    # In the child, before exec: Linux sends it SIGTERM when the process that started it (the kernel) dies.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_server(checkpoint, *flags, timeout: float = 120, log_path="outputs/serving/server.log", quiet=False):
    """Start the server's CLI on a free port and return once /health answers ok; ServerDidNotStart if it exits
    first (a missing or broken checkpoint, a bad flag), TimeoutError after `timeout` s."""
    port, log_path = free_port(), Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = serve_command(checkpoint, port, *flags)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
    server = Server(proc, port, log_path, command)
    atexit.register(stop_server, server)  # a safety net if the kernel exits while the server runs
    started = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                raise ServerDidNotStart(proc.returncode, server.log_tail())
            with contextlib.suppress(OSError):
                status, health = call(server.base, "GET", "/health", timeout=2)
                if status == 200 and health.get("status") == "ok":
                    break
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"/health did not answer 'ok' within {timeout} s:\n{server.log_tail()}")
            time.sleep(0.1)
    except BaseException:
        stop_server(server)
        raise
    server.ready_after_s = time.monotonic() - started
    if not quiet:
        print(f"server pid {proc.pid} ready at {server.base} after {server.ready_after_s:.1f} s")
    return server


def stop_server(server: Server) -> None:
    """SIGTERM to the server's process group (uvicorn shuts down cleanly), SIGKILL if it has not exited after 10 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if server.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.proc.pid, sig)
            server.signals_sent.append(sig.name)
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.proc.wait(timeout=10)


@contextlib.contextmanager
def running_server(checkpoint, *flags, timeout: float = 120, log_path="outputs/serving/server.log", quiet=True):
    """start_server, yield it, and stop it however the block ends."""
    server = start_server(checkpoint, *flags, timeout=timeout, log_path=log_path, quiet=quiet)
    try:
        yield server
    finally:
        stop_server(server)


@dataclass
class Leftovers:
    """What of a stopped server is still there."""

    pid: int
    port: int
    exit_code: int | None
    signals_sent: list
    group_alive: bool  # any process of its group still exists
    port_answer: int  # connect_ex's answer on its port: ECONNREFUSED when nothing listens

    @property
    def nothing(self) -> bool:
        return not self.group_alive and self.port_answer == errno.ECONNREFUSED

    def __str__(self) -> str:
        return (
            f"server {self.pid}: exit code {self.exit_code} after {' then '.join(self.signals_sent) or 'no signal'}; "
            f"process group {'still alive' if self.group_alive else 'gone'}; "
            f"port {self.port}: {errno.errorcode.get(self.port_answer, self.port_answer)}"
        )


def left_behind(server: Server) -> Leftovers:
    """Ask the system, not the Popen object, whether the server is gone: signal 0 to its process group, and a
    connection attempt on its port."""
    alive = True
    try:
        os.killpg(server.proc.pid, 0)  # signal 0: only asks whether any process of the group exists
    except ProcessLookupError:
        alive = False
    with socket.socket() as s:
        s.settimeout(2)
        port_answer = s.connect_ex(("127.0.0.1", server.port))
    return Leftovers(
        server.proc.pid, server.port, server.proc.returncode, list(server.signals_sent), alive, port_answer
    )


def answers_disagree(results: list[dict], probs, labels: list[str], tolerance: float = 1e-4) -> str | None:
    """None when every served answer is the local model's (the label its largest probability's, each probability
    within `tolerance`), else the first difference in a sentence. 1e-4: the server pads a text among others in its
    batch, and padding moves a probability by float rounding only (about 1e-7), while a different model or a
    different tokenization moves it by far more."""
    if len(results) != len(probs):
        return f"{len(results)} answers for {len(probs)} texts"
    for i, (result, p) in enumerate(zip(results, probs)):
        want = labels[int(p.argmax())]
        if result["label"] != want:
            return f"text {i}: the server said {result['label']}, the model here {want}"
        for name, q in zip(labels, p):
            got = result["all_probabilities"][name]
            if abs(got - float(q)) > tolerance:
                return f"text {i}: P({name}) is {got:.6f} from the server, {float(q):.6f} here"
    return None
