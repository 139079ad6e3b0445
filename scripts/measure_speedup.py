"""The 2-process CPU speedup of the custom transformer (hash tokenizer) next to the tiny DistilBERT's, measured
inside the course's own scripts, in alternating rounds, on a quiet CPU where possible.

    python scripts/measure_speedup.py                 # records the section custom_hash_speedup
                                                      # of benchmarks/accuracy.json
    python scripts/measure_speedup.py --quick         # a few steps (keeps the script working)

An epoch's time (experiments/*/metrics.json) on a CPU shared with other jobs mixes the run with its neighbours.
Here one torchrun launch with 2 gloo ranks (1 thread each) runs, round after round and in rotating order, each
experiment's 1-process contender (scripts/train_single.py on rank 0 while rank 1 waits) and its 2-process
contender (scripts/train_ddp.py on both), with the experiment's own YAML (configs/experiments/*_1p / *_2p: the same
global batch). distrinews_course.bench.harness times a window of optimizer steps after a warm-up and, under DDP, every
gradient bucket's all-reduce; before each window rank 0 waits (a bounded time) for the other jobs to leave the CPU.
Speedup = median samples/s of 2 processes / median samples/s of 1 process, over the rounds in which both windows
were quiet (the other jobs used at most 0.3 cores besides the run's own ranks), else over all rounds; every
round's ratio and how busy the neighbours were is recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from distrinews_course import launch  # noqa: E402
from distrinews_course.bench import harness, provenance, throughput, timing  # noqa: E402
from distrinews_lib import machine  # noqa: E402
from distrinews_lib.distributed import run_and_end  # noqa: E402

PAIRS = [  # (label, 1-process experiment, 2-process experiment, warm-up steps, timed steps)
    ("AG News, custom + hash", "agnews_custom_1p", "agnews_custom_2p", 5, 60),
    ("AG News, tiny DistilBERT", "agnews_tiny_1p", "agnews_tiny_2p", 5, 60),
    ("IMDB, custom + hash", "imdb_custom_1p", "imdb_custom_2p", 3, 16),
]


def worker(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    single, ddp = REPO / "scripts" / "train_single.py", REPO / "scripts" / "train_ddp.py"
    gate = timing.QuietGate(0.3, spec["quiet_timeout"], spec["quiet_budget"])
    results = []
    with harness.shared_process_group(timeout_s=900) as (backend, why):
        rank = dist.get_rank()
        for r in range(spec["rounds"]):
            order = (
                spec["contenders"][r % len(spec["contenders"]) :] + spec["contenders"][: r % len(spec["contenders"])]
            )
            for c in order:
                out = tempfile.mkdtemp(prefix="speedup_")
                argv = [
                    "--config",
                    str(REPO / "configs" / "experiments" / f"{c['experiment']}.yaml"),
                    "--epochs",
                    "1",
                    "--max_steps_per_epoch",
                    str(c["warmup"] + c["steps"]),
                    "--eval_samples",
                    "8",
                    "--no-progress",
                    "--no-snapshots",
                    "--experiment",
                    "speedup_probe",
                    "--output",
                    out,
                    "--checkpoint",
                    f"{out}/m.pt",
                ]
                if spec.get("num_samples"):
                    argv += ["--num_samples", str(spec["num_samples"])]
                quiet = None
                if c["processes"] == 1:
                    res = None
                    if rank == 0:
                        quiet = gate.wait()
                        with harness.alone(), contextlib.redirect_stdout(io.StringIO()):
                            res = harness.run(single, argv, warmup=c["warmup"], steps=c["steps"]).result()
                    dist.barrier()
                else:
                    if rank == 0:
                        quiet = gate.wait()
                    dist.barrier()
                    with contextlib.redirect_stdout(io.StringIO()):
                        res = harness.run(ddp, argv, warmup=c["warmup"], steps=c["steps"], comm=True).result()
                gathered = [None] * dist.get_world_size()
                dist.all_gather_object(gathered, res)
                if rank == 0:
                    parts = [g for g in gathered if g]
                    total = throughput.over_ranks(parts)
                    row = {
                        "experiment": c["experiment"],
                        "pair": c["pair"],
                        "processes": c["processes"],
                        "round": r,
                        "seconds": total["seconds"],
                        "samples": total["samples"],
                        "samples_per_s": total["samples_per_s"],
                        "steps": c["steps"],
                        "seconds_per_step": total["seconds"] / c["steps"],
                        "comm_fraction": parts[0].get("comm_fraction"),
                        "allreduce_bytes_per_step": (parts[0].get("allreduce_bytes") or 0) / c["steps"] or None,
                        "foreign_cores": parts[0].get("foreign_cores"),
                        "waited_for_quiet": quiet,
                        "load_average": provenance.load_average(),
                    }
                    results.append(row)
                    print(
                        f"  round {r + 1} {c['experiment']:18s} {row['samples_per_s']:7.1f} samples/s"
                        + (
                            f" | all-reduce {100 * row['comm_fraction']:.0f}% of the window, "
                            f"{row['allreduce_bytes_per_step'] / 1e6:.1f} MB/step"
                            if row["comm_fraction"]
                            else ""
                        )
                        + f" | others {row['foreign_cores'] or 0:.2f} cores",
                        flush=True,
                    )
                    shutil.rmtree(out, ignore_errors=True)
                dist.barrier()
    if rank == 0:
        Path(spec["out"]).write_text(json.dumps({"backend": backend, "backend_reason": why, "results": results}))


QUIET = 0.3  # a window is "quiet" when the other jobs used at most this many cores (besides the run's own ranks)


def quiet(row: dict) -> bool:
    return row.get("foreign_cores") is not None and row["foreign_cores"] - (row["processes"] - 1) <= QUIET


def summarise(rows: list) -> list:
    """Per pair: the median over rounds of each contender's samples/s and their ratio; over the rounds where both
    windows were quiet (the headline) when there are any, and over all rounds."""
    pairs = []
    for label, one, two, *_ in PAIRS:
        by_round = {}
        for r in rows:
            if r["experiment"] in (one, two):
                by_round.setdefault(r["round"], {})[r["processes"]] = r
        rounds = [v for _, v in sorted(by_round.items()) if 1 in v and 2 in v]
        if not rounds:
            continue
        calm = [v for v in rounds if quiet(v[1]) and quiet(v[2])]
        use = calm or rounds
        sa = statistics.median(v[1]["samples_per_s"] for v in use)
        sb = statistics.median(v[2]["samples_per_s"] for v in use)
        ratios = [v[2]["samples_per_s"] / v[1]["samples_per_s"] for v in rounds]
        comm = [v[2]["comm_fraction"] for v in use if v[2]["comm_fraction"] is not None]
        mb = [v[2]["allreduce_bytes_per_step"] for v in use if v[2]["allreduce_bytes_per_step"]]
        pairs.append(
            {
                "pair": label,
                "single": one,
                "multi": two,
                "processes": 2,
                "rounds_used": "quiet rounds only" if calm else "all rounds (none was quiet)",
                "quiet_rounds": [v[1]["round"] for v in calm],
                "samples_per_s_median": {"1": round(sa, 1), "2": round(sb, 1)},
                "seconds_per_step_median": {
                    "1": round(statistics.median(v[1]["seconds_per_step"] for v in use), 4),
                    "2": round(statistics.median(v[2]["seconds_per_step"] for v in use), 4),
                },
                "speedup": round(sb / sa, 3),
                "efficiency": round(sb / sa / 2, 3),
                "speedup_per_round": [round(x, 3) for x in ratios],
                "speedup_median_all_rounds": round(statistics.median(ratios), 3),
                "allreduce_share_of_step_2p": round(statistics.median(comm), 3) if comm else None,
                "allreduce_mb_per_step": round(statistics.median(mb) / 1e6, 2) if mb else None,
            }
        )
    return pairs


def _print(pairs: list) -> None:
    for s in pairs:
        print(
            f"{s['pair']:28s} speedup {s['speedup']:.2f}x ({s['rounds_used']}; every round: {s['speedup_per_round']}), "
            f"all-reduce {s['allreduce_mb_per_step']} MB/step, "
            f"{100 * (s['allreduce_share_of_step_2p'] or 0):.0f}% of a "
            "2-process step"
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few steps, one round, nothing recorded unless --record")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pairs", default="all", help="comma-separated 1-process experiment names, or all")
    p.add_argument(
        "--record",
        default=None,
        help="JSON to add the section custom_hash_speedup to (default: benchmarks/accuracy.json; with --quick: none)",
    )
    p.add_argument(
        "--resummarise", action="store_true", help="no measuring: recompute the pairs of the recorded section"
    )
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a.worker)
        return 0
    if a.resummarise:
        path = Path(a.record or REPO / "benchmarks" / "accuracy.json")
        doc = json.loads(path.read_text())
        doc["custom_hash_speedup"]["pairs"] = summarise(doc["custom_hash_speedup"]["rows"])
        doc["custom_hash_speedup"]["summarised_with"] = "python scripts/measure_speedup.py --resummarise"
        path.write_text(json.dumps(doc, indent=1))
        _print(doc["custom_hash_speedup"]["pairs"])
        return 0
    chosen = [x for x in PAIRS if a.pairs == "all" or x[1] in a.pairs.split(",")]
    contenders = []
    for label, one, two, warmup, steps in chosen:
        if a.quick:
            warmup, steps = 2, 3
        contenders += [
            {"pair": label, "experiment": one, "processes": 1, "warmup": warmup, "steps": steps},
            {"pair": label, "experiment": two, "processes": 2, "warmup": warmup, "steps": steps},
        ]
    tmp = Path(tempfile.mkdtemp(prefix="measure_speedup_"))
    spec = {
        "contenders": contenders,
        "rounds": 1 if a.quick else a.rounds,
        "out": str(tmp / "raw.json"),
        "quiet_timeout": 0 if a.quick else 20,
        "quiet_budget": 0 if a.quick else 300,
        "num_samples": 512 if a.quick else None,
    }
    (tmp / "spec.json").write_text(json.dumps(spec))
    load_before, started = provenance.load_average(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    res = launch.torchrun(
        Path(__file__), 2, ["--worker", tmp / "spec.json"], timeout=3600, cwd=REPO, env={"OMP_NUM_THREADS": "1"}
    )
    raw = json.loads((tmp / "raw.json").read_text())
    pairs = summarise(raw["results"])
    _print(pairs)
    record = a.record or (None if a.quick else str(REPO / "benchmarks" / "accuracy.json"))
    if record:
        doc = json.loads(Path(record).read_text()) if Path(record).is_file() else {}
        doc["custom_hash_speedup"] = provenance.as_jsonable(
            {
                "what": "2-process CPU speedup at the same global batch (32), windows of optimizer steps timed inside "
                "the course's scripts, alternating rounds (scripts/measure_speedup.py)",
                "command": "python scripts/measure_speedup.py" + (f" --rounds {a.rounds}" if a.rounds != 3 else ""),
                "started": started,
                "seconds": round(res.seconds, 1),
                "machine": machine.machine_info(),
                "versions": machine.versions(),
                "git_commit": machine.git_commit(),
                "load_average_before": load_before,
                "load_average_after": provenance.load_average(),
                "backend": raw["backend"],
                "threads_per_process": 1,
                "rounds": spec["rounds"],
                "pairs": pairs,
                "rows": raw["results"],
            }
        )
        Path(record).write_text(json.dumps(doc, indent=1))
        print(f"recorded in {record} (section custom_hash_speedup)")
    return 0


if __name__ == "__main__":
    run_and_end(main)  # ends without the interpreter's teardown (its --worker ranks join a gloo group)
