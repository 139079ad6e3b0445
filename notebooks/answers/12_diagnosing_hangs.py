"""Chapter 12's reference answers (read only by its solution cells; see README.md here)."""

from collections import Counter


def find_culprit(fr):
    """fr: {rank: its Flight Recorder entries}. (rank, op, seq): the rank that never called the collective the other
    ranks wait in, and that collective."""
    waits = {}
    for rank, entries in fr.items():
        pending = [e for e in entries if not e["retired"]]  # completed entries are "retired"
        if pending:
            first = min(pending, key=lambda e: e["collective_seq_id"])
            waits[rank] = (first["profiling_name"].split(":")[-1], first["collective_seq_id"])
    (op, seq), _ = Counter(waits.values()).most_common(1)[0]  # the collective most ranks wait in
    culprit = min(r for r in fr if waits.get(r) != (op, seq))  # a rank that is not waiting in it
    return culprit, op, seq


def mystery(fr):
    """The mystery run's answer, from its dumps."""
    return find_culprit(fr)


# Exercise 2's second half, after reading scripts/hangs/mystery.py: the rank whose validation set is the cleanest
# reaches the target loss first and breaks out of the epoch loop alone (line 43); it then waits at the barrier while
# the others still train, each in DDP's all-reduce. The fix: decide together, e.g. all-reduce a stop flag each epoch.
MYSTERY_BUG_LINE = 43
MYSTERY_FIX = "b"
