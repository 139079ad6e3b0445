"""Chapter 12's readings of each tool's output: what the tool said, as data a check can hold against the planted bug.

fr = flight_recorder(html)        the debug server's /fr_trace_json page -> {rank: [entry, ...]}
st = stacks(html)                 its /stacks page -> {rank: [(file, line, function), ...]} (main thread, innermost
                                  first)
culprit(fr, st)                   the doctor's rules over those: a Verdict (culprits, op, seq, site, text)
pyspy(pid, timeout)               `py-spy dump --pid PID`: (frames, text) or why it could not run
detail_mismatch(output)           TORCH_DISTRIBUTED_DEBUG=DETAIL's report -> {rank: (op, seq, shape)}
step_counts(output, step)         the class counts each rank logged at one step of class_counts.py -> {rank: [..]}
monitored_barrier_names(output)   the ranks a monitored_barrier's error names
error_files(log_dir)              torchrun's @record error files -> {rank: (error, frames)}
root_cause_ranks(lines)           the ranks torchrun's "Root Cause" headings name
doctor_verdict(folder)            the hang doctor's verdict (hang.json or straggler.json) from its --out folder
doctor_waited_s(folder)           how long a rank had waited when the doctor reported a hang
arrivals(fr)                      when each rank reached each completed collective, for the straggler
lateness(rows, rank)              how late that rank was at each collective, and how often it was the last
"""

from __future__ import annotations

import html as html_lib
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from distrinews_lib.hang_doctor.verdict import Call, RankState, hang_verdict, user_frame
from distrinews_lib.hang_doctor.watch import COLLECTIVE_SIGNS

from .launch import root_causes

# the debug server's pages: one "Rank i: address" heading per rank, then its answer (or the failure) in <pre>
_RANK_BLOCK = re.compile(
    r"<h2>Rank (\d+): [^<]*</h2>\s*(?:<p>Failed to fetch: status=(\d+)</p>)?\s*<pre>(.*?)</pre>", re.S
)


def _blocks(page: str) -> dict:
    """{rank: (its text, or None when the page says it failed to fetch it)}."""
    return {int(m[1]): (None if m[2] else html_lib.unescape(m[3])) for m in _RANK_BLOCK.finditer(page)}


def flight_recorder(page: str) -> dict:
    """The /fr_trace_json page -> {rank: its Flight Recorder entries (dicts, oldest first)}; a rank the server could
    not reach is left out."""
    out = {}
    for rank, text in _blocks(page).items():
        if text is not None:
            out[rank] = json.loads(text).get("entries", [])
    return out


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)', re.M)


def faulthandler_frames(text: str) -> list:
    """The main thread's frames from a faulthandler dump (most recent call first), innermost first: the thread whose
    stack reaches a module's top level."""
    threads = re.split(r"(?m)^(?:Current thread|Thread) 0x[0-9a-f]+.*$", text)
    for block in threads:
        frames = [(f, int(line), fn) for f, line, fn in _FRAME.findall(block)]
        if any(fn == "<module>" for _, _, fn in frames):
            return frames
    return []


def stacks(page: str) -> dict:
    """The /stacks page -> {rank: main thread's frames, innermost first}."""
    return {rank: faulthandler_frames(text) for rank, text in _blocks(page).items() if text is not None}


def as_call(entry: dict) -> Call:
    return Call(
        pg=str(entry.get("pg_id", 0)),
        seq=int(entry["collective_seq_id"]),
        op=str(entry["profiling_name"]).split(":", 1)[-1],
        sizes=tuple(tuple(s) for s in entry.get("input_sizes", [])),
        dtypes=tuple(entry.get("input_dtypes", [])),
        done=bool(entry.get("retired", True)),
        t_ns=int(entry.get("time_created_ns", 0)),
    )


def culprit(fr: dict, st: dict, world: int):
    """The hang doctor's rules (distrinews_lib/hang_doctor/verdict.py) over what the debug server showed: each rank's
    Flight Recorder entries and its main thread's stack, which is where its waiting collective was called."""
    states = {}
    for rank in range(world):
        if rank not in fr:
            states[rank] = None
            continue
        calls = [as_call(e) for e in fr[rank]]
        waiting = [c for c in calls if not c.done]
        if waiting:
            waiting[0].where = tuple(st.get(rank, ()))
        states[rank] = RankState(rank, calls, list(st.get(rank, [])))
    return hang_verdict(states, world)


