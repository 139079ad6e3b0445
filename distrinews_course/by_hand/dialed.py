"""Chapter 03's race on a dialed link (scripts/cluster/box.py): the prediction made before it runs (the link's rate, and
each rung's step from one step alone and scaling_limits' cost of its collectives), what the run showed, and the claims
those figures support.

    p = plan(bucket_mb=0.5, batch=48, comm_over_backward=1.5)     # before the race: the rate to dial, the predictions
    o = outcome(dial_json, p)                                      # after it: the medians, the rounds, the point
    print(table(o, p, loopback_ratio)); settle(claims(o, p, ...))
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from .. import scaling_limits
from ..claims import Claim
from . import SCRIPTS, models, report

MiB = 2**20


@dataclass
class Plan:
    """The dialed race's prediction, all of it made before the race runs."""

    bucket_mb: float
    batch: int  # texts per rank and step
    elements: int  # of the wide model's gradients
    buckets: list  # elements of each bucket at bucket_mb, in the order they leave (the rung's own rule)
    embedding_last: bool  # the last bucket holds the word embedding (defined first, ready last)
    alone: dict  # one step alone, no communication: forward, backward, optimizer (seconds)
    mbit: int  # the rate to dial
    comm_s: float  # flat's one all-reduce on that link (scaling_limits.point)
    last_s: float  # the last bucket's
    predicted: dict = field(default_factory=dict)  # {flat, bucketed}: seconds per step

    @property
    def compute_s(self) -> float:
        return sum(self.alone.values())

    @property
    def could_save(self) -> float:
        """What bucketing can save at most: every bucket but the last hidden under backward."""
        return self.comm_s - self.last_s

    @property
    def ratio(self) -> float:
        return self.predicted["flat"] / self.predicted["bucketed"]

    def lines(self) -> list[str]:
        back, grad = self.alone["backward"], 4 * self.elements
        return [
            f"wide model: {grad / MiB:.2f} MiB of gradients; {len(self.buckets)} buckets at {self.bucket_mb} MiB, the "
            f"last {4 * self.buckets[-1] / MiB:.2f} MiB ({100 * self.buckets[-1] / self.elements:.0f}% of the bytes, "
            f"{'with' if self.embedding_last else 'WITHOUT'} the word embedding)",
            f"one step alone, {self.batch} texts: forward {1000 * self.alone['forward']:.0f} ms, backward "
            f"{1000 * back:.0f} ms, AdamW {1000 * self.alone['optimizer']:.0f} ms -> link {self.mbit} Mbit/s: flat's "
            f"all-reduce {1000 * self.comm_s:.0f} ms ({self.comm_s / back:.2f}x backward)",
            f"predicted before the run: flat {1000 * self.predicted['flat']:.0f} ms/step, bucketed "
            f"{1000 * self.predicted['bucketed']:.0f}, flat/bucketed {self.ratio:.2f}x; bucketing can save at most "
            f"{1000 * self.could_save:.0f} ms (its hidden buckets need "
            + ("less wire time than backward lasts)" if self.could_save <= back else "more than backward lasts)"),
        ]


def plan(bucket_mb: float, batch: int, comm_over_backward: float) -> Plan:
    """The rate at which flat's one all-reduce takes `comm_over_backward` x backward (measured: one step of the wide
    model alone, one thread, no dropout), and on it each rung's step: flat waits for backward, then sends every byte;
    bucketed sends each bucket as it completes, so at best only the last one (the word embedding, which backward
    makes last) is left after backward."""
    from .race import load

    wide = models.build_model("wide", seed=0)
    params = [p for p in wide.parameters() if p.requires_grad]
    rule = load(SCRIPTS / "bucketed.py", "bucket_rule").make_buckets  # the rung's own rule
    buckets = rule(params, bucket_mb * MiB)
    elements = sum(p.numel() for p in params)
    alone = models.step_seconds("wide", batch, dropout=False)
    per_mbit = scaling_limits.point("ddp", 2, scaling_limits.box(1), [elements], sum(alone.values()), batch)["comm_s"]
    mbit = max(10, round(per_mbit / (comm_over_backward * alone["backward"]) / 10) * 10)
    link = scaling_limits.box(mbit)
    comm = scaling_limits.point("ddp", 2, link, [elements], sum(alone.values()), batch)
    last = scaling_limits.point("ddp", 2, link, [sum(p.numel() for p in buckets[-1])], comm["compute_s"], batch)
    p = Plan(
        bucket_mb,
        batch,
        elements,
        [sum(x.numel() for x in b) for b in buckets],
        any(x is params[0] for x in buckets[-1]),
        alone,
        mbit,
        comm["comm_s"],
        last["comm_s"],
    )
    p.predicted = {"flat": p.compute_s + p.comm_s, "bucketed": p.compute_s + p.last_s}
    return p


