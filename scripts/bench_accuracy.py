"""Does DDP lose accuracy? Single process vs N-process DDP on real AG News, same global batch, epochs and seed.

    python scripts/bench_accuracy.py            # minilm on the 12,000-row train subset, full 7,600-row test set
    python scripts/bench_accuracy.py --quick    # tiny model, a few hundred texts (CI keeps the script working)

Runs the course's own scripts (scripts/train_single.py, and scripts/train_ddp.py under torchrun through
distrinews_course.launch), reads the metrics.json each writes, and records the two test accuracies, their
gap (target: within 0.5 points) and the pretrained model's accuracy (target: >= 90%) in
benchmarks/accuracy.json together with the exact commands that produced them.

Data (--data): auto = $DISTRINEWS_DATA_DIR, else the real AG News sample embedded in distrinews_lib
(8,000 train rows, the full 7,600-row test set); or a folder, or `embedded`. Synthetic texts are refused:
an accuracy on them says nothing about AG News.

The two runs may go side by side (--parallel, the default for the full run) to save wall time on a
small machine; that changes how long they take, never what they compute.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from distrinews_course import launch  # noqa: E402
from distrinews_course.bench import provenance
from distrinews_course.bench.train_report import ordered
from distrinews_course.bench.train_setup import offline_source
from distrinews_lib.data import sources
from distrinews_lib.errors import UserError, main_guard  # noqa: E402

FULL = dict(
    model="minilm",
    num_samples=12000,
    eval_samples=7600,
    epochs=2,
    global_batch=32,
    lr=1e-4,
    max_length=64,
    amp="bf16",
    warmup_ratio=0.06,
)
QUICK = dict(
    model="tiny",
    num_samples=400,
    eval_samples=200,
    epochs=1,
    global_batch=32,
    lr=1e-3,
    max_length=64,
    amp="off",
    warmup_ratio=0.06,
)


def find_data(choice: str) -> str:
    """What the scripts get as --data: auto = $DISTRINEWS_DATA_DIR, else the embedded real sample (never the hub:
    the two runs must read the same texts, offline). A folder that is not there is an error, never a fallback."""
    if choice == "synthetic":
        raise UserError(
            "--data synthetic: an accuracy on synthetic texts says nothing about AG News. Use auto, embedded "
            "(the real AG News sample inside distrinews_lib) or a folder with train.csv and test.csv."
        )
    return offline_source(choice, ("embedded",))


def train_args(s: dict, data_dir: str, batch: int, out: Path, threads: int, seed: int, ddp: bool) -> list:
    args = [
        "--config",
        "cpu_smoke",  # every value below overrides the preset; the preset only fills the rest
        "--model",
        s["model"],
        "--data",
        str(data_dir),
        "--num_samples",
        str(s["num_samples"]),
        "--eval_samples",
        str(s["eval_samples"]),
        "--epochs",
        str(s["epochs"]),
        "--batch_size",
        str(batch),
        "--lr",
        str(s["lr"]),
        "--max_length",
        str(s["max_length"]),
        "--amp",
        s["amp"],
        "--warmup_ratio",
        str(s["warmup_ratio"]),
        "--seed",
        str(seed),
        "--threads",
        str(threads),
        "--no-progress",
        "--no-snapshots",
        "--output",
        str(out),
        "--checkpoint",
        str(out / "model.pt"),
    ]
    if ddp:
        args += ["--backend", "auto"]
    return args


def read_run(out: Path, result) -> dict:
    m = json.loads((out / "metrics.json").read_text())
    eps = m["epochs"]
    return {
        "accuracy": eps[-1]["val_accuracy"],
        "accuracy_percent": round(100 * eps[-1]["val_accuracy"], 3),
        "accuracy_per_epoch": [e["val_accuracy"] for e in eps],
        "val_loss_per_epoch": [e["val_loss"] for e in eps],
        "train_loss_per_epoch": [e["train_loss"] for e in eps],
        "eval_examples": eps[-1]["val_examples"],
        "train_samples": m["data"]["train_size"],
        "test_size": m["data"]["test_size"],
        "data": m["data"],
        "world_size": m["ddp"]["world_size"],
        "global_batch_size": m["ddp"]["global_batch_size"],
        "backend": m["ddp"]["backend"],
        "model": m["model"],
        "train_seconds": sum(e["epoch_time_s"] for e in eps),
        "samples_per_s_per_epoch": [e["samples_per_s"] for e in eps],
        "wall_s": round(result.seconds, 1),
        "params_max_difference": m["aggregates"].get("params_max_difference"),
        "command": " ".join(user_command(result.command)),
        "metrics_json": str(out / "metrics.json"),
    }


def user_command(cmd: list) -> list:
    """The command as a user would type it: without launch's parent-death shim (python -c SHIM PID ...)."""
    return cmd[4:] if len(cmd) > 4 and cmd[1] == "-c" else cmd


