"""What chapter 12 claims about each planted failure, decided from what the run's tools showed.

    settle(slow_save_waits(run.fr))                              # the recorder: who waits in the barrier, who in none
    settle(mismatch_claims(wrong, right, waited, hang_s, ok))    # wrong counts on one rank, then a hang
    settle(detail_claims(found, detail.output, recorded))        # DETAIL names both shapes and numbers from 0
    settle(cause_from_error_files(files, planted))               # the error that is not a collective's failure
    settle(root_cause_from_stamps(named, stamps, died))          # torchrun's heading: the earliest whole second
    settle(straggler_named(last, broken_ms, fixed_ms, read_ms))  # last to arrive, by about its slower reads
    settle(fixes_clean(fixes_ok, ran, saved_ok, waited, group_timeout_s))

Each margin's reason is in the docstring of the function that decides it. The readings themselves (recorder
entries, log lines, error files) come from distrinews_course.hang_reading.
"""

from __future__ import annotations

from .claims import Claim
from .hang_reading import collective_error, own_frame, step_counts


def waiting_in(fr: dict) -> dict:
    """{rank: the operations of its recorder entries that have not completed, oldest first}."""
    return {r: [e["profiling_name"].split(":")[-1] for e in es if not e["retired"]] for r, es in fr.items()}


def slow_save_waits(fr: dict, saver: int = 0) -> Claim:
    """Section 2: the rank that saves (`saver`) has no collective left waiting: it never called the barrier; every
    other rank's oldest waiting collective is the barrier. No margin: the recorder's `retired` flags decide it."""
    waiting = waiting_in(fr)
    others = [r for r in waiting if r != saver]
    who = (
        f"ranks {', '.join(map(str, others))} wait"
        if len(others) > 1
        else f"rank {others[0] if others else None} waits"
    )
    return Claim(
        f"the recorder: {who} in the barrier, rank {saver} in no collective at all",
        waiting.get(saver) == [] and bool(others) and all(waiting[r][:1] == ["barrier"] for r in others),
    )


def mismatch_claims(wrong: dict, right: dict, waited: float | None, hang_s: float, launch_ok: bool) -> list:
    """Section 3. `right`: step 3's counts per rank from the fixed script, which every rank must log alike (after an
    all-reduce the counts are global). `wrong`: the broken script's: rank 1 logged counts that differ from the right
    ones, rank 0 logged none (it never left the all-reduce). `waited`: how long a rank had waited in a collective when
    the hang doctor reported; the doctor reports once a wait reaches `hang_s`, and not before: a shorter wait means it
    reported an early failure instead, which is not what gloo does with a mismatch."""
    alike = len(right) >= 2 and all(counts == right[0] for counts in right.values())
    return [
        Claim(f"the fixed script: all {len(right)} ranks logged the same step-3 counts {right.get(0)}", alike),
        Claim(
            f"the mismatched all-reduce gave rank 1 wrong counts ({wrong.get(1)}) and rank 0 none; then a hang: the "
            f"hang doctor reported a rank that had waited {waited or 0:.1f} s in a collective (its threshold: "
            f"{hang_s:g} s), and the launch failed",
            alike and wrong.get(1) not in (None, right.get(0)) and 0 not in wrong
            and waited is not None and waited >= hang_s and not launch_ok,
        ),
    ]  # fmt: skip


def detail_claims(found: dict, output: str, recorded: int, classes: int = 4, per_step: int = 3, step: int = 3) -> list:
    """Section 3 under TORCH_DISTRIBUTED_DEBUG=DETAIL. `found`: {rank: (op, DETAIL's sequence number, shape)}. Rank 0
    all-reduces one count per class (`classes`), rank 1 one fewer; DETAIL stops the run before any rank logs step 3's
    counts, and without a timeout. DETAIL numbers collectives from 0, the Flight Recorder (`recorded`, the doctor's
    number) from 1: step `step`'s counts are collective `per_step` * `step` (2 gradient buckets and the counts a
    step), so DETAIL's number + 1 must equal both."""
    shapes = {rank: shape for rank, (_, _, shape) in found.items()}
    seq = found[0][1] if 0 in found else None
    return [
        Claim(
            f"DETAIL names the mismatch: rank 0 all-reduces {classes} counts (one per class), rank 1 only "
            f"{classes - 1}; no rank logged step {step}'s counts, and none timed out",
            shapes.get(0) == (classes,) and shapes.get(1) == (classes - 1,)
            and not step_counts(output, step=step) and "Timed out" not in output,
        ),
        Claim(
            f"DETAIL numbers the collectives from 0, the Flight Recorder from 1: DETAIL's {seq} is the recorder's "
            f"#{recorded}, the {recorded}th collective: step {step}'s class counts ({per_step} a step: 2 gradients, "
            "then the counts)",
            seq is not None and seq + 1 == recorded == per_step * (step + 1),
        ),
    ]  # fmt: skip