def race_args(p: Plan, out_json, rounds: int, sweep: str, sweep_rounds: int) -> list:
    """scripts/by_hand/race.py's arguments for the dialed race: the bit check of rungs 1-5 on the tiny model (2
    steps: the link changes when bytes arrive, never which), then flat, overlapped and bucketed timed on the wide model
    at the plan's batch and bucket size, without dropout (its masks are CPU work that hides nothing), in `rounds`
    alternating rounds, and the bucket sweep (`sweep`, MiB, comma-separated) in `sweep_rounds`; no facts, no DDP
    sweep (the loopback race has them)."""
    return [
        *("--rungs", "naive,flat,overlapped,bucketed,zero1", "--sections", "check,timing", "--models", "tiny"),
        *("--check_steps", 2, "--timing_rungs", "flat,overlapped,bucketed", "--bucket_mb", p.bucket_mb),
        *("--timing_batch_size", p.batch, "--no-dropout", "--rounds", rounds, "--sweep", sweep),
        *("--sweep_rounds", sweep_rounds, "--no-sweep_ddp", "--no-facts", "--out", out_json),
    ]


def run(
    p: Plan,
    out_json,
    *,
    dial: bool = True,
    rounds: int = 5,
    sweep: str = "",
    sweep_rounds: int = 2,
    timeout: float = 300,
) -> tuple[dict | None, str]:
    """Race on 2 network namespaces whose link the kernel holds to the plan's rate (scripts/cluster/box.py, through
    link.run_in_box). Returns (the race's JSON, how the box was built), or (None, why not) where this machine cannot
    build a box or `dial` is False; says which in one line."""
    import json
    from pathlib import Path

    from .. import link

    ok, why = link.usable() if dial else (False, "DIAL = False")
    if not ok:
        print(f"no dialed link here ({why}): the unshaped race above is this chapter's result")
        return None, why
    link.run_in_box(
        SCRIPTS / "race.py", race_args(p, out_json, rounds, sweep, sweep_rounds), rate=f"{p.mbit}mbit", timeout=timeout
    )
    out = json.loads(Path(out_json).read_text())
    print(f"dialed race: {out['seconds']:.1f} s inside the launch, links at {p.mbit} Mbit/s")
    return out, why


def comm_span(events) -> float | None:
    """Seconds of flat's one all-reduce in a step's timeline (its comm_sync span), or None if it has none."""
    spans = [e["end"] - e["start"] for e in events if e["kind"] == "comm_sync"]
    return sum(spans) if spans else None


