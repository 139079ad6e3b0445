"""Does chapter 06's memory calculator (distrinews_course.memory) hold against what memory_footprint.py measured?
Run by run on the course's model (section 5), and part by part on DistilBERT-base's committed benchmark (section 7).

    calc = calculator_check(one, two)          # two memory_runs.Launch
    print(calc.table()); [check(*c) for c in calc.claims()]
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from . import ROOT
from . import memory as M
from .memory_runs import STAGE, Claim, Launch, held_rows, zero1_state_mb
from .records import write_record

# ---------------------------------------------------------------------------------------------------------------
# Section 5: the calculator against the measured peaks


@dataclass
class CalculatorCheck:
    rows: list = field(default_factory=list)
    spread_mb: float = 0.0

    @property
    def checked(self) -> list:
        return [x for x in self.rows if x["kind"] == "checked"]

    @property
    def rel_errors(self) -> dict:
        return {f"{x['name']} x{x['world']}": round(M.rel_error(x["pred"], x["measured"]), 4) for x in self.checked}

    def table(self) -> str:
        head = f"{'ranks':>5} {'run':<18} {'peak set by':<18} {'calculator':>10} {'measured':>8} {'error':>6}  row"
        lines = [head]
        for x in self.rows:
            modelled = x["pred"] is not None
            err = f"{100 * M.rel_error(x['pred'], x['measured']):5.1f}%" if modelled else "   --"
            pred = f"{x['pred']:>10.1f}" if modelled else f"{'--':>10}"
            lines.append(
                f"{x['world']:>5} {x['name']:<18} {x['sets']:<18} {pred} {x['measured']:>8.1f} {err:>6}  {x['kind']}"
            )
        return "\n".join(lines)

    def moves_table(self) -> str:
        lines = [f"{'ranks':>5} {'run':<18} {'moved from':<12} {'move predicted MiB':>18} {'measured MiB':>12}"]
        for x in self.checked:
            lines.append(
                f"{x['world']:>5} {x['name']:<18} {x['twin']:<12} {x['move_pred']:>+18.1f} {x['move']:>+12.1f}"
            )
        return "\n".join(lines)

    def coverage(self) -> str:
        """A printed fact, not a check: how many runs the calculator is checked on, and what moves their peaks."""
        reasons = sorted({x["why"] for x in self.checked})
        return (
            f"{len(self.checked)} runs have a predicted peak the calibration does not give, for {len(reasons)} "
            f"reasons ({', '.join(reasons)}): the calculator is checked on those"
        )

    def claims(self, margin: float = 0.15) -> list[Claim]:
        """Where a part other than the calibration's sets the peak (the prediction moves more than 5% away from the
        calibration's), the calculator is within 15% of the measured peak: it leaves out the allocator's rounding
        and the runtime's growth with the batch (a few MiB on 70). And it predicts how far the peak moved from its
        twin (plain DDP at the same batch and length, else the calibration) within half that move, give or take two
        of a peak's run-to-run spreads, since a move is a difference of two measured peaks. The plain DDP runs it
        predicts at the calibration's peak must measure within 5% of the calibration: the optimizer step set them.
        With fewer than 4 checked runs the first claim fails: a calculator checked on almost nothing is not checked."""
        checked, same = self.checked, [x for x in self.rows if x["kind"] == "= calibration"]
        errors = self.rel_errors
        moves_ok = all(abs(x["move_pred"] - x["move"]) <= 0.5 * abs(x["move"]) + 2 * self.spread_mb for x in checked)
        return [
            (
                len(checked) >= 4 and max(errors.values()) <= margin,
                f"the calculator predicts each of them within {100 * margin:.0f}% of the measured peak "
                f"(at most {100 * max(errors.values(), default=0):.1f}%)",
            ),
            (
                moves_ok,
                "... and how far each peak moved from its twin's, within half that move, give or take twice a peak's "
                f"run-to-run spread ({self.spread_mb:.2f} MiB here)",
            ),
            (
                bool(same) and all(M.rel_error(x["calibration"], x["measured"]) <= 0.05 for x in same),
                f"the {len(same)} DDP runs predicted at the calibration's peak measured within 5% of it",
            ),
        ]


def _twin(launch: Launch, name: str) -> str:
    """The run this one moved from: plain DDP at the same batch and length in the same launch, else the calibration.
    The bucket view, sharding and recomputation each change one setting of a run; its twin has all the others."""
    r = launch.results[name]
    for k in launch.names():
        t = launch.results[k]
        if k != name and t["variant"] == "ddp" and not t["ckpt"] and not t["view"]:
            if (t["batch"], t["seq"]) == (r["batch"], r["seq"]):
                return k
    return "ddp@1x8"


def calculator_check(*launches: Launch) -> CalculatorCheck:
    """Every run of these launches: predicted, measured, and which row kind it is: "checked" (its prediction moves
    more than 5% away from the calibration's), "= calibration" (a plain DDP run the calculator can only predict at
    the calibration's peak), "section 6" (ZeRO-1, which lands there too), "not modelled" (DeepSpeed)."""
    rows = []
    for launch in launches:
        cal_pred = launch.predicted("ddp@1x8").peak_mb
        cal_measured = statistics.median(launch.peaks("ddp@1x8"))
        for name in launch.names():
            if name == "ddp@1x8":
                continue
            r, measured = launch.results[name], launch.peak(name)
            e = launch.predicted(name) if r["variant"] in STAGE else None
            pred = e.peak_mb if e else None
            if e is None:
                kind = "not modelled"
            elif abs(pred - cal_pred) > 0.05 * cal_pred:
                kind = "checked"
            else:
                kind = "= calibration" if r["variant"] == "ddp" else "section 6"
            why = (
                "sharding" if STAGE.get(r["variant"], 0) else "recomputation" if r["ckpt"]
                else "bucket view" if r["view"] else "activations"
            )  # fmt: skip
            twin = _twin(launch, name)
            base = (
                (cal_pred, cal_measured) if twin == "ddp@1x8" else (launch.predicted(twin).peak_mb, launch.peak(twin))
            )
            sets = ""
            if e:
                p = e.parts
                sets = "activations" if p["activations"] > p["gradients"] + p["AdamW temporaries"] else "optimizer step"
            rows.append(
                dict(world=launch.world, name=name, pred=pred, measured=measured, calibration=cal_measured,
                     kind=kind, why=why, sets=sets, twin=twin,
                     move_pred=None if e is None else pred - base[0], move=measured - base[1])
            )  # fmt: skip
    return CalculatorCheck(rows, max(x.spread_mb for x in launches))


# ---------------------------------------------------------------------------------------------------------------
# Section 7: DistilBERT-base's committed benchmark


@dataclass
class DistilbertPeak:
    model: str
    machine: str
    n_params: int
    peak1: float  # one process's peak, MiB
    peak2: float  # two ranks'
    calibration2: float  # the ddp@1x8 run's peak on two ranks
    parts: list  # [(what, MiB), ...]: what the two-rank peak is made of
    activations: float
    estimate: M.Estimate

    def table(self) -> str:
        lines = [f"{self.model} ({self.n_params / 1e6:.1f}M parameters), {self.machine}, DDP on 2 ranks"]
        lines += [f"  {mb:7.0f} MiB  {what}" for what, mb in self.parts]
        lines.append(
            f"  {sum(mb for _, mb in self.parts):7.0f} MiB  the parts: the ddp@1x8 run's peak, by construction (the "
            "runtime is its residual)"
        )
        lines.append(f"  {self.peak2:7.0f} MiB  the measured peak at 8 x 64 tokens")
        return "\n".join(lines)

    def summary(self) -> str:
        """What the table says, in two sentences (Markdown)."""
        at_rest, buckets, temps, runtime = (mb for _, mb in self.parts)
        p = self.estimate.parts_mb
        foreach = M.estimate("distilbert-base", 8, 64, world=2, adamw="foreach").parts_mb["AdamW temporaries"]
        sets = "activations" if self.activations > p["gradients"] + temps else "optimizer step"
        total = sum(mb for _, mb in self.parts)
        return (
            f"DDP on two ranks held **{at_rest:.0f} MiB** at rest; **{buckets:.0f} MiB** of DDP buckets (the "
            f"calculator says {p['DDP buckets']:.0f}), **{temps:.0f} MiB** of AdamW's temporaries and "
            f"**{runtime:.0f} MiB** of runtime on top make **{total:.0f} MiB**, the 1 x 8 tokens peak (the runtime "
            f"is its residual); the 8 x 64 tokens step peaked at **{self.peak2:.0f} MiB**. The activations "
            f"({self.activations:.0f} MiB at 8 x 64 tokens) stay {'above' if sets == 'activations' else 'below'} the "
            f"gradients plus AdamW's temporaries ({p['gradients'] + temps:.0f} MiB), so at this batch the {sets} "
            f"sets the peak. On a GPU, with torch's foreach default, the temporaries would be {foreach:.0f} MiB."
        )

    def claims(self) -> list[Claim]:
        """The buckets are a difference of two peaks against 4 bytes per parameter: within 10%. The 8 x 64 batch and
        the 1 x 8 calibration peak within 3% of each other (the spread of one peak at this size, tens of MiB on
        1,500) when the optimizer step, not the activations, sets the peak. The parts are not checked to add up to
        the calibration's peak: the runtime is that peak's residual, so they do by construction."""
        buckets = self.estimate.parts_mb["DDP buckets"]
        return [
            (
                abs((self.peak2 - self.peak1) - buckets) < 0.1 * buckets,
                f"the fullest rank's 2-rank peak minus the 1-process peak ({self.peak2 - self.peak1:.0f} MiB) is DDP's "
                "bucket copy of the "
                f"gradients (4 bytes per parameter: {buckets:.0f} MiB), within 10%",
            ),
            (
                abs(self.peak2 - self.calibration2) <= 0.03 * self.peak2,
                f"8 x 64 tokens peak within 3% of 1 x 8 tokens ({self.peak2:.0f} vs {self.calibration2:.0f} MiB): "
                "the activations do not set the peak",
            ),
        ]


def committed_facts(claims) -> list[str]:
    """Claims on a committed benchmark, said as facts of that file, not checks of this run: every run reads the same
    file and would give the same verdict, so tests/test_memory_runs.py holds them (a wrong figure fails there)."""
    return [f"the committed benchmark {'shows' if ok else 'does NOT show'}: {text}" for ok, text in claims]


def distilbert_peak(path=None) -> DistilbertPeak:
    """The committed benchmarks/memory_cpu*.json (its `commands` field has the launches that made it), taken apart."""
    path = path or sorted((ROOT / "benchmarks").glob("memory_cpu*.json"))[0]
    bench = json.loads(Path(path).read_text())
    one, two = Launch(bench["runs"]["1"]), Launch(bench["runs"]["2"])  # each launch's own JSON
    peak1, peak2, cal2 = one.peak("ddp"), two.peak("ddp"), two.peak("ddp@1x8")
    e = M.estimate("distilbert-base", 8, 64, "fp32", 0, 2)
    runtime = cal2 - M.estimate("distilbert-base", 1, 8, world=2).peak_mb
    parts = [
        ("held at rest: weights + gradients + AdamW's moments (measured)", two.fullest("ddp")["total"] / M.MiB),
        ("DDP's buckets (2-rank peak minus 1-rank peak, measured)", peak2 - peak1),
        ("AdamW's temporaries: two of the word embeddings (calculator)", e.parts_mb["AdamW temporaries"]),
        ("runtime (the rest of the ddp@1x8 run's peak: its residual)", runtime),
    ]
    return DistilbertPeak(
        bench["model"], bench["machine"], bench["n_params"], peak1, peak2, cal2, parts,
        two.fullest("ddp")["activations_saved"] / M.MiB, e,
    )  # fmt: skip


def write_chapter_record(calc: CalculatorCheck, one: Launch, two: Launch, adamw, rec, saved_mb: float, base) -> dict:
    """Chapter 06's record (records.write_record): the calculator's errors, the runtimes, AdamW's temporaries,
    recomputation's price, the bucket view's saving, what each rank holds, and DistilBERT's parts; returns it."""
    figures = {
        "calculator_rel_errors": calc.rel_errors,
        "runtime_mib": {"1": round(one.runtime_mb, 1), str(two.world): round(two.runtime_mb, 1)},
        "adamw_temporaries_mib": {"measured": adamw.median_mb, "calculator": adamw.calculator_mb()},
        "recompute": {
            "activations_mib": rec.activations_mb,
            "peak_mib": rec.peak_mb,
            **{k: round(getattr(rec, k), 3) for k in ("flop_ratio", "cpu_ratio", "time_ratio")},
        },
        "bucket_view_saves_mib": round(saved_mb, 1),
        "zero1_optimizer_mib": zero1_state_mb(two),
        "held_bytes_per_param": {x["name"]: round(x["per_param"], 2) for x in held_rows(two)},
        "distilbert_ddp": {"peak_mib": round(base.peak2), "parts_mib": {w: round(mb) for w, mb in base.parts}},
    }
    headline = (
        f"calculator within {100 * max(calc.rel_errors.values()):.0f}% of {len(calc.rel_errors)} measured peaks; "
        f"recomputation: peak {rec.peak_mb[0]:.0f} -> {rec.peak_mb[1]:.0f} MiB for {rec.flop_ratio:.2f}x FLOPs; "
        f"bucket view saves {saved_mb:.1f} MiB/rank"
    )
    return write_record("06_memory_and_sharding", figures, headline)
