"""Deliberate failures for the fault-tolerance tests and the course's live demo, installed from OUTSIDE the
training script: this wrapper registers a hook on every optimizer step, then runs the script unchanged.
Nothing in the training path knows about faults.

    torchrun --nproc_per_node=2 distrinews_course/faults.py kill:rank=1:step=7 scripts/train_ddp.py ARGS...
    launch.torchrun(faults.WRAPPER, 2, ["kill:rank=1:step=7", "scripts/train_ddp.py", *args])

    kill:rank=1:step=7     rank 1 SIGKILLs itself after optimizer step 7
    raise:rank=0:step=3    rank 0 raises an exception after step 3
    hang:rank=1:step=2     rank 1 stops joining collectives (sleeps) after step 2

    faults.tidy(result.lines)   # the scripts' error/warning paragraphs, in whole sentences, for a notebook to show

A fault fires once per run, so a run restarted by `torchrun --max-restarts` goes on, as it would after a
real preemption: not on a restarted attempt (TORCHELASTIC_RESTART_COUNT > 0), and, when the script has an
--output folder, not after a marker there says it fired. The marker matters on several nodes: a replacement
node starts a fresh agent whose restart count is 0 again (the folder is shared: snapshots need it anyway).
"""

from __future__ import annotations

import os
import re
import runpy
import signal
import sys
import textwrap
import time
from pathlib import Path

from torch.optim.optimizer import register_optimizer_step_post_hook

from distrinews_lib.errors import UserError, main_guard  # absolute: this file also runs as a script (see WRAPPER)

WRAPPER = str(Path(__file__).resolve())
KINDS = ("kill", "raise", "hang")


def parse(spec: str) -> dict:
    """'kill:rank=1:step=7' -> {'kind': 'kill', 'rank': 1, 'step': 7}. Raises UserError when malformed."""
    kind, *fields = spec.split(":")
    if kind not in KINDS:
        raise UserError(f"fault '{spec}': unknown kind '{kind}'. Use kill, raise or hang, e.g. kill:rank=1:step=7.")
    out = {"kind": kind, "rank": 0, "step": 1}
    for f in fields:
        key, sep, value = f.partition("=")
        if key not in ("rank", "step") or not sep or not value.isdigit():
            raise UserError(
                f"fault '{spec}': '{f}' should be rank=R or step=N with a whole number, e.g. kill:rank=1:step=7."
            )
        out[key] = int(value)
    if out["step"] < 1:
        raise UserError(f"fault '{spec}': step counts optimizer steps from 1.")
    return out


def marker_for(fault: dict, script_args: list) -> Path | None:
    """Where the fault notes that it fired: a file in the script's --output folder (None without one)."""
    for i, arg in enumerate(script_args):
        if arg == "--output" and i + 1 < len(script_args):
            out = script_args[i + 1]
        elif arg.startswith("--output="):
            out = arg.partition("=")[2]
        else:
            continue
        return Path(out) / f".fault_fired_{fault['kind']}_rank{fault['rank']}_step{fault['step']}"
    return None


def install(fault: dict, marker: Path | None = None) -> None:
    """Fire `fault` after the given optimizer step on the given rank, once per run (see the module's docstring)."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" or int(os.environ.get("RANK", 0)) != fault["rank"]:
        return
    if marker is not None and marker.exists():
        print(
            f"[rank {fault['rank']}] fault {fault['kind']} after step {fault['step']} already fired in this run "
            f"({marker}): not again",
            flush=True,
        )
        return
    steps = [0]

    def after_step(optimizer, args, kwargs):
        steps[0] += 1
        if steps[0] != fault["step"]:
            return
        print(f"[rank {fault['rank']}] injected fault: {fault['kind']} after step {steps[0]}", flush=True)
        if marker is not None:  # written before firing: a SIGKILL leaves no chance afterwards
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        if fault["kind"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault["kind"] == "raise":
            raise RuntimeError(f"injected failure on rank {fault['rank']} after step {steps[0]}")
        time.sleep(3600)  # hang: the other ranks wait in their next collective until --ddp_timeout

    register_optimizer_step_post_hook(after_step)


def whole_words(text: str, min_len: int = 60) -> str:
    """`text` with each long parenthesis that stops mid-sentence ended at its last whole sentence, marked "…": the
    scripts quote the first line of a library's error cut to a length, so "(... reset by peer. This is typi)"
    becomes "(... reset by peer. …)". Short parentheses, and those without a full stop inside, stay as they are."""

    def end(m):
        inner = m.group(1)
        if len(inner) < min_len or inner.rstrip().endswith((".", "!", "?")) or ". " not in inner:
            return m.group(0)
        return "(" + inner[: inner.rindex(". ") + 1] + " …)"

    return re.sub(r"\(([^()]*)\)", end, text)


def tidy(lines, width: int = 100) -> list[str]:
    """Output lines with each `error:`/`warning:` paragraph (its first line, then lines indented by 7 spaces) joined,
    passed through whole_words and wrapped again as the scripts wrap it; every other line unchanged."""
    out: list[str] = []
    para: list[str] | None = None

    def flush():
        if para:
            out.extend(
                textwrap.wrap(whole_words(" ".join(x.strip() for x in para)), width=width, subsequent_indent="       ")
            )

    for line in lines:
        if para is not None and line.startswith("       ") and line.strip():
            para.append(line)
            continue
        flush()
        para = [line] if line.startswith(("error:", "warning:")) else None
        if para is None:
            out.append(line)
    flush()
    return out


def main(argv=None) -> None:
    @main_guard
    def run():
        args = sys.argv[1:] if argv is None else argv
        if len(args) < 2:
            raise UserError(
                "usage: faults.py KIND:rank=R:step=N SCRIPT [ARGS...]  (e.g. kill:rank=1:step=7 scripts/train_ddp.py)"
            )
        fault = parse(args[0])
        install(fault, marker_for(fault, args[2:]))
        sys.argv = args[1:]
        runpy.run_path(args[1], run_name="__main__")

    run()


if __name__ == "__main__":
    main()
