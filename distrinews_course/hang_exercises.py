"""Chapter 12's exercises and what checks them: find_culprit(fr), the learner's reading of Flight Recorder dumps, and
the mystery hang's answer. Each check names the mistake it found in one line.

    cases = culprit_cases(runs)             hand-written dumps, and the chapter's own runs with their planted truth
    grade(find_culprit, cases)              distrinews_course.attempt: one line per case, the first mistake named
    judge_mystery(answer, truth)            None when right, else what is wrong
    mystery_truth(run)                      (rank, op, seq) of the mystery run, from what it planted and recorded
    judge_mystery_bug(line, fix)            the bug's line in mystery.py and the fix (a, b or c): None when right

An answer is (rank, op, seq): the rank that never called the collective the other ranks wait in, that collective's
operation ('all_reduce'; 'gloo:all_reduce' as the recorder writes it is accepted) and its sequence number.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from .demo import results


def _op(name) -> str:
    return str(name).split(":", 1)[-1]


def waiting(fr: dict) -> dict:
    """{rank: (op, seq) of its oldest collective still waiting}, for the ranks that wait in one."""
    out = {}
    for rank, entries in fr.items():
        pending = [e for e in entries if not e["retired"]]
        if pending:
            first = min(pending, key=lambda e: e["collective_seq_id"])
            out[rank] = (_op(first["profiling_name"]), first["collective_seq_id"])
    return out


def truth_of(fr: dict, culprit: int) -> tuple:
    """(culprit, op, seq): the collective the OTHER ranks wait in, read from their entries."""
    theirs = Counter(v for r, v in waiting(fr).items() if r != culprit)
    (op, seq), _ = theirs.most_common(1)[0]
    return culprit, op, seq


def judge(got, truth: tuple, fr: dict) -> str | None:
    """None when `got` is the truth, else the mistake, in one line."""
    if not (isinstance(got, (tuple, list)) and len(got) == 3):
        return f"return (rank, op, seq), e.g. (2, 'all_reduce', 14); it returned {got!r:.80}"
    rank, op, seq = got
    r, o, s = truth
    waits = waiting(fr)
    if rank != r:
        if waits.get(rank) == (o, s):
            return f"rank {rank} waits in {o} #{s} like the others: the culprit is the rank that never called it"
        return f"rank {rank} is not the culprit: rank {r} never called {o} #{s}, which the others wait in"
    if _op(op) != o:
        if waits.get(r, (None,))[0] == _op(op):
            return f"{_op(op)} is what rank {r} waits in; name the collective the OTHER ranks wait in ({o})"
        return f"the others wait in {o}, not {_op(op)}"
    if seq != s:
        if seq == s - 1:
            return f"#{seq} completed on every rank; the hang is at the first collective that did not complete (#{s})"
        return f"the others wait in #{s} (its collective_seq_id), not #{seq}"
    return None


def entry(seq: int, op: str, retired: bool = True, shape=(9,), t: float = 0.0) -> dict:
    """One Flight Recorder entry, as the debug server's /fr_trace_json serves it (the fields the exercise reads)."""
    return {
        "collective_seq_id": seq,
        "profiling_name": f"gloo:{op}",
        "retired": retired,
        "input_sizes": [list(shape)] if shape else [],
        "time_created_ns": int(1e9 * (t or seq)),
        "pg_id": 0,
    }


def _ranks(n: int, done_to: int, waits: dict) -> dict:
    """n ranks that completed all_reduce #1..done_to; waits: {rank: (op, seq)} still waiting (others: none)."""
    fr = {r: [entry(s, "all_reduce") for s in range(1, done_to + 1)] for r in range(n)}
    for r, (op, seq) in waits.items():
        fr[r] += [entry(s, "all_reduce") for s in range(done_to + 1, seq)] + [entry(seq, op, retired=False)]
    return fr


def hand_written_cases() -> list:
    """(what, fr, truth): hangs the chapter's runs do not show."""
    behind = _ranks(4, 11, {0: ("all_reduce", 12), 1: ("all_reduce", 12), 3: ("all_reduce", 12)})
    elsewhere = _ranks(4, 4, {0: ("barrier", 5), 1: ("broadcast", 5), 2: ("broadcast", 5), 3: ("broadcast", 5)})
    two_behind = _ranks(3, 18, {0: ("all_reduce", 20), 2: ("all_reduce", 20)})
    return [
        ("4 ranks, rank 2 behind (busy in its own code)", behind, (2, "all_reduce", 12)),
        ("4 ranks, rank 0 in a barrier the others never called", elsewhere, (0, "broadcast", 5)),
        ("3 ranks, rank 1 two collectives behind", two_behind, (1, "all_reduce", 20)),
    ]


def culprit_cases(runs: dict) -> list:
    """grade()'s cases: the hand-written ones, then the chapter's runs ({what: (fr, culprit)}), each judged against
    its truth."""
    cases = hand_written_cases() + [(what, fr, truth_of(fr, culprit)) for what, (fr, culprit) in runs.items()]
    return [(what, (fr,), lambda got, t=truth, fr=fr: judge(got, t, fr)) for what, fr, truth in cases]


def mystery_truth(run) -> tuple:
    """The mystery run's (rank, op, seq): the rank that stopped early (the line it printed), and the collective the
    other ranks waited in when the debug server was read."""
    stopped = [int(r["rank"]) for r in results(run.output) if "stopped_early_at_epoch" in r]
    if len(stopped) != 1:
        raise AssertionError(f"the mystery run should have one rank that stopped early; it had {stopped}")
    return truth_of(run.fr, stopped[0])


def judge_mystery(answer, truth: tuple, fr: dict) -> str | None:
    if answer is None:
        return "no answer yet: set MYSTERY = (rank, op, seq)"
    return judge(answer, truth, fr)


# the mystery's bug and its fix ---------------------------------------------------------------------------------

MYSTERY_SCRIPT = "scripts/hangs/mystery.py"
FIXES = {
    "a": "give the process group a longer timeout",
    "b": "decide the early stop together: every rank stops at the same epoch (all-reduce the loss or a stop flag)",
    "c": "remove the dist.barrier() before the save",
}
WHY_NOT = {
    "a": "a longer timeout only makes the other ranks wait longer: the culprit never calls their collective",
    "c": "without the barrier the ranks that go on training still wait in DDP's all-reduce for the one that left",
}


def bug_lines(script=MYSTERY_SCRIPT) -> list:
    """The lines (numbered from 1) where one rank leaves the epoch loop the others stay in: its own early-stop test
    and its break."""
    lines = Path(script).read_text().splitlines()
    return [i for i, line in enumerate(lines, 1) if "val_loss < args.target" in line or line.strip() == "break"]


def judge_mystery_bug(line, fix, script=MYSTERY_SCRIPT) -> str | None:
    """The second half of exercise 2: the line of the bug (either line of bug_lines) and the fix (one of FIXES)."""
    if line is None or fix is None:
        return "no answer yet: set MYSTERY_BUG_LINE and MYSTERY_FIX"
    right = bug_lines(script)
    if line not in right:
        text = Path(script).read_text().splitlines()
        shown = text[line - 1].strip() if 0 < line <= len(text) else "past the end of the file"
        return (
            f"line {line} ({shown!r}) runs on the culprit as on the others: look for where one rank leaves the "
            f"loop the others stay in"
        )
    if fix not in FIXES:
        return f"MYSTERY_FIX is one of {', '.join(map(repr, FIXES))}, not {fix!r}"
    return None if fix == "b" else f"not ({fix}): {WHY_NOT[fix]}"