def cause_from_error_files(files: dict, planted: int, world: int = 2, raised_in: str = "read_batch") -> Claim:
    """Section 4. `files`: {rank: (error, frames)} from the error files. The cause is the one error that is not a
    collective's failure (collective_error), raised in `raised_in`; every other rank wrote a collective's failure (a
    consequence) or none (torchrun stopped it first). No margin: the messages decide it."""
    cause = [rank for rank, (error, _) in files.items() if not collective_error(error)]
    frame = own_frame(files[cause[0]][1]) if len(cause) == 1 else None
    others = "; ".join(
        f"rank {r} wrote " + ("one too, a collective's failure: the consequence" if r in files else "none: torchrun "
                              "stopped it")
        for r in range(world) if r not in cause
    )  # fmt: skip
    return Claim(
        f"the error files name rank {cause[0] if cause else None}: it died in {frame[2] if frame else None}, on the "
        f"record it could not parse; {others}",
        cause == [planted] and frame is not None and frame[2] == raised_in,
    )


def root_cause_from_stamps(named: list, stamps: dict, died: int) -> Claim:
    """Section 4: torchrun's "Root Cause" heading names the failure with the smallest time stamp, in whole seconds
    (torch.distributed.elastic's ProcessFailure.timestamp is an int), so it need not be `died`, the rank whose error
    file holds the cause. `stamps`: {rank: its error file's time stamp}. When the stamps differ, the named rank must
    hold the earliest; a rank named with a later one fails. On a tie, torchrun's min() keeps the order its polling found
    the failures in (the earlier poll first, ascending local rank within one poll), which this run cannot tell, nor a
    rank that wrote no file (torchrun stamps it when it sees it end): a NOTE."""
    first = min(stamps.values()) if stamps else None
    tied = [r for r, t in sorted(stamps.items()) if t == first]
    who = named[0] if named else None
    text = f"rank {died} died, and torchrun's Root Cause names rank {who}" + (
        "; on a tie torchrun names the failure its polling found first (the lowest rank, when one poll found both), "
        "which need not be the one that died: the cause is in the messages above, not in the heading"
        if len(tied) > 1
        else f": the rank whose error file has the earliest time stamp ({first})"
    )
    if named and named[0] not in stamps and stamps:
        return Claim(text, False, unchecked=f"rank {who} wrote no error file, so its time stamp is torchrun's")
    if named and len(tied) > 1:
        ranks = " and ".join(map(str, tied))
        return Claim(text, named[0] in tied, unchecked=f"ranks {ranks} failed in the same whole second")
    return Claim(text, bool(named) and named[0] in tied)


def straggler_named(last: float, broken_ms: float, fixed_ms: float, read_ms: float) -> list:
    """Section 5. `last`: the share of collectives rank 1 reached last; `broken_ms`, `fixed_ms`: its median lateness
    behind rank 0, broken and fixed; `read_ms`: how much longer each of its reads takes.
    - last >= 0.8: a rank that is really slower arrives last almost every step; on a busy shared machine a few
      steps can go the other way, and 0.8 leaves room for 1 in 5 while an even pair (about 0.5) fails.
    - broken_ms > 0.5 * read_ms: the lateness is the slower read, less whatever rank 0 spends meanwhile; half the
      planted delay leaves room for that, while a rank that is not behind (about 0 ms) fails.
    - fixed_ms < broken_ms / 4: reading ahead overlaps the read with the step; a fix that hid less than three
      quarters of the lateness would not be one."""
    return [
        Claim(
            f"rank 1 is the straggler: the last to arrive at {100 * last:.0f}% of the collectives (at least 80%), "
            f"{broken_ms:.0f} ms after rank 0 in a typical step (its reads take {read_ms:g} ms longer; at least half "
            "of that)",
            last >= 0.8 and broken_ms > 0.5 * read_ms,
        ),
        Claim(
            f"reading ahead hides its slow reads: rank 1's median lateness is now {round(fixed_ms)} ms, under a "
            f"quarter of the {broken_ms:.0f} ms",
            fixed_ms < broken_ms / 4,
        ),
    ]


def fixes_clean(fixes_ok: bool, ran: list, saved_ok: bool, waited: dict, group_timeout_s: float, world: int = 2):
    """Section 6. The fixed scripts of sections 1, 3 and 4 ran in one launch (`ran`: their names) and ended cleanly;
    the fixed slow save ended cleanly with every rank (`waited`: {rank: seconds from before the save to past the
    barrier}) past the default group timeout that stopped the broken run. Rank 0's figure is its own save; rank 1's,
    its wait in the barrier, is the test of the fix: a fix whose wait did not outlast the timeout proves nothing."""
    return [
        Claim(f"the {len(ran)} fixed runs ended cleanly", fixes_ok and len(ran) == 3),
        Claim(
            f"the fixed slow save ended cleanly: rank 1 waited {waited.get(1, 0):.1f} s for the save, past the "
            f"{group_timeout_s:g} s default group timeout that stopped the broken run",
            saved_ok and sorted(waited) == list(range(world)) and min(waited.values()) > group_timeout_s,
        ),
    ]
