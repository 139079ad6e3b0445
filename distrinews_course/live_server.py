"""A serving process started from a notebook cell, and always stopped again (chapter 10).

    with running_server("checkpoints/distilbert_agnews.pt") as srv:
        status, answer = call(srv.base, "POST", "/predict", {"text": "..."})
    alive, port_answer = left_behind(srv)     # afterwards: nothing of it is left

A server does not end by itself, so: `subprocess.Popen` (never `!python ...`, which blocks the cell) on a free port
with its log in a file; wait for /health with a deadline, showing the log if the process dies first; stop it in a
`finally` (SIGTERM to its process group, SIGKILL only if it has not exited after 10 s), also on a failed check.
HTTP goes through urllib from the standard library.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from distrinews_lib.distributed import free_port
from distrinews_lib.serving.settings import serve_command


def call(base, method, path, body=None, timeout=30):
    """(status, parsed JSON or text) for one HTTP request; 4xx/5xx answers are returned, not raised."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as err:
        status, raw, ctype = err.code, err.read(), err.headers.get("Content-Type", "")
    if not raw:  # HEAD: headers only
        return status, None
    return status, (json.loads(raw) if "json" in ctype else raw.decode("utf-8", "replace"))


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log_path: Path
    signals_sent: list = field(default_factory=list)

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n=20):
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:]) if self.log_path.exists() else ""


def stop(server: Server) -> None:
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
def running_server(checkpoint, timeout: float = 120, log_path="outputs/serving/server.log", quiet: bool = False):
    """Start `python -m distrinews_lib.serving` on a free port, yield it once /health says ok, always stop it."""
    port = free_port()
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            serve_command(checkpoint, port),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(proc, port, log_path)
    atexit.register(stop, server)  # a safety net if the kernel exits while the server runs
    try:
        deadline, started = time.monotonic() + timeout, time.monotonic()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited with code {proc.returncode} before it was ready:\n{server.log_tail()}"
                )
            with contextlib.suppress(OSError):
                status, health = call(server.base, "GET", "/health", timeout=2)
                if status == 200 and health.get("status") == "ok":
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"/health did not answer 'ok' within {timeout} s:\n{server.log_tail()}")
            time.sleep(0.25)
        if not quiet:
            print(f"server pid {proc.pid} ready at {server.base} after {time.monotonic() - started:.1f} s")
        yield server
    finally:
        stop(server)
        if not quiet:
            print(
                f"server stopped after {' then '.join(server.signals_sent) or 'no signal'} "
                f"(exit code {proc.returncode})"
            )


def left_behind(server: Server) -> tuple[bool, int]:
    """What of a stopped server is still there: (any process of its group alive, connect_ex's answer on its port)."""
    alive = True
    try:
        os.killpg(server.proc.pid, 0)  # signal 0: only asks whether any process of the group exists
    except ProcessLookupError:
        alive = False
    with socket.socket() as s:
        s.settimeout(2)
        port_answer = s.connect_ex(("127.0.0.1", server.port))
    return alive, port_answer
