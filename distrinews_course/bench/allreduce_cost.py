"""Chapter 05's section 1: what an all-reduce costs on this machine, fitted with two numbers, and the bytes each rank
really sent against the ring's 2(N-1)/N.

    cost = allreduce_cost.AllreduceCost.from_launch(R["collectives"], R4["collectives4"], gpus=0)
    print(cost.table()); print(cost.headline())
    settle(cost.claims())               # a fit predicts a size it did not see; each rank sent the ring's bytes
    print(cost.halves_table()); print(cost.halves_fact())

Around each call every rank reads how many bytes it has written so far (/proc/self/io): gloo talks TCP, so the
difference is what that rank sent. NCCL moves a GPU's bytes outside the process's write calls, so on GPUs nothing is
counted and the byte claims say so.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..claims import Claim
from ..perf_model import Fit, fit_alpha_beta, ring_bytes_per_rank
from . import quiet
from .timing import NOISY_SPREAD, checked_margin, middle_spread

FIT_BOUND = (
    0.30  # a fit without it predicts the 16 MiB message within this share (a NOTE where its repetitions moved more)
)
BYTES_BOUND = 0.02  # each rank sends the ring's 2(N-1)/N of the message within 2% (gloo's headers, a few barriers)


def human(nbytes: float) -> str:
    return f"{nbytes / 2**20:.0f} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:.0f} KiB"


@dataclass
class AllreduceCost:
    rows2: list  # all_reduce rows of the 2-process launch: {bytes, seconds, times, sent}
    rows4: dict  # bytes -> all_reduce row of the 4-process launch
    halves: dict  # reduce_scatter and all_gather rows, 2 processes
    fit: Fit
    fit4: Fit
    others: float | None  # other programs' cores during the 2-process all-reduces
    gpus: bool = False

    @classmethod
    def from_launch(cls, run2: dict, run4: dict, gpus: bool = False) -> AllreduceCost:
        rows2 = [r for r in run2["rows"] if r["op"] == "all_reduce"]
        rows4 = {r["bytes"]: r for r in run4["rows"] if r["op"] == "all_reduce"}
        halves = {r["op"]: r for r in run2["rows"] if r["op"] != "all_reduce"}
        return cls(
            rows2, rows4, halves, fit_alpha_beta(rows2), fit_alpha_beta(list(rows4.values())), quiet.others(run2), gpus
        )

    def table(self) -> str:
        sent = lambda row: f"{row['sent'] / row['bytes']:.3f}" if row and row["sent"] else "n/a"  # noqa: E731
        lines = [
            f"{'message':>8} {'2 procs ms':>10} {'fit ms':>7} {'sent/size':>9} {'4 procs ms':>10} {'sent/size':>9}"
        ]
        for r in self.rows2:
            r4 = self.rows4.get(r["bytes"])
            ms4 = f"{1000 * r4['seconds']:.2f}" if r4 else "-"
            lines.append(
                f"{human(r['bytes']):>8} {1000 * r['seconds']:>10.2f} {1000 * self.fit.seconds(r['bytes']):>7.2f} "
                f"{sent(r):>9} {ms4:>10} {sent(r4):>9}"
            )
        return "\n".join(lines)

    @property
    def knee_bytes(self) -> float:
        """The message size where latency and bytes cost the same: alpha x bandwidth."""
        return self.fit.alpha_s * self.fit.bandwidth

    def headline(self) -> str:
        return (
            f"The fit on this machine (2 processes): latency alpha = {1000 * self.fit.alpha_s:.2f} ms, bandwidth "
            f"{self.fit.bandwidth / 1e9:.2f} GB/s of message. Below about {human(self.knee_bytes)} an all-reduce "
            "costs mostly its latency; above, mostly its bytes." + self.two_ranks_fact()
        )

    def two_ranks_fact(self) -> str:
        """A printed fact, not a check: at 2 ranks every all-reduce (a ring, a tree, each sending the other the whole
        message) sends 1x the message per rank, so the count cannot tell a ring apart; the 4-rank count tells a
        bandwidth-optimal all-reduce (1.5x: a ring, or recursive halving-doubling) from a naive one (3x), not which."""
        row = self.rows2[-1]
        if self.gpus or not row["sent"]:
            return ""
        return (
            f"\nWith 2 ranks each rank sent {row['sent'] / row['bytes']:.3f}x the message, as any all-reduce does at 2 "
            "ranks: only the 4-rank count below can tell a bandwidth-optimal all-reduce (a ring, or halving-doubling) "
            "from a naive one."
        )

    def fit_claim(self) -> Claim:
        """A fit that did not see it predicts the second-largest message's time (16 MiB: the size nearest DDP's 8 MiB
        of gradients) within FIT_BOUND. The headline fit takes every size; this one leaves the checked size out, so a
        line that bends to reach it cannot pass by construction. 30%, because the fit weighs every size alike
        (relative error) and a 2-core machine's small messages move by more than that. Checked where other programs
        were quiet during the all-reduces and that message's repetitions agreed within timing.NOISY_SPREAD
        (timing.checked_margin on timing.middle_spread: the repetitions that set the median, since one stray one does
        not move it): where they moved more, the host moved whole repetitions, and the point is shown with a NOTE,
        not checked within its own spread."""
        held = self.rows2[-2]
        spread = middle_spread(held["times"])
        within = checked_margin(FIT_BOUND, spread)
        fit = fit_alpha_beta([r for r in self.rows2 if r is not held])
        model = fit.seconds(held["bytes"])
        text = (
            f"the fit of the other {len(self.rows2) - 1} sizes predicts the "
            f"{human(held['bytes'])} message's time ({1000 * held['seconds']:.1f} ms, median of {len(held['times'])}; "
            f"the fit without it says {1000 * model:.1f} ms)" + (f" within {100 * within:.0f}%" if within else "")
        )
        q = quiet.all_quiet([{"others_cores": self.others}], self.gpus)
        why = None if q else quiet.busy_reason([{"others_cores": self.others}])
        if why is None and within is None:
            n = len(held["times"])
            middle = f"the middle {n - 2} of its {n}" if n >= 5 else f"its {n}"
            why = f"{middle} repetitions moved by {100 * spread:.0f}%, over {100 * NOISY_SPREAD:.0f}%"
        return Claim(text, self.fit.alpha_s > 0 and abs(model / held["seconds"] - 1) < (within or FIT_BOUND), why)

    def ring_claims(self) -> list[Claim]:
        """Each rank sent 2(N-1)/N of the largest message, counted, within BYTES_BOUND, at 4 ranks: 1.5x, where a naive
        all-reduce, everyone sending everyone the whole message, would send N-1 = 3x. Recursive halving-doubling also
        sends 1.5x at 4 ranks, so the count tells a bandwidth-optimal all-reduce from a naive one, not a ring from
        halving-doubling. At 2 ranks every all-reduce sends 1x, so that count is printed as a fact (two_ranks_fact),
        not claimed."""
        row = self.rows4.get(max(self.rows4)) if self.rows4 else None
        if row is None:
            return []
        ring = ring_bytes_per_rank(1, 4)
        text = (
            f"with 4 ranks each rank sent 2(N-1)/N = {ring:.2f}x the message: a bandwidth-optimal all-reduce's bytes "
            "(a ring's or halving-doubling's; a naive one sends 3x)"
        )
        if self.gpus or not row["sent"]:
            return [Claim(text, False, "nothing here counts the bytes a GPU sends (NCCL)")]
        got = row["sent"] / row["bytes"]
        return [Claim(text + f" ({got:.3f}x counted)", abs(got / ring - 1) < BYTES_BOUND)]

    def claims(self) -> list[Claim]:
        return [self.fit_claim(), *self.ring_claims()]

    def halves_table(self) -> str:
        lines = [f"{'collective (' + human(self.halves['all_gather']['bytes']) + ')':<24} {'ms':>6} {'sent/size':>9}"]
        for op in ("reduce_scatter", "all_gather"):
            r = self.halves[op]
            sent = f"{r['sent'] / r['bytes']:.3f}" if r["sent"] else "n/a"
            lines.append(f"{op:<24} {1000 * r['seconds']:>6.2f} {sent:>9}")
        return "\n".join(lines)

    def halves_fact(self) -> str:
        """The all-gather's bytes at 2 ranks, counted, printed as a fact, not claimed: at 2 ranks ANY all-gather sends
        (N-1)/N = half its tensor, so the count tests the byte counter, not an algorithm (ring_claims tests the ring at
        4 ranks)."""
        ag = self.halves["all_gather"]
        if self.gpus or not ag["sent"]:
            return ""
        got = ag["sent"] / ag["bytes"]
        return f"the all-gather sent {got:.2f}x its tensor: half the all-reduce's bytes, as any all-gather at 2 ranks"

    def gloo_reduce_scatter(self) -> str:
        """What gloo's reduce_scatter sent, said in a line (it is not the ring's half on every version)."""
        rs = self.halves["reduce_scatter"]
        if self.gpus or not rs["sent"]:
            return ""
        got = rs["sent"] / rs["bytes"]
        if abs(got - 0.5) < BYTES_BOUND:
            return f"gloo's reduce_scatter sent {got:.2f}x: the ring's half."
        return (
            f"gloo's reduce_scatter sent {got:.2f}x, not the ring's half: gloo runs a whole all-reduce and keeps your "
            "chunk. Its all_reduce, the one DDP uses, sent a bandwidth-optimal all-reduce's bytes at 4 ranks (section "
            "1's table): a ring's, or halving-doubling's; bytes cannot tell which."
        )