def outcome(dial: dict, p: Plan, quiet_cores: float) -> dict:
    """The dialed race's figures: medians, each round's flat/bucketed (rounds run every rung back to back, so a round
    something else slowed counts once, not for one rung only), what bucketing saved, what sending cost backward, and
    the point of scaling_limits this run measures (flat's all-reduce at 2 ranks against the computation)."""
    t = dial["timing"]
    med = t["median_step_s"]
    back = {n: statistics.median(t["backward_s"][n]) for n in med}
    per_round = list(zip(t["step_s"]["flat"], t["step_s"]["bucketed"]))
    measured_comm = comm_span(t["timelines"]["flat"]) if t.get("timelines") else None
    return {
        "median_s": med,
        "ratio_vs_ddp": t["ratio_vs_ddp"],
        "backward_s": back,
        "foreign_cores": t["foreign_cores"],
        "quiet": t["foreign_cores"] is not None and t["foreign_cores"] <= quiet_cores,
        "rounds_flat_over_bucketed": [f / b for f, b in per_round],
        "flat_over_bucketed": statistics.median(f / b for f, b in per_round),
        "saved_s": statistics.median(f - b for f, b in per_round),
        "flat_over_overlapped": statistics.median(
            f / o for f, o in zip(t["step_s"]["flat"], t["step_s"]["overlapped"])
        ),
        "send_cpu_s": statistics.median(b - f for f, b in zip(t["backward_s"]["flat"], t["backward_s"]["bucketed"])),
        "sweep": dial.get("sweep") or {},
        "point": {"comm_s": measured_comm, "predicted_comm_s": p.comm_s, "compute_s": p.compute_s},
        "bit_identical": {
            m: all(r[n]["max_weight_diff"] == 0.0 for n in ("naive", "flat", "overlapped", "bucketed"))
            and r["zero1"]["max_weight_diff"] <= 1e-6
            for m, r in dial["check"].items()
        },
    }


def table(o: dict, p: Plan, loopback_ratio: dict) -> str:
    head = ["", "loopback: vs DDP", "dialed: ms/step", "vs DDP", "predicted ms", "backward ms"]
    lines = [" ".join(f"{h:>{w}}" for h, w in zip(head, (10, 16, 16, 7, 12, 11)))]
    for n, s in o["median_s"].items():
        pred = f"{1000 * p.predicted[n]:.0f}" if n in p.predicted else "-"
        back = "-" if n == "ddp" else f"{1000 * o['backward_s'][n]:.0f}"  # DDP's backward holds its all-reduces
        ratio = o["ratio_vs_ddp"].get(n) or 1.0
        lines.append(
            f"{n:>10} {(loopback_ratio.get(n) or 1.0):>15.2f}x {1000 * s:>16.0f} {ratio:>6.2f}x {pred:>12} {back:>11}"
        )
    rounds = ", ".join(f"{r:.2f}" for r in o["rounds_flat_over_bucketed"])
    lines.append(
        f"\nflat/bucketed, round by round: {rounds}; bucketing saved {1000 * o['saved_s']:.0f} ms of the "
        f"{1000 * p.could_save:.0f} ms the model allows;\nsending made backward {1000 * o['send_cpu_s']:+.0f} ms "
        "(bucketed's less flat's, the median of the rounds)"
    )
    return "\n".join(lines)


def sweep_table(o: dict) -> str:
    """The dialed bucket sweep the sweep's claims read: per bucket size, its buckets, the median round's step and
    every round's (ms); the claims compare sizes round by round."""
    if not o["sweep"]:
        return "no bucket sweep on the dialed link"
    lines = [f"{'bucket MiB':>10} {'buckets':>7} {'ms/step':>8}  each round's ms/step"]
    for mb, v in o["sweep"].items():
        rounds = ", ".join(f"{1000 * r:.0f}" for r in v.get("bucketed_rounds_s") or [])
        lines.append(f"{mb:>10} {v['bucketed_buckets']:>7} {1000 * v['bucketed_step_s']:>8.0f}  {rounds}")
    return "\n".join(lines)


# Why the dialed claims' margins are what they are (DIAL_TARGET and DIAL_SAVED, the notebook's parameters, say how
# much): the ratio of two rungs in the same rounds, and a share of the model's saving, both checked only where other
# programs left the cores quiet; the sweep's two claims are report.sweep_claims'.
POINT_MARGIN = 0.15  # the measured all-reduce against scaling_limits' on the dialed cable: tc holds the rate to ~1%,
# gloo's fixed cost per message and the kernel's per-packet work add a few ms to 250; 15% leaves room for a busy host


