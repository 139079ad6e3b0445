"""Deliberate failures, for the fault-tolerance tests and the live demo in the course. Off unless asked.

    DISTRINEWS_FAULT="kill:rank=1:step=7"    rank 1 SIGKILLs itself after optimizer step 7
    DISTRINEWS_FAULT="raise:rank=0:step=3"   rank 0 raises an exception after step 3
    DISTRINEWS_FAULT="hang:rank=1:step=2"    rank 1 stops joining collectives (sleeps) after step 2

A fault fires on the first attempt only (TORCHELASTIC_RESTART_COUNT=0), so a run restarted by
`torchrun --max-restarts` goes on, as it would after a real preemption.
"""

from __future__ import annotations

import os
import signal
import time

ENV = "DISTRINEWS_FAULT"


def parse(spec: str) -> dict:
    kind, *fields = spec.split(":")
    out = {"kind": kind, "rank": 0, "step": 1}
    for f in fields:
        key, _, value = f.partition("=")
        out[key] = int(value)
    if kind not in ("kill", "raise", "hang"):
        raise ValueError(f"{ENV}: unknown fault '{kind}' (kill, raise, hang)")
    return out


def maybe_inject(global_step: int) -> None:
    spec = os.environ.get(ENV)
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    fault = parse(spec)
    if int(os.environ.get("RANK", 0)) != fault["rank"] or global_step != fault["step"]:
        return
    print(f"[rank {fault['rank']}] injected fault: {fault['kind']} after step {global_step}", flush=True)
    if fault["kind"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault["kind"] == "raise":
        raise RuntimeError(f"injected failure on rank {fault['rank']} after step {global_step}")
    time.sleep(3600)  # hang: the other ranks wait in their next all-reduce until --ddp_timeout
