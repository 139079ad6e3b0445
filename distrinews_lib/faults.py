"""Deliberate failures for the fault-tolerance tests and the course's live demo, installed from OUTSIDE the
training script: this wrapper registers a hook on every optimizer step, then runs the script unchanged.
Nothing in the training path knows about faults.

    torchrun --nproc_per_node=2 distrinews_lib/faults.py kill:rank=1:step=7 scripts/train_ddp.py ARGS...
    launch.torchrun(faults.WRAPPER, 2, ["kill:rank=1:step=7", "scripts/train_ddp.py", *args])

    kill:rank=1:step=7     rank 1 SIGKILLs itself after optimizer step 7
    raise:rank=0:step=3    rank 0 raises an exception after step 3
    hang:rank=1:step=2     rank 1 stops joining collectives (sleeps) after step 2

A fault fires on the first attempt only (TORCHELASTIC_RESTART_COUNT=0), so a run restarted by
`torchrun --max-restarts` goes on, as it would after a real preemption.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
from pathlib import Path

WRAPPER = str(Path(__file__).resolve())
KINDS = ("kill", "raise", "hang")


def parse(spec: str) -> dict:
    """'kill:rank=1:step=7' -> {'kind': 'kill', 'rank': 1, 'step': 7}. Raises UserError when malformed."""
    from distrinews_lib.errors import UserError

    kind, *fields = spec.split(":")
    if kind not in KINDS:
        raise UserError(f"fault '{spec}': unknown kind '{kind}'. Use kill, raise or hang, e.g. kill:rank=1:step=7.")
    out = {"kind": kind, "rank": 0, "step": 1}
    for f in fields:
        key, sep, value = f.partition("=")
        if key not in ("rank", "step") or not sep or not value.isdigit():
            raise UserError(f"fault '{spec}': '{f}' should be rank=R or step=N with a whole number, e.g. kill:rank=1:step=7.")
        out[key] = int(value)
    if out["step"] < 1:
        raise UserError(f"fault '{spec}': step counts optimizer steps from 1.")
    return out


def install(fault: dict) -> None:
    """Fire `fault` after the given optimizer step on the given rank (first attempt only)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" or int(os.environ.get("RANK", 0)) != fault["rank"]:
        return
    steps = [0]

    def after_step(optimizer, args, kwargs):
        steps[0] += 1
        if steps[0] != fault["step"]:
            return
        print(f"[rank {fault['rank']}] injected fault: {fault['kind']} after step {steps[0]}", flush=True)
        if fault["kind"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault["kind"] == "raise":
            raise RuntimeError(f"injected failure on rank {fault['rank']} after step {steps[0]}")
        time.sleep(3600)  # hang: the other ranks wait in their next collective until --ddp_timeout

    register_optimizer_step_post_hook(after_step)


def main(argv=None) -> None:
    from distrinews_lib.errors import UserError, main_guard

    @main_guard
    def run():
        args = sys.argv[1:] if argv is None else argv
        if len(args) < 2:
            raise UserError("usage: faults.py KIND:rank=R:step=N SCRIPT [ARGS...]  (e.g. kill:rank=1:step=7 scripts/train_ddp.py)")
        install(parse(args[0]))
        sys.argv = args[1:]
        runpy.run_path(args[1], run_name="__main__")

    run()


if __name__ == "__main__":
    main()
