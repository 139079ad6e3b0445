"""The hang doctor at work in each rank: it watches this rank's collectives, answers the other ranks' questions, and
when a collective has waited too long (or failed), one rank asks every rank for its state and prints the verdict.

- Before the process group starts, arm() turns the Flight Recorder on (TORCH_FR_BUFFER_SIZE) and starts a thread.
- Once the group is up, the thread serves this rank's state over HTTP (a small server of its own: it answers while
  the main thread waits in a collective or runs Python) and leaves its address in the group's store.
- Every POLL_S it reads the Flight Recorder's counters (enqueued vs completed, microseconds): a collective still
  waiting after `after_s` seconds fires a report. A collective that fails on the main thread (a dead peer closes its
  connection at once) fires one too, through torch's c10d logger or the training scripts' error handler.
- The first rank to fire takes the report (an atomic counter in the store; if the store died with rank 0, the lowest
  rank that still answers), fetches every rank's state (a rank that does not answer is dead) and prints one paragraph.
- Rank 0 also compares when each rank called each collective, now and then: a rank the others keep waiting for is
  reported once as a straggler.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..errors import UserError
from .verdict import Call, RankState, death_verdict, hang_verdict, straggler_verdict

POLL_S = 0.5  # how often a rank reads its Flight Recorder's counters (each read: ~10 microseconds)
FETCH_S = 2.0  # how long the reporter waits for a rank's state; a rank that does not answer by then counts as dead
BUFFER = "512"  # Flight Recorder entries per rank, unless TORCH_FR_BUFFER_SIZE says more
CALLS_KEPT = 96  # the last calls of each process group a state carries
PREFIX = "distrinews_hang_doctor/"


def grace_s(after_s: float) -> float:
    """How much longer the process group waits than the doctor: time for the report to come from ranks that are all
    still alive. As long as the wait itself, at least 3 s, at most 30 s."""
    return min(30.0, max(3.0, after_s))


def _parse_call(entry: dict) -> Call:
    frames = tuple((f.get("filename", "?"), int(f.get("line", 0)), f.get("name", "?")) for f in entry.get("frames", []))
    return Call(
        pg=str(entry.get("pg_id", entry.get("process_group", ["0"])[0])),
        seq=int(entry["collective_seq_id"]),
        op=str(entry["profiling_name"]).split(":", 1)[-1],
        sizes=tuple(tuple(s) for s in entry.get("input_sizes", [])),
        dtypes=tuple(entry.get("input_dtypes", [])),
        done=bool(entry.get("retired", True)),
        t_ns=int(entry.get("time_created_ns", 0)),
        where=frames,
        timeout_s=int(entry.get("timeout_ms", 0)) / 1000,
    )


def recorded_calls() -> list:
    """This rank's Flight Recorder entries as Calls, the last CALLS_KEPT of each process group. From the JSON dump,
    without the entries' stack traces: formatting those loads torch._dynamo on first use (1.2 s, 800 modules)."""
    from torch._C import _distributed_c10d as c10d

    entries = json.loads(c10d._dump_fr_trace_json()).get("entries", [])
    calls = [_parse_call(e) for e in entries if not e.get("is_p2p")]
    keep = []
    for pg in {c.pg for c in calls}:
        keep += [c for c in calls if c.pg == pg][-CALLS_KEPT:]
    return sorted(keep, key=lambda c: (c.t_ns, c.seq))


def recorder_status() -> dict:
    """{process group: (last enqueued, last completed)} from the Flight Recorder's counters (cheap: no entries)."""
    from torch._C import _distributed_c10d as c10d

    status = json.loads(c10d._dump_fr_trace_json(includeCollectives=False)).get("pg_status", {})
    return {pg: (int(v["last_enqueued_collective"]), int(v["last_completed_collective"])) for pg, v in status.items()}


