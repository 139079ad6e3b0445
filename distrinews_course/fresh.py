"""One measurement in a FRESH process: fn() runs in a child forked from this process, so that the child's peak
resident memory is the measurement's own (a process that already ran something keeps freed memory in its heap,
and a later run would reuse it without raising the peak). Chapter 06's way (scripts/memory_footprint.py)."""

from __future__ import annotations

import json
import os
import sys

from .harden import die_with_parent


def in_child(fn, what: str = "a run"):
    """fn() in a forked child; its JSON-able result, or the child's error (which is raised here, as a RuntimeError
    that starts with `what`). Only before this process has joined a process group: a fork never copies a lock
    that a store's or gloo's thread holds."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read)
        code = 0
        try:
            die_with_parent()
            payload = {"ok": fn()}
        except BaseException as e:  # noqa: BLE001  (reported to the parent, which raises it)
            import traceback

            payload, code = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}, 1
        with os.fdopen(write, "w") as f:
            f.write(json.dumps(payload, default=str))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    os.waitpid(pid, 0)
    payload = json.loads(text) if text else {"error": "the child process died without a word (killed? out of memory?)"}
    if "error" in payload:
        raise RuntimeError(f"{what} failed in its child process:\n{payload['error']}")
    return payload["ok"]