def own_frame(frames) -> tuple | None:
    """The innermost frame of the job's own code."""
    return next((f for f in frames if user_frame(f)), None)


def same_line(a, b) -> bool:
    """Do two tools' stacks stop at the same line of the job's own code? (file name, line, function) of each one's
    innermost own frame; the file's folder is left out: one tool writes it relative, another absolute."""
    fa, fb = own_frame(a), own_frame(b)
    return fa is not None and fb is not None and (Path(fa[0]).name, *fa[1:]) == (Path(fb[0]).name, *fb[1:])


def collective_table(fr: dict, stacks_by_rank: dict) -> str:
    """One line per rank: the collectives it completed, the one it waits in (operation, sequence number, shapes) and
    the line of its own code it waits at."""
    lines = [f"{'rank':<5} {'completed':<10} {'waits in':<30} at"]
    for rank in sorted(fr):
        done = [e["collective_seq_id"] for e in fr[rank] if e["retired"]]
        pending = [e for e in fr[rank] if not e["retired"]]
        waits = "-"
        if pending:
            e = pending[0]
            shape = ", ".join(str(s) for s in e["input_sizes"]) or "no tensor"
            waits = f"{e['profiling_name'].split(':')[-1]} #{e['collective_seq_id']} {shape}"
        f = own_frame(stacks_by_rank.get(rank, []))
        where = f"{Path(f[0]).name}:{f[1]} ({f[2]})" if f else "?"
        span = f"#{min(done)}-#{max(done)}" if done else "none"
        lines.append(f"{rank:<5} {span:<10} {waits:<30} {where}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------ py-spy

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PYSPY_FRAME = re.compile(r"^\s{4}(\S+) \(([^:()]+):(\d+)\)", re.M)


def pyspy(pid: int, timeout: float = 10.0) -> tuple:
    """`py-spy dump --pid PID`: (main thread's frames innermost first, its text, None), or ([], '', why it did not
    work). It reads another process's memory (ptrace): root with CAP_SYS_PTRACE, or the same user where the kernel
    allows it; a container started without SYS_PTRACE refuses."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        return [], "", "py-spy is not installed (pip install py-spy)"
    try:
        run = subprocess.run(
            [exe, "dump", "--full-filenames", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return [], "", f"py-spy did not answer within {timeout:.0f} s"
    if run.returncode != 0:
        return [], run.stdout + run.stderr, (run.stderr.strip().splitlines() or ["failed"])[0][:200]
    text = _ANSI.sub("", run.stdout)
    return pyspy_frames(text), text, None


def pyspy_frames(text: str) -> list:
    """The main thread's frames in a `py-spy dump`, innermost first: the thread whose stack reaches a module's top
    level. Its colours are taken out first: py-spy colours its dump when it thinks a terminal reads it (a notebook's
    kernel can look like one)."""
    blocks = re.split(r"(?m)^Thread ", _ANSI.sub("", text))
    main = next((b for b in blocks[1:] if "<module>" in b), blocks[-1] if len(blocks) > 1 else "")
    return [(file, int(line), fn) for fn, file, line in _PYSPY_FRAME.findall(main)]


# ------------------------------------------------------------------------------------- messages the tools print


_FINGERPRINT = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+),? ?OpType=(\w+)"
    r"(?:, TensorShape=\[([\d, ]*)\])?"
)


def detail_mismatch(output: str) -> dict:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL's 'Detected mismatch between collectives' errors -> {rank: (op, seq, shape)},
    each rank as the message of ANOTHER rank describes it (every rank's message names both)."""
    out = {}
    for m in _FINGERPRINT.finditer(output):
        shape = tuple(int(x) for x in m[4].split(",") if x.strip()) if m[4] is not None else None
        out[int(m[1])] = (m[3].lower(), int(m[2]), shape)
    return out


def step_counts(output: str, step: int) -> dict:
    """{rank: the global class counts it logged at `step`} from class_counts.py's RESULT lines (a rank stuck in the
    step's all-reduce logged none)."""
    found = {}
    for line in output.splitlines():
        if "RESULT rank=" in line and f" step={step} " in line + " ":
            fields = dict(re.findall(r"(\w+)=(\S+)", line.split("RESULT ", 1)[1]))
            if "counts" in fields:
                found[int(fields["rank"])] = json.loads(fields["counts"])
    return found


def monitored_barrier_names(output: str) -> set:
    """The ranks a monitored_barrier's error names: 'Rank 1 failed to pass monitoredBarrier' (rank 0 says who did not
    arrive) or '...while waiting for send/recv from rank 0' (a rank that arrived, when rank 0 did not)."""
    named = {
        int(r)
        for m in re.finditer(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", output)
        for r in re.findall(r"\d+", m[1])
    }
    named |= {int(r) for r in re.findall(r"waiting for send/recv from rank (\d+)", output)}
    return named


_TB_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def error_files(log_dir) -> dict:
    """torchrun's error files under its --log-dir (one per rank that failed with @record on its main()):
    {rank: (the error's last line, its frames innermost first)}."""
    out = {}
    for path in sorted(Path(log_dir).glob("**/error.json")):
        rank = int(path.parent.name)
        message = json.loads(path.read_text())["message"]
        stack = message.get("extraInfo", {}).get("py_callstack", "")
        frames = [(f, int(line), fn) for f, line, fn in _TB_FRAME.findall(stack)][::-1]
        out[rank] = (message.get("message", ""), frames)
    return out


def error_stamps(log_dir) -> dict:
    """{rank: its error file's time stamp, whole seconds since the epoch}: what torchrun orders failures by."""
    out = {}
    for path in sorted(Path(log_dir).glob("**/error.json")):
        message = json.loads(path.read_text())["message"]
        out[int(path.parent.name)] = int(message.get("extraInfo", {}).get("timestamp", 0))
    return out


def collective_error(message: str) -> bool:
    """Is this error a collective's failure (a timeout, a peer's closed connection): a consequence, not a cause?"""
    return any(sign in message.lower() for sign in COLLECTIVE_SIGNS)


def root_cause_ranks(lines: list) -> list:
    """The ranks torchrun's "Root Cause (first observed failure)" blocks name, in order."""
    return [int(m[1]) for _, block in root_causes(lines) for m in [re.search(r"rank\s*:\s*(\d+)", block)] if m]


def doctor_verdict(folder, kind: str = "hang") -> dict | None:
    """The hang doctor's verdict from its --out folder (hang.json or straggler.json), or None if it wrote none."""
    path = Path(folder) / f"{kind}.json"
    return json.loads(path.read_text())["verdict"] if path.is_file() else None


def doctor_waited_s(folder) -> float | None:
    """How long the reporting rank had waited in its collective when the hang doctor reported (hang.json's waited_s),
    or None if it wrote no hang report."""
    path = Path(folder) / "hang.json"
    return float(json.loads(path.read_text())["waited_s"]) if path.is_file() else None


# ------------------------------------------------------------------------------------------------------- straggler


def arrivals(fr: dict) -> list:
    """For each collective every rank completed (in order): {rank: ms after the first rank arrived}."""
    by_key: dict = {}
    for rank, entries in fr.items():
        for e in entries:
            if e.get("retired"):
                by_key.setdefault((e.get("pg_id", 0), e["collective_seq_id"]), {})[rank] = e["time_created_ns"]
    rows = [v for _, v in sorted(by_key.items()) if len(v) == len(fr)]
    return [{r: (t - min(v.values())) / 1e6 for r, t in v.items()} for v in rows]


def lateness(rows: list, rank: int, skip: int = 3) -> tuple:
    """(the share of collectives at which `rank` arrived last, the median ms it arrived after the others' first), over
    arrivals() rows, leaving out the first `skip` (DDP's set-up: they wait for the slowest start, not for a step)."""
    rows = rows[skip:]
    if not rows:
        raise ValueError("no collective after DDP's set-up to compare: the run was read too early")
    late = [row[rank] - min(t for r, t in row.items() if r != rank) for row in rows]
    return sum(d > 0 for d in late) / len(late), statistics.median(late)