def main_stack() -> list:
    """The main thread's frames, innermost first."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return []
    return [(f.filename, f.lineno, f.name) for f in reversed(traceback.extract_stack(frame))]


def state_to_json(s: RankState) -> dict:
    return {
        "rank": s.rank,
        "pid": s.pid,
        "host": s.host,
        "now_ns": s.now_ns,
        "failed": s.failed,
        "stack": [list(f) for f in s.stack],
        "calls": [
            {**c.__dict__, "sizes": [list(x) for x in c.sizes], "where": [list(f) for f in c.where]} for c in s.calls
        ],
    }


def state_from_json(d: dict) -> RankState:
    calls = [
        Call(
            **{
                **c,
                "sizes": tuple(tuple(x) for x in c["sizes"]),
                "dtypes": tuple(c["dtypes"]),
                "where": tuple(tuple(f) for f in c["where"]),
            }
        )
        for c in d["calls"]
    ]
    return RankState(d["rank"], calls, [tuple(f) for f in d["stack"]], d["pid"], d["host"], d["now_ns"], d["failed"])


class Doctor:
    def __init__(self, after_s: float, out_dir: str | None = None, stream=None):
        self.after_s, self.out_dir, self.stream = float(after_s), out_dir, stream or sys.stderr
        self.rank, self.world, self.urls, self.store = None, None, {}, None
        self.failed: str | None = None
        self.failed_where: tuple = ()  # where this rank's failed collective was called, innermost first
        self.reported = threading.Event()
        self.straggler_reported = False
        self.lock = threading.Lock()
        self.server = None
        self.thread = threading.Thread(target=self._run, name="hang-doctor", daemon=True)

    # ------------------------------------------------------------------ this rank's side
    def state(self) -> RankState:
        """What this rank tells: its recent collectives, and its main thread's stack, which is also where its waiting
        collective (if one waits) was called from."""
        calls, stack = recorded_calls(), main_stack()
        waiting = [c for c in calls if not c.done]
        if waiting:
            waiting[0].where = tuple(stack)
        elif self.failed and calls:  # the failed collective, retired by its failure: where the error was raised
            calls[-1].where = self.failed_where
        rank = self.rank if self.rank is not None else int(os.environ.get("RANK", 0))
        return RankState(rank, calls, stack, os.getpid(), socket.gethostname(), time.time_ns(), self.failed)

    def _serve(self) -> None:
        doctor = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                try:
                    body = json.dumps(state_to_json(doctor.state())).encode()
                    self.send_response(200)
                except Exception as err:  # noqa: BLE001 (the asking rank reports it)
                    body, _ = f"{type(err).__name__}: {err}".encode(), self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):  # noqa: N802 (another rank has printed the report: this one stays quiet)
                doctor.reported.set()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):  # quiet: a healthy run prints nothing
                pass

        local = os.environ.get("MASTER_ADDR", "localhost") in ("localhost", "127.0.0.1", "::1")
        self.server = ThreadingHTTPServer(("127.0.0.1" if local else "0.0.0.0", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="hang-doctor-server", daemon=True).start()

    def _exchange(self) -> None:
        """Every rank's address, through the group's store, while every rank is alive. A rank that has not left its
        address within max(30 s, after_s) has none: the report counts it as not answering."""
        from datetime import timedelta

        import torch.distributed as dist

        self.store = dist.distributed_c10d._get_default_store()
        host = "127.0.0.1" if self.server.server_address[0] == "127.0.0.1" else socket.gethostname()
        self.store.set(f"{PREFIX}url/{self.rank}", f"http://{host}:{self.server.server_address[1]}")
        deadline = time.monotonic() + max(30.0, self.after_s)
        for r in range(self.world):
            try:
                left = max(0.1, deadline - time.monotonic())
                self.store.wait([f"{PREFIX}url/{r}"], timedelta(seconds=left))
                self.urls[r] = self.store.get(f"{PREFIX}url/{r}").decode()
            except Exception:  # noqa: BLE001 (torch raises its own DistStoreError on a timeout)
                continue

    # ------------------------------------------------------------------ the watch
    def _run(self) -> None:
        import torch.distributed as dist

        while not dist.is_initialized():
            time.sleep(0.1)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        try:
            self._serve()
            self._exchange()
        except Exception as err:  # noqa: BLE001 (a doctor that cannot start must not stop the job)
            self._say(f"cannot start ({type(err).__name__}: {err}); this run has no hang doctor.")
            return
        seen: dict = {}  # (pg, seq) of a waiting collective -> when this rank first saw it waiting
        limits: dict = {}  # (pg, seq) -> how long it may wait before the doctor reports
        next_check, every = time.monotonic() + 1.0, 1.0
        while not self.reported.is_set():
            time.sleep(POLL_S)
            try:
                status = recorder_status()
            except Exception:  # noqa: BLE001 (the group is being torn down)
                return
            now = time.monotonic()
            waiting = {(pg, max(done, 0) + 1) for pg, (queued, done) in status.items() if queued > done}
            seen = {k: seen.get(k, now) for k in waiting}
            late = [(now - t, k) for k, t in seen.items() if now - t >= self.after_s]
            for waited, key in late:
                if key not in limits:
                    limits[key] = self._limit(key)
                if waited >= limits[key]:
                    self.report(waited_s=waited)
                    break
            if self.rank == 0 and not self.straggler_reported and not late and now >= next_check:
                self._check_straggler()
                every = min(30.0, 1.5 * every)  # often at first: a short run has few chances
                next_check = now + every

    def _limit(self, key) -> float:
        """How long the collective `key` may wait: after_s, or longer in a group whose own timeout is longer (a wait
        its author gave more time, like a barrier for a slow save): until grace_s before that timeout. For ever when
        its entry says it completed: the counters lag behind for DDP's asynchronous all-reduces."""
        call = next((c for c in recorded_calls() if (c.pg, c.seq) == key), None)
        if call is None or call.done:
            return float("inf")
        own = call.timeout_s - grace_s(self.after_s) if call.timeout_s else 0.0
        return max(self.after_s, own)

    # ------------------------------------------------------------------ the report
    def _fetch(self, rank: int) -> RankState | None:
        if rank == self.rank:
            return self.state()
        try:
            url = self.urls[rank] + "/state"
            with urllib.request.urlopen(url, timeout=FETCH_S) as resp:
                return state_from_json(json.loads(resp.read()))
        except (OSError, ValueError, KeyError, urllib.error.URLError):
            return None

    def _states(self) -> dict:
        with ThreadPoolExecutor(max_workers=min(16, self.world)) as pool:
            return dict(zip(range(self.world), pool.map(self._fetch, range(self.world))))

    def _claim(self, states: dict) -> bool:
        """Is this rank the one to report? The first to ask the store; the lowest rank that answered when rank 0 is
        dead (the store may have lived in rank 0's process) or the store does not answer."""
        live = [r for r, s in states.items() if s is not None]
        if states.get(0) is not None:
            try:
                return self.store.add(f"{PREFIX}claimed", 1) == 1
            except Exception:  # noqa: BLE001 (torch raises its own store errors)
                pass
        return bool(live) and self.rank == min(live)

    def report(self, waited_s: float | None = None, error: BaseException | None = None, dying: bool = False) -> None:
        """Collect every rank's state, decide, and print the verdict if this rank is the first to report. dying: this
        rank is ending with `error` (its own exception, not a collective's); it names itself, and the collective the
        others wait in."""
        if self.rank is None or not self.urls:
            return
        with self.lock:
            if self.reported.is_set():
                return
            if error is not None:
                self.failed = f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
                tb = traceback.extract_tb(error.__traceback__) if error.__traceback__ else None
                self.failed_where = tuple((f.filename, f.lineno, f.name) for f in reversed(tb)) if tb else main_stack()
            states = self._states()
            if dying:
                verdict = death_verdict(self.rank, self.failed, self.failed_where, states)
            else:
                verdict = hang_verdict(states, self.world, waited_s)
            claimed = self._claim(states)
            self.reported.set()
            if claimed:
                self._say(f"{verdict.text} (rank {self.rank} reports.)")
                self._keep({"verdict": verdict.as_dict(), "reporter": self.rank, "waited_s": waited_s}, states)
                self._tell_others(states)

    def _tell_others(self, states: dict) -> None:
        """Every rank that answered learns that the report is out (a rank whose error comes later stays quiet, even
        when the store that held the claim died with rank 0)."""
        for r, s in states.items():
            if s is not None and r != self.rank:
                try:
                    req = urllib.request.Request(self.urls[r] + "/reported", data=b"", method="POST")
                    urllib.request.urlopen(req, timeout=FETCH_S).close()
                except OSError:
                    pass

    def _check_straggler(self) -> None:
        states = {}
        for r in range(self.world):
            sent = time.time_ns()
            s = self._fetch(r)
            if s is None:
                return
            # one machine, one clock: an offset estimated over HTTP would only add a busy machine's delays to it
            same = s.host == socket.gethostname()
            states[r] = (s, 0 if same else s.now_ns - (sent + time.time_ns()) // 2)
        verdict = straggler_verdict(
            {r: s.calls for r, (s, _) in states.items()}, {r: o for r, (_, o) in states.items()}
        )
        if verdict is not None:
            self.straggler_reported = True
            self._say(verdict.text)
            self._keep({"verdict": verdict.as_dict(), "reporter": self.rank}, {r: s for r, (s, _) in states.items()})

    def _say(self, text: str) -> None:
        self.stream.write(f"[hang doctor] {text}\n")
        self.stream.flush()

    def _keep(self, verdict: dict, states: dict) -> None:
        if not self.out_dir:
            return
        folder = Path(self.out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        name = "straggler" if verdict["verdict"]["kind"] == "straggler" else "hang"
        payload = {**verdict, "states": {r: (state_to_json(s) if s else None) for r, s in states.items()}}
        tmp = folder / f".{name}.json.{os.getpid()}"
        tmp.write_text(json.dumps(payload, indent=1))
        tmp.replace(folder / f"{name}.json")


_DOCTOR: Doctor | None = None


def arm(after_s: float, out_dir: str | None = None, stream=None) -> float:
    """Turn the doctor on in this process, before init_process_group. Returns the timeout to give the process group:
    after_s + grace_s(after_s), so that the ranks are still alive when the doctor reports at after_s."""
    global _DOCTOR
    if _DOCTOR is None:
        if os.environ.get("TORCH_FR_BUFFER_SIZE", "0") in ("", "0"):
            os.environ["TORCH_FR_BUFFER_SIZE"] = BUFFER
        _DOCTOR = Doctor(after_s, out_dir, stream)
        _hook_c10d_errors()
        _hook_excepthook()
        _DOCTOR.thread.start()
    return after_s + grace_s(after_s)


def armed() -> Doctor | None:
    return _DOCTOR


COLLECTIVE_SIGNS = ("timed out", "timeout", "connection closed", "connection reset", "gloo", "nccl", "mismatch")


def collective_failure(error: BaseException) -> bool:
    """A collective's failure (a timeout, a peer that closed its connection), as opposed to this rank's own error."""
    import torch.distributed as dist

    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    return isinstance(error, RuntimeError) and any(s in str(error).lower() for s in COLLECTIVE_SIGNS)


def on_error(error: BaseException, collective: bool | None = None) -> None:
    """This rank met `error`: a failed collective (a peer died, a timeout), or its own exception, which is about to end
    it (dying). Report now, unless a report was made. A user's mistake (UserError) or an interrupt is not a hang.
    On the main thread, a SIGTERM from torchrun (stopping the job because a rank failed) waits until the paragraph is
    out."""
    doctor = _DOCTOR
    if doctor is None or doctor.reported.is_set() or isinstance(error, (UserError, KeyboardInterrupt, SystemExit)):
        return
    dying = not (collective_failure(error) if collective is None else collective)
    if threading.current_thread() is not threading.main_thread():
        doctor.report(error=error, dying=dying)
        return
    deferred = []
    previous = signal.signal(signal.SIGTERM, lambda *_: deferred.append(True))
    try:
        doctor.report(error=error, dying=dying)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if deferred:
            os.kill(os.getpid(), signal.SIGTERM)


def _hook_excepthook() -> None:
    """A script run without the course's launcher ends an uncaught exception through sys.excepthook."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        on_error(value)
        previous(kind, value, tb)

    sys.excepthook = hook


def _hook_c10d_errors() -> None:
    """torch logs every failed collective call (all_reduce, barrier...) to its c10d logger before raising it: a
    handler there hears of the failure on the calling thread, before the script's own `except` does."""
    import logging

    try:
        from torch.distributed import c10d_logger
    except ImportError:
        return

    class OnError(logging.Handler):
        def emit(self, record):
            msg = record.msg if isinstance(record.msg, dict) else {}
            if "error" in msg:
                on_error(RuntimeError(msg["error"]), collective=True)

    logger = getattr(c10d_logger, "_c10d_logger", None)
    if logger is not None:
        logger.addHandler(OnError(level=logging.DEBUG))