def claims(o: dict, p: Plan, target: float, saved_share: float, bucket_mb: float) -> list:
    """What the dialed run supports: the link changes when bytes arrive, never which (always checked); bucketed beats
    flat by `target`, saves `saved_share` of the model's saving, overlapped beats flat, the sweep's two claims (checked
    on a quiet machine)."""
    busy = None if o["quiet"] else f"other programs kept {o['foreign_cores']:.2f} cores busy"
    out = [
        Claim(
            f"{m}, dialed link: naive, flat, overlapped and bucketed bit-identical to DDP, ZeRO-1 within 1e-6 (the "
            "link changes when bytes arrive, never which)",
            same,
        )
        for m, same in o["bit_identical"].items()
    ]
    out += [
        Claim(
            f"on the dialed link bucketed beats flat by {o['flat_over_bucketed']:.2f}x in the median round (target >= "
            f"{target}x; predicted {p.ratio:.2f}x)",
            o["flat_over_bucketed"] >= target,
            busy,
        ),
        Claim(
            f"bucketing saves {100 * o['saved_s'] / p.could_save:.0f}% of what the cost model says it could (target >= "
            f"{100 * saved_share:.0f}%)",
            o["saved_s"] >= saved_share * p.could_save,
            busy,
        ),
        Claim(
            f"overlapped beats flat too, despite its message per gradient (flat/overlapped "
            f"{o['flat_over_overlapped']:.2f}x in the median round)",
            o["flat_over_overlapped"] > 1,
            busy,
        ),
    ]
    if o["sweep"]:
        checks, margin, spread = report.sweep_claims(o["sweep"], bucket_mb)
        why = busy or (None if margin is not None else f"the sweep's rounds moved by {100 * spread:.0f}%")
        out += [Claim(text, holds, why) for holds, text in checks]
    return out


def point_claim(o: dict) -> Claim:
    """scaling_limits' point that this run measures: flat's all-reduce at 2 ranks on the dialed cable, from its
    timeline's last timed step, within POINT_MARGIN of the model's (and on which side of the computation each falls).
    Checked on a quiet machine."""
    pt = o["point"]
    busy = None if o["quiet"] else f"other programs kept {o['foreign_cores']:.2f} cores busy"
    if pt["comm_s"] is None:
        return Claim("flat's all-reduce was not in the dialed race's timeline", False, "no timeline recorded")
    off = pt["comm_s"] / pt["predicted_comm_s"] - 1
    side = lambda comm: "below" if comm <= pt["compute_s"] else "above"  # noqa: E731
    return Claim(
        f"flat's all-reduce at 2 ranks took {1000 * pt['comm_s']:.0f} ms, the cost model's "
        f"{1000 * pt['predicted_comm_s']:.0f} ms ({100 * off:+.0f}%, within {100 * POINT_MARGIN:.0f}%): "
        f"{side(pt['comm_s'])} the {1000 * pt['compute_s']:.0f} ms of computation (the model: "
        f"{side(pt['predicted_comm_s'])})",
        abs(off) <= POINT_MARGIN,
        busy,
    )


def record(o: dict, p: Plan, dial: dict) -> dict:
    """The chapter's record of the dialed run."""
    best = min(o["sweep"], key=lambda k: o["sweep"][k]["bucketed_step_s"]) if o["sweep"] else None
    return {
        "link_mbit": p.mbit,
        "model": "wide",
        "batch_size": p.batch,
        "dropout": False,
        "bucket_mb": p.bucket_mb,
        "quiet": o["quiet"],
        "foreign_cores": o["foreign_cores"],
        "rungs": {
            n: {
                "step_time_ratio_vs_ddp": o["ratio_vs_ddp"].get(n, 1.0),
                "max_weight_diff": max(dial["check"][m][n]["max_weight_diff"] for m in dial["check"]),
            }
            for n in ("flat", "overlapped", "bucketed")
        },
        "flat_over_bucketed": o["flat_over_bucketed"],
        "flat_over_overlapped": o["flat_over_overlapped"],
        "predicted_flat_over_bucketed": p.ratio,
        "saved_share_of_model": o["saved_s"] / p.could_save,
        "backward_cost_of_sending_s": o["send_cpu_s"],
        "best_bucket_mb": None if best is None else float(best),
        "allreduce_s": o["point"]["comm_s"],
        "predicted_allreduce_s": o["point"]["predicted_comm_s"],
    }
