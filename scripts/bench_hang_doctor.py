#!/usr/bin/env python
"""The hang doctor's cost on a healthy run: train_ddp.py's time per optimizer step with and without --debug_hangs,
side by side.

    flock /tmp/heavy.lock .venv/bin/python scripts/bench_hang_doctor.py            # 8 pairs of 40-step runs
    flock /tmp/heavy.lock .venv/bin/python scripts/bench_hang_doctor.py --quick    # 2 pairs of 10 steps (a test)

Each pair runs the two launches one after the other, the doctor's first in every other pair, so that both see the
same machine; a run's time per step is its epoch's training time over its optimizer steps (start-up and evaluation
left out). The cost is the median over the pairs of (with / without) - 1. The doctor must print nothing on these
healthy runs: a line from it fails the benchmark. Writes benchmarks/hang_doctor_cost_<machine>.json, with provenance.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distrinews_course.bench.provenance import machine_slug, provenance  # noqa: E402
from distrinews_course.launch import torchrun  # noqa: E402
from distrinews_lib.files import atomic_write_json  # noqa: E402


def one_run(folder: Path, doctor: bool, steps: int, nproc: int) -> dict:
    args = ["--config", "cpu_smoke", "--epochs", 1, "--max_steps_per_epoch", steps, "--no-progress", "--resume", "off",
            "--output", folder, "--checkpoint", folder / "model.pt", "--no-snapshots"]  # fmt: skip
    res = torchrun(ROOT / "scripts" / "train_ddp.py", nproc, [*args, *(["--debug_hangs"] if doctor else [])],
                   timeout=600, echo=False)  # fmt: skip
    epoch = json.loads((folder / "metrics.json").read_text())["epochs"][0]
    said = [line for line in res.lines if "[hang doctor]" in line]
    return {
        "doctor": doctor,
        "step_ms": round(1000 * epoch["epoch_time_s"] / epoch["optimizer_steps"], 3),
        "steps": epoch["optimizer_steps"],
        "launch_s": round(res.seconds, 2),
        "doctor_said": said,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per run")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="2 pairs of 10 steps: checks the benchmark runs")
    p.add_argument("--out", default=None, help="default: benchmarks/hang_doctor_cost_<machine>.json")
    args = p.parse_args(argv)
    if args.quick:
        args.pairs, args.steps = 2, 10
    if args.pairs < 1 or args.steps < 2:
        p.error("--pairs must be at least 1 and --steps at least 2")
    record = {"benchmark": "hang_doctor_cost", **provenance(sys.argv if argv is None else ["bench", *argv])}
    pairs = []
    with tempfile.TemporaryDirectory(prefix="hang_doctor_cost_") as tmp:
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            runs = {d: one_run(Path(tmp) / f"pair{i}_{'doctor' if d else 'plain'}", d, args.steps, args.nproc)
                    for d in order}  # fmt: skip
            ratio = runs[True]["step_ms"] / runs[False]["step_ms"]
            pairs.append({"first": "doctor" if order[0] else "plain", "plain": runs[False], "doctor": runs[True],
                          "ratio": round(ratio, 4)})  # fmt: skip
            print(f"pair {i + 1}/{args.pairs}: {runs[False]['step_ms']:.1f} ms plain, {runs[True]['step_ms']:.1f} ms "
                  f"with the doctor ({100 * (ratio - 1):+.1f}%)", flush=True)  # fmt: skip
    said = [line for pair in pairs for run in (pair["plain"], pair["doctor"]) for line in run["doctor_said"]]
    ratios = [pair["ratio"] for pair in pairs]
    record.update(
        nproc=args.nproc,
        steps=args.steps,
        pairs=pairs,
        summary={
            "pairs": len(pairs),
            "median_ratio": round(statistics.median(ratios), 4),
            "overhead": round(statistics.median(ratios) - 1, 4),
            "min_ratio": min(ratios),
            "max_ratio": max(ratios),
            "plain_step_ms_median": round(statistics.median(pr["plain"]["step_ms"] for pr in pairs), 2),
            "doctor_printed_on_healthy_runs": said,
        },
    )
    out = Path(args.out or ROOT / "benchmarks" / f"hang_doctor_cost_{machine_slug()}.json")
    atomic_write_json(out, record, indent=1)
    s = record["summary"]
    print(f"median cost {100 * s['overhead']:+.1f}% of a step over {s['pairs']} pairs (range "
          f"{100 * (s['min_ratio'] - 1):+.1f}% to {100 * (s['max_ratio'] - 1):+.1f}%); wrote {out}")  # fmt: skip
    if said:
        print(f"the doctor printed on a healthy run: {said[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
