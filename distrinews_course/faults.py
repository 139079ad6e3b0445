"""Deliberate failures for the fault-tolerance tests and the course's live demo, installed from OUTSIDE the
training script: this wrapper registers a hook on every optimizer step, then runs the script unchanged.
Nothing in the training path knows about faults.

    torchrun --nproc_per_node=2 distrinews_course/faults.py kill:rank=1:step=7 scripts/train_ddp.py ARGS...
    launch.torchrun(faults.WRAPPER, 2, ["kill:rank=1:step=7", "scripts/train_ddp.py", *args])

    kill:rank=1:step=7     rank 1 SIGKILLs itself after optimizer step 7
    raise:rank=0:step=3    rank 0 raises an exception after step 3
    hang:rank=1:step=2     rank 1 stops joining collectives (sleeps) after step 2
    kill:rank=1:save=2     rank 1 SIGKILLs itself in its 2nd sharded save, once its shard is written and before the
                           checkpoint is committed (any DCP FileSystemWriter: scripts/train_sharded.py)

    faults.tidy(result.lines)   # the scripts' error/warning paragraphs, in whole sentences, for a notebook to show

With an --output folder, every rank also notes when it started and when it ended each optimizer step, in
OUTPUT/.fault_timeline.jsonl (one JSON line per event): the chapter draws the kill and the resume from it
(timeline(output) reads it back).

A fault fires once per run, so a run restarted by `torchrun --max-restarts` goes on, as it would after a
real preemption: not on a restarted attempt (TORCHELASTIC_RESTART_COUNT > 0), and, when the script has an
--output folder, not after a marker there says it fired. The marker matters on several nodes: a replacement
node starts a fresh agent whose restart count is 0 again (the folder is shared: snapshots need it anyway).
"""

from __future__ import annotations

import json
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


def _process_start() -> float:
    """When this process started (the kernel's record: its start, in clock ticks since boot, against the uptime), so
    the timeline shows the time a restarted rank spends importing torch; this module's import time without /proc."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


PROCESS_START = _process_start()


def parse(spec: str) -> dict:
    """'kill:rank=1:step=7' -> {'kind': 'kill', 'rank': 1, 'step': 7} ('save=N' instead of 'step=N': during the N-th
    save). Raises UserError when malformed."""
    kind, *fields = spec.split(":")
    if kind not in KINDS:
        raise UserError(f"fault '{spec}': unknown kind '{kind}'. Use kill, raise or hang, e.g. kill:rank=1:step=7.")
    out = {"kind": kind, "rank": 0}
    for f in fields:
        key, sep, value = f.partition("=")
        if key not in ("rank", "step", "save") or not sep or not value.isdigit():
            raise UserError(
                f"fault '{spec}': '{f}' should be rank=R, step=N or save=N with a whole number, e.g. "
                "kill:rank=1:step=7."
            )
        out[key] = int(value)
    if "step" in out and "save" in out:
        raise UserError(f"fault '{spec}': give step=N (after an optimizer step) or save=N (during a save), not both.")
    when = "save" if "save" in out else "step"
    out.setdefault(when, 1)
    if out[when] < 1:
        raise UserError(f"fault '{spec}': {when} counts {'saves' if when == 'save' else 'optimizer steps'} from 1.")
    return out


def _when(fault: dict) -> str:
    return f"save{fault['save']}" if "save" in fault else f"step{fault['step']}"


def _output_of(script_args: list) -> Path | None:
    for i, arg in enumerate(script_args):
        if arg == "--output" and i + 1 < len(script_args):
            return Path(script_args[i + 1])
        if arg.startswith("--output="):
            return Path(arg.partition("=")[2])
    return None


def marker_for(fault: dict, script_args: list) -> Path | None:
    """Where the fault notes that it fired: a file in the script's --output folder (None without one)."""
    out = _output_of(script_args)
    return None if out is None else out / f".fault_fired_{fault['kind']}_rank{fault['rank']}_{_when(fault)}"


TIMELINE = ".fault_timeline.jsonl"


def _note(output: Path | None, event: str, **fields) -> None:
    """One line of the timeline: a single append of a short line, so the ranks' lines never mix."""
    if output is None:
        return
    line = {
        "event": event,
        "rank": int(os.environ.get("RANK", 0)),
        "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
        "t": time.time(),
        **fields,
    }
    output.mkdir(parents=True, exist_ok=True)
    with open(output / TIMELINE, "a") as f:
        f.write(json.dumps(line) + "\n")


def record_steps(output: Path | None) -> None:
    """Note every optimizer step's start (the end of the previous one, or this process's start) and end."""
    if output is None:
        return
    last = [time.time()]
    _note(output, "start", t=PROCESS_START)

    def after_step(optimizer, args, kwargs):
        now = time.time()
        _note(output, "step", t0=last[0], t=now)
        last[0] = now

    register_optimizer_step_post_hook(after_step)


def install(fault: dict, marker: Path | None = None, output: Path | None = None) -> None:
    """Fire `fault` after the given optimizer step (or in the given save) on the given rank, once per run (see the
    module's docstring)."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" or int(os.environ.get("RANK", 0)) != fault["rank"]:
        return
    when = f"save {fault['save']}" if "save" in fault else f"step {fault['step']}"
    if marker is not None and marker.exists():
        print(
            f"[rank {fault['rank']}] fault {fault['kind']} {'in' if 'save' in fault else 'after'} {when} already "
            f"fired in this run ({marker}): not again",
            flush=True,
        )
        return

    def fire():
        print(
            f"[rank {fault['rank']}] injected fault: {fault['kind']} {'in' if 'save' in fault else 'after'} {when}",
            flush=True,
        )
        if marker is not None:  # written before firing: a SIGKILL leaves no chance afterwards
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        _note(output, "fault", kind=fault["kind"])
        if fault["kind"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault["kind"] == "raise":
            raise RuntimeError(
                f"injected failure on rank {fault['rank']} {'in' if 'save' in fault else 'after'} {when}"
            )
        time.sleep(3600)  # hang: the other ranks wait in their next collective until --ddp_timeout

    if "save" in fault:
        _fire_in_save(fault["save"], fire)
        return
    steps = [0]

    def after_step(optimizer, args, kwargs):
        steps[0] += 1
        if steps[0] == fault["step"]:
            fire()

    register_optimizer_step_post_hook(after_step)


def _fire_in_save(n: int, fire) -> None:
    """fire() in this rank's n-th DCP save, right after its shard is written: the checkpoint is not committed yet."""
    from torch.distributed.checkpoint import FileSystemWriter

    original, saves = FileSystemWriter.write_data, [0]

    def write_data(self, plan, planner):
        written = original(self, plan, planner)  # a finished future: this rank's file is on disk
        saves[0] += 1
        if saves[0] == n:
            fire()
        return written

    FileSystemWriter.write_data = write_data


def timeline(output) -> list[dict]:
    """The events the ranks noted in OUTPUT/.fault_timeline.jsonl, in time order."""
    path = Path(output) / TIMELINE
    lines = path.read_text().splitlines() if path.is_file() else []
    return sorted((json.loads(line) for line in lines if line.strip()), key=lambda e: e["t"])


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
        output = _output_of(args[2:])
        record_steps(output)
        install(fault, marker_for(fault, args[2:]), output)
        sys.argv = args[1:]
        runpy.run_path(args[1], run_name="__main__")

    run()


if __name__ == "__main__":
    main()
