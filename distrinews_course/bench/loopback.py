"""Chapter 05's loopback sweep: the runs of one launch, and the model that predicts each DDP point from the runs
beside it in the same round.

    runs = loopback.sweep_plan(flags, batches=(16, 64, 256), n=2, samples=768, rounds=3)  # for scripts/bench_runs.py
    sweep = loopback.Sweep.from_launch(R, fit, batches, n=2, rounds=3)   # after the launch: the model, each point
    print(sweep.parts_table()); print(sweep.gap_table()); print(sweep.gap_rest_line())  # section 2: a step apart
    print(sweep.speedup_table()); settle(sweep.speedup_claims())                       # section 3: model vs run

Per batch b and round k the launch runs, back to back:
- single: 1 process, 2b per step (the baseline, the other core idle);
- pair: 2 processes at once, b each, no communication: what a DDP rank computes, the machine shared;
- ddp: train_ddp.py, b per process.
Once per round, at the smallest batch, `nocomm`: train_ddp.py whose communication hook sends nothing, so DDP's own
work per step (its hooks, the copies into and out of the buckets, its forward's checks) is timed against the pair's;
at the largest, `solo`: 1 process at b alone, for the cache effect (b against 2b, nothing beside it), and `buckets`:
train_ddp.py with small gradient buckets (section 6's lever, compared with the ddp run of its own round).

The prediction of a DDP step is the pair's step (the slower rank's, step by step: DDP's ranks wait for each other in
every step) + DDP's own work + the all-reduce of the gradients as training runs it (the step clock's transfer part of
the DDP runs at the OTHER batches, the median of their quiet rounds; above the fitted alpha + S / bandwidth, since
gloo's and the kernel's work lands on cores that compute). Nothing of the ddp run it predicts goes in. A point is
checked where all its rounds ran quiet, on the median over them of predicted / measured: one round the host slowed
can neither fail it nor pass it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ..claims import Claim
from . import quiet
from .timing import NOISY_SPREAD, checked_margin, rounds_spread

COMPUTE = ("data", "forward", "backward", "clip", "optimizer")
PER_EXAMPLE = ("data", "forward", "backward")  # shrinks with the batch
REPEATED = ("clip", "optimizer")  # every rank does it over all parameters, whatever its batch
KINDS = ("single", "pair", "ddp")
SHOWN = ("data", "forward", "backward", "waiting", "transfer", "clip", "optimizer")  # a step's parts, in order
BOUND = 0.15  # a prediction is right within this share of the measurement
# The range of 3 rounds understates how far their median strays from the truth: sweeps resampled from the rounds of 8
# launches on a busy day of this machine failed a check within 1x their range 4.6% of the time, within 2x 0.3%
SPREAD_TIMES = 2.0
GAP_BOUND = 0.10  # the parts explain the DDP step within this share of it (or within what its runs moved)
SMALL_BUCKET_MB = 0.25  # the `buckets` runs' cap: one bucket per 0.25 MiB instead of DDP's 25 MiB


def step_s(run: dict) -> float:
    """Seconds per step of a run (its slowest rank's)."""
    return run["seconds"] / run["steps"]


def lockstep_s(run: dict) -> float:
    """Seconds per step if the run's ranks had waited for each other in every step, as DDP's do: the mean over the
    steps of the slowest rank's step. For a pair (ranks that never wait) it is above its slower rank's mean step by
    the steps' own jitter; where the steps were not recorded one by one, the slower rank's mean."""
    times = [r.get("step_times") for r in run["ranks"]]
    if not all(times) or len({len(t) for t in times}) != 1:
        return step_s(run)
    return sum(max(ts) for ts in zip(*times)) / len(times[0])


def part(run: dict, *names: str, rank=None) -> float:
    """Seconds per step of these parts: one rank's, or the ranks' mean."""
    ranks = run["ranks"] if rank is None else [run["ranks"][rank]]
    return sum(r["parts"][p] for r in ranks for p in names) / len(ranks)


def compute_s(run: dict) -> float:
    """Seconds per step the slower rank computed (everything but the communication)."""
    return max(sum(r["parts"][p] for p in COMPUTE) for r in run["ranks"])


def others(run: dict) -> float | None:
    """Cores other programs kept busy during a run (None where /proc/stat is missing)."""
    return quiet.others(run)


def sweep_plan(flags, batches, n: int, samples: int, rounds: int, warmup: int = 1) -> dict:
    """The runs of the sweep, in the order they run: `flags(name, batch, steps, *extra, world=1)` gives a run's command
    line. Each run times max(2, samples / (n b)) steps: the same global work at every batch."""
    runs, small, large = {}, batches[0], batches[-1]

    def add(name, world, batch, steps, *extra, **more):  # world: how many processes share the run's examples
        runs[name] = dict(
            world=world,
            warmup=warmup,
            steps=steps,
            per_rank=batch,
            breakdown=True,
            **more,
            flags=[str(f) for f in flags(name, batch, steps, *extra, world=world)],
        )

    for k in range(rounds):
        for b in batches:
            steps = max(2, samples // (n * b))
            add(f"single_b{b}_r{k}", 1, n * b, steps)
            add(f"pair_b{b}_r{k}", 1, b, steps, every_rank=True)
            add(f"ddp_b{b}_r{k}", n, b, steps)
            if b == small:
                add(f"nocomm_b{b}_r{k}", n, b, steps, hook="none")
            if b == large:
                add(f"buckets_b{b}_r{k}", n, b, steps, "--bucket_cap_mb", SMALL_BUCKET_MB)
        add(f"solo_b{large}_r{k}", 1, large, max(2, samples // (n * large)))
    return runs


def run_line(line: str) -> str | None:
    """What the notebook shows of the launch's output while it runs: one line per run (bench_runs.py's)."""
    return line.removeprefix("[bench_runs] ") if line.startswith("[bench_runs]") else None


@dataclass
class Model:
    """A DDP step predicted from a pair's step: + DDP's own work + the all-reduce as training runs it."""

    n: int
    overhead_s: float  # DDP's own work per step: hooks, bucket copies, the division (nocomm's step less the pair's)
    helpers_s: float  # gloo's threads' CPU per step while a nocomm rank computed (its forward's broadcast)
    comm_s: float  # the all-reduce of the gradients, from the fit (one message per bucket)
    grad_bytes: float
    buckets: int
    # batch -> each round's all-reduce as training ran it there, with whether that round was quiet: the DDP run's
    # transfer part per step (from the slower rank's backward end to the all-reduce's return; perf_model.breakdown)
    transfer_rounds: dict = None

    @property
    def transfer_s(self) -> dict:
        """batch -> the all-reduce inside training there: the median of its quiet rounds (of all, where none was)."""
        return {b: _median_of_quiet(v) for b, v in (self.transfer_rounds or {}).items()}

    def comm_for(self, b) -> float:
        """The all-reduce for a point at batch b: as training ran it at the OTHER batches (never b's own DDP runs), the
        median of their quiet rounds (of all, where none was quiet), or the fit where no other batch was measured.
        Timed inside each step, not as the DDP step less the pair's: those are two runs seconds apart, and where a host
        moves a run by 20% that difference moves by 50 ms at 256 per process, four times the all-reduce."""
        pooled = [x for o, v in (self.transfer_rounds or {}).items() if o != b for x in v]
        return _median_of_quiet(pooled) if pooled else self.comm_s

    def step(self, pair_step: float, b=None) -> float:
        return pair_step + self.overhead_s + self.comm_for(b)

    def speedup(self, single_step: float, pair_step: float, b=None) -> float:
        # Not capped at n: the pair's step carries the cache effect (half the batch per process can cost less per
        # example than the whole batch in one process), and so may the prediction, as the measurement does.
        return single_step / self.step(pair_step, b)

    def terms_line(self, batches) -> str:
        """The model's terms, in two lines that say where each was measured: DDP's own work at the smallest batch only
        (the nocomm run), used at every batch; each batch's all-reduce from training at the OTHER batches (comm_for)."""
        own = ", ".join(f"{1000 * s:.1f} at {b}" for b, s in sorted(self.transfer_s.items()))
        return (
            f"DDP's own work {1000 * self.overhead_s:.1f} ms per step: measured at {min(batches)} per process only "
            f"(the nocomm run), used at every batch\nthe all-reduce of {self.grad_bytes / 2**20:.1f} MiB of gradients "
            f"in {self.buckets} bucket(s), each batch's taken from training at the others: "
            + ", ".join(f"{1000 * self.comm_for(b):.1f} ms for {b}" for b in batches)
            + f"\n  (training's own, the median over the rounds: {own} ms; the alpha-beta fit says "
            f"{1000 * self.comm_s:.1f} ms)"
        )

    @classmethod
    def from_runs(cls, R: dict, fit, n: int, small: int, rounds: int, gpus: bool = False) -> Model:
        """The terms from the launch's nocomm and pair runs (the median of the rounds) and the all-reduce fit."""
        # nocomm's ranks meet once a step (its forward broadcasts the buffers), so both sides wait step by step
        own = [step_s(R[f"nocomm_b{small}_r{k}"]) - lockstep_s(R[f"pair_b{small}_r{k}"]) for k in range(rounds)]
        helpers = statistics.median(part(R[f"nocomm_b{small}_r{k}"], "helpers_cpu") for k in range(rounds))
        r0 = R[f"nocomm_b{small}_r0"]["ranks"][0]  # its hook counted the buckets and their bytes, sending none
        buckets = round(r0["allreduces"] / r0["synced_backwards"])
        grad_bytes = r0["allreduce_bytes"] / r0["synced_backwards"]
        # never below zero: DDP cannot compute faster than the same work without it (a negative difference is noise)
        comm = fit.seconds(grad_bytes, messages=buckets)
        overhead = max(0.0, statistics.median(own))
        # the all-reduce as training runs it, at each batch and round: the DDP run's transfer part; above the fit, since
        # gloo's and the kernel's work lands on cores that compute
        batches = sorted({int(name.split("_b")[1].split("_")[0]) for name in R if name.startswith("ddp_b")})
        transfer = {
            b: [
                (
                    part(R[f"ddp_b{b}_r{k}"], "transfer"),
                    round_quiet([R[f"{kind}_b{b}_r{k}"] for kind in KINDS], gpus),
                )
                for k in range(rounds)
            ]
            for b in batches
        }
        return cls(n, overhead, helpers, comm, grad_bytes, buckets, transfer)


def round_quiet(runs, gpus: bool = False) -> bool:
    """Whether a round's runs had the machine to themselves (quiet.all_quiet)."""
    return quiet.all_quiet(runs, gpus)


def _median_of_quiet(values: list[tuple[float, bool]]) -> float:
    """The median of the values whose round was quiet, or of all where none was."""
    return statistics.median([x for x, q in values if q] or [x for x, _ in values])


def points(R: dict, model: Model, batches, rounds: int, gpus: bool = False) -> list[dict]:
    """Per batch: every round's single, pair and ddp step, its prediction and measurement (1 and N processes compared
    within the round), and the median round by measured speedup (of the quiet rounds, where any was quiet), whose
    figures the point reports."""
    out = []
    for b in batches:
        rows = []
        for k in range(rounds):
            runs = {kind: R[f"{kind}_b{b}_r{k}"] for kind in KINDS}
            s1, sp, sd = step_s(runs["single"]), lockstep_s(runs["pair"]), step_s(runs["ddp"])
            rows.append(
                dict(
                    round=k,
                    single=s1,
                    pair=sp,
                    ddp=sd,
                    predicted=model.speedup(s1, sp, b),
                    measured=s1 / sd,
                    runs=runs,
                    others=max((others(r) or 0.0) for r in runs.values()),
                    quiet=round_quiet(runs.values(), gpus),
                )
            )
        # the median round by measured speedup, of the quiet rounds where there are any: a round other programs
        # slowed says more about them than about DDP (the table shows every round)
        pool = [r for r in rows if r["quiet"]] or rows
        kept = sorted(pool, key=lambda r: r["measured"])[(len(pool) - 1) // 2]
        out.append(
            dict(
                b=b,
                rounds=rows,
                kept=kept["round"],
                # what the check reads: predicted / measured in each of those rounds, and their median
                ratios=[r["predicted"] / r["measured"] for r in pool],
                ratio=statistics.median(r["predicted"] / r["measured"] for r in pool),
                # checked where every round ran quiet: a median of fewer rounds is not guarded from the host
                quiet=all(r["quiet"] for r in rows),
                **{k: kept[k] for k in ("predicted", "measured", "others", "runs")},
            )
        )
    return out


def point_spread(p: dict) -> float:
    """One batch's run-to-run spread: the range of its measured speedups over its quiet rounds, as a share of their
    median (over every round where fewer than 2 ran quiet). Measured only, so a wrong model cannot widen it. A busy
    host moves a whole run by 10-50% while this VM's other programs stay under the quiet bound (seen on a 2-core
    machine): a prediction can be checked no closer than its own rounds agree with each other."""
    speeds = [r["measured"] for r in p["rounds"] if r["quiet"]]
    return rounds_spread(speeds if len(speeds) >= 2 else [r["measured"] for r in p["rounds"]])


def spread(pts: list[dict]) -> float:
    """The sweep's widest point_spread: what the host did to a whole round (section 4 holds its dialed runs to it)."""
    return max((point_spread(p) for p in pts if p["rounds"]), default=0.0)


def point_margin(p: dict, bound: float = BOUND) -> float | None:
    """The share one batch's prediction is checked within: `bound`, or SPREAD_TIMES its own rounds' spread where
    wider; None where they disagree by more than NOISY_SPREAD (timing.checked_margin): the host moved whole runs more
    than a model good to `bound` can be told from them, so the point is shown, not checked. Each batch's own: a batch
    whose rounds agree is held to `bound`, whatever another batch's rounds did."""
    return checked_margin(bound, point_spread(p), SPREAD_TIMES)


def margin(pts: list[dict], bound: float = BOUND) -> float | None:
    """checked_margin on the sweep's widest spread: for section 4's dialed runs, which the host moves as a round."""
    return checked_margin(bound, spread(pts), SPREAD_TIMES)


def speedup_claims(pts: list[dict], bound: float = BOUND) -> list[Claim]:
    """One claim per batch: the median over its rounds of predicted / measured is within that batch's point_margin
    of 1. Each round's prediction and measurement ran back to back, and the median keeps one round the host slowed
    from deciding the verdict either way. Checked where every round of the point ran quiet (a median of fewer rounds
    is not guarded from the host) and its rounds agreed within NOISY_SPREAD."""
    out = []
    for p in pts:
        m = point_margin(p, bound)
        within = m if m is not None else bound
        which = "rounds" if len(p["ratios"]) == len(p["rounds"]) else "quiet rounds"
        ratios = f"model / measured {', '.join(f'{x:.2f}' for x in p['ratios'])} over its {len(p['ratios'])} {which}"
        if not p["quiet"]:
            busy = sum(not r["quiet"] for r in p["rounds"])
            why = (
                f"other programs used up to {max(r['others'] for r in p['rounds']):.2f} cores in {busy} of its "
                f"{len(p['rounds'])} rounds"
            )
        elif m is None:
            why = (
                f"the host moved whole runs: this batch's measured speedups moved by {100 * point_spread(p):.0f}% "
                "from round to round"
            )
        else:
            why = None
        if why is None:
            text = (
                f"at {p['b']} per process the model ({p['predicted']:.2f}x) is within {100 * within:.0f}% of the "
                f"measurement ({p['measured']:.2f}x): {ratios}, median {p['ratio']:.2f}"
            )
        else:
            # each round's ratio stands in the table beside the NOTE
            text = f"at {p['b']} per process the model says {p['predicted']:.2f}x, the run {p['measured']:.2f}x"
        out.append(Claim(text, abs(p["ratio"] - 1) < within, why))
    return out


def verdicts(pts: list[dict], bound: float = BOUND) -> list[tuple[bool, str]]:
    """(held, claim) for each point speedup_claims checks: the ones this run can decide."""
    return [(c.holds, c.text) for c in speedup_claims(pts, bound) if c.checked]


GAP_LABELS = {  # the gap's parts, as the table and the figure name them (section 2's prose says what each is)
    "repeated": "clipping + optimizer on every rank",
    "cache": "cache effect: b alone vs 2b",
    "sharing": "2 processes share the machine",
    "ddp_own": "DDP's hooks and bucket copies",
    "gloo": "gloo's threads beside compute",
    "others": "other programs (DDP's run vs the pair's)",
    "transfer": "the all-reduce's transfer",
    "waiting": "waiting for the slower rank",
    "rest": "the rest (none of the above)",
}


def gap_parts(R: dict, point: dict, model: Model, n: int, cores: int) -> dict:
    """The DDP step at the point's median round, less the even split (1 process's step / N), taken apart into parts each
    measured on its own (seconds per step, signed: + costs time, - saves it; keys of GAP_LABELS); 'rest' is what none
    explains."""
    k, b = point["kept"], point["b"]
    one, pair, ddp, solo = (R[f"{kind}_b{b}_r{k}"] for kind in ("single", "pair", "ddp", "solo"))
    per_ex_one = part(one, *PER_EXAMPLE) / n
    # a core's share for one of our n processes, with `busy` cores of other programs' demand beside them; below the
    # quiet bound the figure is this machine's noise (and the kernel's own work for our traffic), not a program
    share = lambda busy: min(1.0, cores / (n + max(0.0, busy - quiet.QUIET_CORES)))  # noqa: E731
    busy_pair, busy_ddp = others(pair) or 0.0, others(ddp) or 0.0
    parts = {
        "repeated": part(pair, *REPEATED) - part(one, *REPEATED) / n,
        "cache": part(solo, *PER_EXAMPLE) - per_ex_one,
        "sharing": part(pair, *PER_EXAMPLE) - part(solo, *PER_EXAMPLE),
        "ddp_own": model.overhead_s,
        "gloo": part(ddp, "helpers_cpu") - model.helpers_s,
        "others": compute_s(pair) * (share(busy_pair) / share(busy_ddp) - 1),
        "transfer": part(ddp, "transfer"),
        "waiting": part(ddp, "waiting"),
    }
    parts["rest"] = step_s(ddp) - step_s(one) / n - sum(parts.values())
    return parts


@dataclass
class Sweep:
    """The launch's sweep after the fact: the model's terms, each batch's point, and the tables and claims of
    chapter 05's sections 2 (a step taken apart) and 3 (the model against the measured speedup)."""

    R: dict
    model: Model
    pts: list
    n: int
    rounds: int
    cores: int
    gpus: bool = False
    at: dict = field(init=False)

    def __post_init__(self):
        self.at = {p["b"]: p for p in self.pts}

    @classmethod
    def from_launch(cls, R: dict, fit, batches, n: int, rounds: int, cores: int, gpus: bool = False) -> Sweep:
        model = Model.from_runs(R, fit, n, batches[0], rounds, gpus)
        return cls(R, model, points(R, model, batches, rounds, gpus), n, rounds, cores, gpus)

    @property
    def batches(self) -> list:
        return [p["b"] for p in self.pts]

    @property
    def large(self) -> int:
        return self.batches[-1]

    def run(self, kind: str, b=None) -> dict:
        """The `kind` run (single, pair, ddp, solo, buckets) at batch b (the largest by default), in that batch's
        median round."""
        b = self.large if b is None else b
        return self.R[f"{kind}_b{b}_r{self.at[b]['kept']}"]

    # ------------------------------------------------------------------ section 2: one step taken apart

    def parts_rows(self) -> list[tuple[str, dict]]:
        """(label, ms per step of each part in SHOWN, and 'step') for every rank of the largest batch's runs; waiting
        and transfer are None for the runs without DDP, which make no all-reduce to wait for or transfer."""
        n, b = self.n, self.large
        rows = []
        for label, kind in (
            (f"1 process, {n * b}", "single"),
            (f"1 process, {b}", "solo"),
            (f"pair, {b} each", "pair"),
            (f"DDP, {b} each", "ddp"),
        ):
            run = self.run(kind)
            for i, r in enumerate(run["ranks"]):
                ms = {p: 1000 * r["parts"][p] for p in SHOWN}
                if kind != "ddp":  # no all-reduce ran: what the clock reads there is backward()'s own return
                    ms["waiting"] = ms["transfer"] = None
                ms["step"] = 1000 * r["seconds"] / r["steps"]
                rows.append((label + (f" (rank {i})" if len(run["ranks"]) > 1 else ""), ms))
        return rows

    def parts_table(self) -> str:
        head = f"{'ms per step at ' + str(self.large) + ' per process':<30}" + "".join(f"{p:>10}" for p in SHOWN)
        lines = [head + f"{'step':>10}"]
        for label, ms in self.parts_rows():
            cells = ("" if ms[p] is None else f"{ms[p]:.1f}" for p in (*SHOWN, "step"))
            lines.append(f"{label:<30}" + "".join(f"{c:>10}" for c in cells))
        return "\n".join(lines)

    def gap(self) -> dict:
        """gap_parts at the largest batch (seconds per step)."""
        return gap_parts(self.R, self.at[self.large], self.model, self.n, self.cores)

    @property
    def ideal_s(self) -> float:
        return step_s(self.run("single")) / self.n

    @property
    def ddp_s(self) -> float:
        return step_s(self.run("ddp"))

    def gap_table(self) -> str:
        single, ddp = step_s(self.run("single")), self.ddp_s
        ideal = f"even split: 1 process's step / {self.n} ({1000 * single:.1f} / {self.n})"
        lines = [f"{ideal:<42} {1000 * self.ideal_s:>8.1f} ms"]
        lines += [f"  {GAP_LABELS[k]:<40} {1000 * v:>+8.1f}" for k, v in self.gap().items()]
        lines.append(f"{f'DDP step, measured: {single / ddp:.2f}x':<42} {1000 * ddp:>8.1f} ms")
        return "\n".join(lines)

    def gap_rest_line(self) -> str:
        """A printed fact, not a check: what no part of section 2's table explains, beside how far the runs it rests on
        moved over the rounds. That spread (the sum of four runs' round-to-round ranges, tens of ms on a shared 2-core
        machine) is wider than most parts, so a check within it would pass with a part left out: the table is shown,
        and gap_claim only decides whether the story may name its largest parts."""
        step, rest = self.ddp_s, self.gap()["rest"]
        return (
            f"the rest: {1000 * rest:+.1f} ms of the DDP step ({1000 * step:.1f} ms) that no part explains; the runs "
            f"it rests on moved by {1000 * self.gap_noise_s():.0f} ms over the rounds: the table is shown, not checked"
        )

    def gap_noise_s(self) -> float:
        """The sum of the round-to-round ranges of the runs the rest is a difference of (single / N, pair, ddp,
        solo)."""
        b = self.large
        steps = {kind: [step_s(self.R[f"{kind}_b{b}_r{k}"]) for k in range(self.rounds)] for kind in (*KINDS, "solo")}
        return sum((max(s) - min(s)) / (self.n if kind == "single" else 1) for kind, s in steps.items())

    def gap_bound_s(self) -> float:
        """gap_claim's bound: GAP_BOUND of the DDP step, or what the runs behind the gap moved, whichever is more."""
        return max(GAP_BOUND * self.ddp_s, self.gap_noise_s())

    def gap_claim(self) -> Claim:
        """The parts, each measured on its own, explain the DDP step: what is left ('rest') is within GAP_BOUND of the
        step, or within what the runs it rests on moved over the rounds, whichever is more. The rest is a difference
        of four runs' medians (single / N, pair, ddp, solo), so it moves by as much as they move: the sum of their
        ranges over the rounds. Checked where those runs all ran quiet and that sum is under NOISY_SPREAD of the
        step: a bound wider than that would let any rest pass."""
        b, step, rest = self.large, self.ddp_s, self.gap()["rest"]
        noise, bound = self.gap_noise_s(), self.gap_bound_s()
        left = f"{1000 * rest:+.1f} ms of the DDP step ({1000 * step:.1f} ms) are left unexplained"
        runs = [self.R[f"{kind}_b{b}_r{k}"] for kind in (*KINDS, "solo") for k in range(self.rounds)]
        if not quiet.all_quiet(runs, self.gpus):
            why = quiet.busy_reason(runs)
        elif noise > NOISY_SPREAD * step:
            why = f"the runs it rests on moved by {1000 * noise:.0f} ms over the rounds, more than 30% of the step"
        else:
            why = None
        text = f"the parts, each measured on its own, explain the DDP step within {1000 * bound:.1f} ms: {left}"
        return Claim(text if why is None else f"the parts: {left}", abs(rest) <= bound, why)

    # ------------------------------------------------------------------ section 3: the model against the run

    def speedup_table(self) -> str:
        """Each batch's model and measured speedup (its median round), then every round's measured speedup with the
        model's ratio to it: the rounds' spread is on the page, beside the figure the story quotes."""
        lines = [
            f"{'batch/process':>13} {'model':>7} {'measured':>9}   measured in each round "
            "(model/measured; * the round of the median speedup)"
        ]
        for p in self.pts:
            rounds = "  ".join(
                f"{r['measured']:.2f}x ({r['predicted'] / r['measured']:.2f})"
                + ("*" if r["round"] == p["kept"] else " ")
                + ("" if r["quiet"] else f" (busy: {r['others']:.2f} cores)")
                for r in p["rounds"]
            )
            lines.append(f"{p['b']:>13} {p['predicted']:>6.2f}x {p['measured']:>8.2f}x   {rounds}")
        return "\n".join(lines)

    def speedup_claims(self) -> list[Claim]:
        return speedup_claims(self.pts)
