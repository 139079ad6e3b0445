"""When, during a step, backward ran, each gradient became ready and each collective ran (chapter 03's Gantt charts).
The bytes a ring puts on the wire for each collective are distrinews_course/ring.py's (wire_bytes, also read here)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

from ..ring import wire_bytes  # noqa: F401  (the checker and chapter 03 read it here)


class Timeline:
    """When, during one step, backward ran, each gradient became ready and each all-reduce ran (for the Gantt chart).

    Seconds since start(); an async all-reduce's end is when its future completed (gloo's thread calls back)."""

    def __init__(self):
        self.t0, self.events, self.on = time.perf_counter(), [], False

    def start(self, on: bool = True) -> None:
        self.t0, self.events, self.on = time.perf_counter(), [], on

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def ready(self, name: str) -> None:
        if self.on:
            self.events.append({"kind": "ready", "name": name, "t": self.now()})

    @contextmanager
    def span(self, kind: str, name: str = ""):
        t = self.now()
        yield
        if self.on:
            self.events.append({"kind": kind, "name": name, "start": t, "end": self.now()})

    def comm(self, work, name: str, nbytes: int):
        """Record an async collective: launched now, ended when its future completes. Returns the work to wait on
        (the same one, or one whose wait() runs once however many threads call it: see when_done)."""
        if self.on:
            event = {"kind": "comm", "name": name, "start": self.now(), "end": None, "bytes": nbytes}
            self.events.append(event)
            return when_done(work, lambda: event.__setitem__("end", self.now()))
        return work


class WaitOnce:
    """A work handle whose wait() runs the real one once, whichever thread calls it first; later calls wait for that
    one. gloo's reduce-scatter copies its result into the output inside wait(): a second wait, late in another thread,
    would copy it again over what the rung has since added to it (an accumulated gradient)."""

    def __init__(self, work):
        self.work, self._lock, self._done = work, threading.Lock(), False

    def wait(self, *args):
        with self._lock:
            if not self._done:
                self.work.wait(*args)
                self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done

    def __getattr__(self, name):
        return getattr(self.work, name)


def when_done(work, callback):
    """callback() once `work` has completed: through its future, or (gloo's reduce-scatter has none) a thread that
    waits for it. Returns the handle the caller must wait on from now on: that thread and the caller share one wait."""
    try:
        future = work.get_future()
    except RuntimeError:
        once = work if isinstance(work, WaitOnce) else WaitOnce(work)

        def wait_then_call():
            try:
                once.wait()
            except Exception:  # noqa: BLE001  (a failed collective: whoever waits for it in the rung reports it)
                return
            callback()

        threading.Thread(target=wait_then_call, daemon=True).start()
        return once
    future.then(lambda fut: callback())
    return work
