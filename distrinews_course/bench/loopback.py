"""Chapter 05's loopback sweep: the runs of one launch, and the model that predicts each DDP point from the runs
beside it in the same round.

    runs = loopback.sweep_plan(flags, batches=(16, 64, 256), n=2, samples=1024, rounds=3)  # for scripts/bench_runs.py
    model = loopback.Model.from_runs(R, fit, n=2, small=16, rounds=3)      # after the launch: the terms, measured
    pts = loopback.points(R, model, batches, rounds)                      # each batch: its rounds, its median round
    for ok, claim in loopback.verdicts(pts): check(ok, claim)             # quiet rounds, within margin(pts)

Per batch b and round k the launch runs, back to back:
- single: 1 process, 2b per step (the baseline, the other core idle);
- pair: 2 processes at once, b each, no communication: what a DDP rank computes, the machine shared;
- ddp: train_ddp.py, b per process.
Once per round, at the smallest batch, `nocomm`: train_ddp.py whose communication hook sends nothing, so DDP's own
work per step (its hooks, the copies into and out of the buckets, its forward's checks) is timed against the pair's;
and at the largest, `solo`: 1 process at b alone, for the cache effect (b against 2b, nothing beside it).

The prediction of a DDP step is the pair's step (the slower rank's, step by step: DDP's ranks wait for each other in
every step) + DDP's own work + the all-reduce of the gradients as training runs it (the step clock's transfer part of
the DDP runs at the OTHER batches, the median of their quiet rounds; above the fitted alpha + S / bandwidth, since
gloo's and the kernel's work lands on cores that compute). Nothing of the ddp run it predicts goes in. A point is
checked where all its rounds ran quiet, on the median over them of predicted / measured: one round the host slowed
can neither fail it nor pass it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .timing import checked_margin, rounds_spread

COMPUTE = ("data", "forward", "backward", "clip", "optimizer")
PER_EXAMPLE = ("data", "forward", "backward")  # shrinks with the batch
REPEATED = ("clip", "optimizer")  # every rank does it over all parameters, whatever its batch
KINDS = ("single", "pair", "ddp")
QUIET_CORES = 0.3  # other programs' cores above which a run is 'busy'
BOUND = 0.15  # a prediction is right within this share of the measurement
# The range of 3 rounds understates how far their median strays from the truth: sweeps resampled from the rounds of 8
# launches on a busy day of this machine failed a check within 1x their range 4.6% of the time, within 2x 0.3%
SPREAD_TIMES = 2.0


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
    from ..perf_model import others_cores

    return others_cores(run)


def sweep_plan(flags, batches, n: int, samples: int, rounds: int, warmup: int = 1) -> dict:
    """The runs of the sweep, in the order they run: `flags(name, batch, steps, *extra, world=1)` gives a run's command
    line. Each run times max(2, samples / (n b)) steps: the same global work at every batch."""
    runs, small, large = {}, batches[0], batches[-1]

    def add(name, world, batch, steps, **extra):  # world: how many processes share the run's examples
        runs[name] = dict(
            world=world,
            warmup=warmup,
            steps=steps,
            per_rank=batch,
            breakdown=True,
            **extra,
            flags=[str(f) for f in flags(name, batch, steps, world=world)],
        )

    for k in range(rounds):
        for b in batches:
            steps = max(2, samples // (n * b))
            add(f"single_b{b}_r{k}", 1, n * b, steps)
            add(f"pair_b{b}_r{k}", 1, b, steps, every_rank=True)
            add(f"ddp_b{b}_r{k}", n, b, steps)
            if b == small:
                add(f"nocomm_b{b}_r{k}", n, b, steps, hook="none")
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
    """Whether a round's runs had the machine to themselves: other programs under QUIET_CORES in each (on GPUs,
    always: the devices compute, not the shared cores)."""
    return gpus or all(x is not None and x < QUIET_CORES for x in map(others, runs))


def _median_of_quiet(values: list[tuple[float, bool]]) -> float:
    """The median of the values whose round was quiet, or of all where none was."""
    return statistics.median([x for x, quiet in values if quiet] or [x for x, _ in values])


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


def missed(point: dict, model: Model) -> dict:
    """Where the median round's DDP step left its prediction, in seconds per step: DDP's compute against the pair's
    plus DDP's own work, its communication against the fit; and the other programs' cores in the pair's run and
    the ddp run (on a shared core, a busier run computes slower)."""
    runs = point["runs"]
    return {
        "compute": compute_s(runs["ddp"]) - compute_s(runs["pair"]) - model.overhead_s,
        "comm": step_s(runs["ddp"]) - compute_s(runs["ddp"]) - model.comm_for(point["b"]),
        "others_pair": others(runs["pair"]) or 0.0,
        "others_ddp": others(runs["ddp"]) or 0.0,
        "predicted_step": model.step(point["rounds"][point["kept"]]["pair"], point["b"]),
        "measured_step": step_s(runs["ddp"]),
    }


def spread(pts: list[dict]) -> float:
    """The sweep's own run-to-run spread: the range of a batch's measured speedups over its quiet rounds, as a share
    of their median, the widest over the batches that had 2 or more quiet rounds (over every round where none had).
    Measured only, so a wrong model cannot widen it. A busy host moves a whole run by 10-50% while this VM's other
    programs stay under the quiet bound (seen on a 2-core machine): a prediction can be checked no closer than the
    rounds agree with each other."""
    speeds = [[r["measured"] for r in p["rounds"] if r["quiet"]] for p in pts]
    speeds = [x for x in speeds if len(x) >= 2] or [[r["measured"] for r in p["rounds"]] for p in pts]
    return max((rounds_spread(x) for x in speeds if x), default=0.0)


def margin(pts: list[dict], bound: float = BOUND) -> float | None:
    """The share each prediction is checked within: `bound`, or SPREAD_TIMES the sweep's own spread where wider;
    None where the rounds disagree by more than NOISY_SPREAD: the host moved whole runs more than a model good to
    `bound` can be told from them, so the points are shown, not checked (`notes` says so)."""
    return checked_margin(bound, spread(pts), SPREAD_TIMES)


def verdicts(pts: list[dict], bound: float = BOUND) -> list[tuple[bool, str]]:
    """(held, claim) for each point whose rounds all ran quiet: the median over its rounds of predicted / measured
    within `margin` of 1. Each round's prediction and measurement ran back to back; the median keeps one
    round the host slowed from deciding the verdict either way."""
    m = margin(pts, bound)
    if m is None:
        return []
    return [
        (
            abs(p["ratio"] - 1) < m,
            f"at {p['b']} per process the prediction is within {100 * m:.0f}% of the measurement (predicted / "
            f"measured {', '.join(f'{x:.2f}' for x in p['ratios'])} over its {len(p['ratios'])} rounds, median "
            f"{p['ratio']:.2f}; {100 * bound:.0f}%, or twice the rounds' own spread where wider)",
        )
        for p in pts
        if p["quiet"]
    ]


def notes(pts: list[dict], model: Model) -> list[str]:
    """For each point not checked (other programs were busy): which part of the prediction missed, by how much; and,
    first, why none is checked where the rounds themselves disagreed too much (`margin`)."""
    lines = []
    if margin(pts) is None:
        lines.append(
            f"NOTE: a batch's measured speedups moved by {100 * spread(pts):.0f}% of their median from round to round, "
            f"more than twice the {100 * BOUND:.0f}% the model is checked to, while other programs here stayed under "
            f"{QUIET_CORES} cores: the host moved whole runs (a virtual machine shares its physical cores with other "
            "guests). The points are shown, not checked; on a quiet host the rounds agree within a few percent."
        )
    for p in pts:
        if p["quiet"]:
            continue
        m = missed(p, model)
        quiet = sum(r["quiet"] for r in p["rounds"])
        lines.append(
            f"NOTE: at {p['b']} per process {quiet} of {len(p['rounds'])} rounds ran quiet (other programs used up to "
            f"{max(r['others'] for r in p['rounds']):.2f} cores in a round; in the median round "
            f"{m['others_ddp']:.2f} during the DDP run and {m['others_pair']:.2f} during the pair's), so this point "
            f"is shown, not checked: predicted {p['predicted']:.2f}x, measured {p['measured']:.2f}x. The DDP step took "
            f"{1000 * m['measured_step']:.1f} ms against {1000 * m['predicted_step']:.1f} predicted: its compute "
            f"{1000 * m['compute']:+.1f} ms off the pair's + DDP's own work, its all-reduce "
            f"{1000 * m['comm']:+.1f} ms off the one measured at the other batches"
        )
    return lines


def gap_parts(R: dict, point: dict, model: Model, n: int, cores: int) -> dict:
    """The DDP step at the point's median round, less the ideal (1 process's step / N), taken apart into parts each
    measured on its own (seconds per step, signed: + costs time, - saves it); 'the rest' is what none explains."""
    k, b = point["kept"], point["b"]
    one, pair, ddp, solo = (R[f"{kind}_b{b}_r{k}"] for kind in ("single", "pair", "ddp", "solo"))
    per_ex_one = part(one, *PER_EXAMPLE) / n
    # a core's share for one of our n processes, with `busy` cores of other programs' demand beside them; below the
    # quiet bound the figure is this machine's noise (and the kernel's own work for our traffic), not a program
    share = lambda busy: min(1.0, cores / (n + max(0.0, busy - QUIET_CORES)))  # noqa: E731
    busy_pair, busy_ddp = others(pair) or 0.0, others(ddp) or 0.0
    parts = {
        "work every rank repeats (clipping and the optimizer over all parameters)": part(pair, *REPEATED)
        - part(one, *REPEATED) / n,
        "the cache effect: 1 process alone at b against 2b, per example (-: the smaller batch is cheaper)": part(
            solo, *PER_EXAMPLE
        )
        - per_ex_one,
        "two processes at once: the pair against 1 process alone at b (memory, caches, a slower core)": part(
            pair, *PER_EXAMPLE
        )
        - part(solo, *PER_EXAMPLE),
        "DDP's hooks and bucket copies (measured with a hook that sends nothing)": model.overhead_s,
        "gloo's threads on the cores while forward and backward ran (their CPU time beyond DDP's own)": part(
            ddp, "helpers_cpu"
        )
        - model.helpers_s,
        "the other programs' share of the cores (DDP's run against the pair's)": compute_s(pair)
        * (share(busy_pair) / share(busy_ddp) - 1),
        "the all-reduce's transfer": part(ddp, "transfer"),
        "waiting for the slower rank": part(ddp, "waiting"),
    }
    parts["the rest (none of the above)"] = step_s(ddp) - step_s(one) / n - sum(parts.values())
    return parts