def headline(result: dict) -> dict:
    """The figures a reader wants first (derived from the measured ones in the same file)."""
    return {
        "single_accuracy_percent": round(100 * result["single"]["accuracy"], 3),
        "ddp_accuracy_percent": round(100 * result["ddp"]["accuracy"], 3),
        "accuracy_gap_points": result["gap_points"],
        "ddp_processes": result["ddp"]["world_size"],
        "model": result["settings"]["model"],
        "test_texts": result["single"]["eval_examples"],
        "train_texts": result["single"]["train_samples"],
    }


@main_guard
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny model, a few hundred texts (CI)")
    p.add_argument(
        "--data",
        default="auto",
        help="auto ($DISTRINEWS_DATA_DIR, else the AG News sample embedded in "
        "distrinews_lib), embedded, or an AG News folder",
    )
    p.add_argument("--nproc", type=int, default=None, help="DDP processes (default: GPUs, else 2)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--max_length", type=int, default=None)
    p.add_argument(
        "--amp", default=None, help="default: bf16 for the full run on a CPU (auto on a GPU), off for --quick"
    )
    p.add_argument(
        "--parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the single and the DDP run side by side (default: on)",
    )
    p.add_argument("--tolerance", type=float, default=0.5, help="allowed |single - DDP| in accuracy points")
    p.add_argument("--target", type=float, default=90.0, help="accuracy target in percent (full run)")
    p.add_argument("--runs_dir", default=None, help="where the runs write (default: outputs/bench/accuracy[_quick])")
    p.add_argument(
        "--out",
        default=None,
        help="JSON (default: benchmarks/accuracy.json; --quick: outputs/bench/accuracy_quick.json)",
    )
    p.add_argument("--timeout", type=float, default=3600, help="seconds each run may take")
    p.add_argument(
        "--refresh", default=None, metavar="JSON", help="no training: recompute the headline of a result file"
    )
    args = p.parse_args(argv)
    if args.refresh:
        path = Path(args.refresh)
        result = json.loads(path.read_text())
        result["headline"] = headline(result)
        result["refreshed"] = {
            "command": " ".join(["python", *sys.argv]),
            "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "what": "headline recomputed from this file's measured figures",
        }
        path.write_text(json.dumps(provenance.as_jsonable(ordered(result)), indent=1))
        print(json.dumps(result["headline"], indent=1))
        return 0

    data_dir = find_data(args.data)
    s = dict(QUICK if args.quick else FULL)
    available = len(sources.load_agnews(data_dir).train_texts)
    if s["num_samples"] > available:  # the embedded sample has 8,000 train rows
        print(f"note: {data_dir} has {available} training texts; training on all of them instead of {s['num_samples']}")
        s["num_samples"] = available
    for k in ("epochs", "max_length", "amp"):
        if getattr(args, k) is not None:
            s[k] = getattr(args, k)
    import torch

    if not args.quick and args.amp is None and torch.cuda.is_available():
        s["amp"] = "auto"
    nproc = args.nproc or launch.default_nproc()
    if s["global_batch"] % nproc:
        raise UserError(
            f"global batch {s['global_batch']} is not divisible by {nproc} processes; pick --nproc that divides it."
        )
    runs = (
        Path(args.runs_dir)
        if args.runs_dir
        else REPO / "outputs" / "bench" / ("accuracy_quick" if args.quick else "accuracy")
    )
    out_path = (
        Path(args.out)
        if args.out
        else (
            REPO / "outputs" / "bench" / "accuracy_quick.json" if args.quick else REPO / "benchmarks" / "accuracy.json"
        )
    )
    parallel = True if args.parallel is None else args.parallel
    env = {"OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}

    result = {
        "benchmark": "accuracy",
        **provenance.provenance(),
        "quick": args.quick,
        "settings": {
            **s,
            "data": str(data_dir),
            "nproc": nproc,
            "threads_per_process": args.threads,
            "seed": args.seed,
            "parallel": parallel,
            "tolerance_points": args.tolerance,
            "target_percent": None if args.quick else args.target,
            "single_batch_size": s["global_batch"],
            "ddp_batch_size_per_process": s["global_batch"] // nproc,
        },
    }
    print(
        f"bench_accuracy: {s['model']} | {data_dir} | {s['num_samples']} train / {s['eval_samples']} test texts | "
        f"{s['epochs']} epoch(s) | global batch {s['global_batch']} | amp {s['amp']} | single vs {nproc}-process DDP"
        f"{' side by side' if parallel else ''}",
        flush=True,
    )

    def single():
        out = runs / "single"
        res = launch.run_python(
            REPO / "scripts" / "train_single.py",
            train_args(s, data_dir, s["global_batch"], out, args.threads, args.seed, ddp=False),
            timeout=args.timeout,
            env=env,
            cwd=REPO,
            echo=not parallel,
        )
        (out / "log.txt").write_text(res.output)
        return read_run(out, res)

    def ddp():
        out = runs / "ddp"
        res = launch.torchrun(
            REPO / "scripts" / "train_ddp.py",
            nproc,
            train_args(s, data_dir, s["global_batch"] // nproc, out, args.threads, args.seed, ddp=True),
            timeout=args.timeout,
            env=env,
            cwd=REPO,
            echo=not parallel,
            cpu_threads=args.threads,
        )
        (out / "log.txt").write_text(res.output)
        return read_run(out, res)

    t = time.time()
    try:
        if parallel:
            with ThreadPoolExecutor(2) as pool:
                f_single, f_ddp = pool.submit(single), pool.submit(ddp)
                result["single"], result["ddp"] = f_single.result(), f_ddp.result()
        else:
            result["single"] = single()
            result["ddp"] = ddp()
    except launch.LaunchError as err:  # the run's own message (and its last lines) say what went wrong
        print(f"bench_accuracy: a training run failed, nothing was written.\n{err}", file=sys.stderr, flush=True)
        return 1
    result["seconds_total"] = round(time.time() - t, 1)

    a1, a2 = 100 * result["single"]["accuracy"], 100 * result["ddp"]["accuracy"]
    gap = abs(a1 - a2)
    result["gap_points"] = round(gap, 3)
    result["gap_per_epoch_points"] = [
        round(100 * abs(x - y), 3)
        for x, y in zip(result["single"]["accuracy_per_epoch"], result["ddp"]["accuracy_per_epoch"])
    ]
    result["targets"] = {
        "ddp_matches_single": {
            "target": f"|single - DDP| <= {args.tolerance} points",
            "value": round(gap, 3),
            "met": gap <= args.tolerance,
        }
    }
    if not args.quick:
        result["targets"]["accuracy"] = {
            "target": f">= {args.target}% ({s['model']})",
            "single": round(a1, 3),
            "ddp": round(a2, 3),
            "met": min(a1, a2) >= args.target,
        }
    result["same_eval_set"] = result["single"]["eval_examples"] == result["ddp"]["eval_examples"]
    result["load_average_at_end"] = provenance.load_average()
    result["headline"] = headline(result)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if out_path.is_file():  # other benchmarks keep their own sections in the same file (e.g. custom_hash)
        try:
            kept = {k: v for k, v in json.loads(out_path.read_text()).items() if k not in result}
        except json.JSONDecodeError:
            kept = {}
        result = {**result, **kept}
    out_path.write_text(json.dumps(provenance.as_jsonable(ordered(result)), indent=1))
    print(
        f"single process : {a1:.2f}% "
        f"(per epoch {', '.join(f'{100 * x:.2f}' for x in result['single']['accuracy_per_epoch'])})"
    )
    print(
        f"{nproc}-process DDP : {a2:.2f}% "
        f"(per epoch {', '.join(f'{100 * x:.2f}' for x in result['ddp']['accuracy_per_epoch'])})"
    )
    print(
        f"gap {gap:.2f} points (target <= {args.tolerance}) | {result['single']['eval_examples']} test texts | "
        f"{result['seconds_total']:.0f} s | wrote {out_path}"
    )
    for k, v in result["targets"].items():
        print(f"target {k}: {'MET' if v['met'] else 'NOT MET'} ({v})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
