"""Benchmark the DistriNews server: micro-batching versus a naive one-request-per-forward-pass baseline.

    python scripts/bench_serving.py                    # full run (~2 minutes), writes benchmarks/serving.{json,png}
    python scripts/bench_serving.py --quick            # a couple of seconds per level (used by CI; no timing checks)
    python scripts/bench_serving.py --checkpoint checkpoints/distilbert_agnews.pt
    python scripts/bench_serving.py --overload --before 5aee7ee   # past capacity, before/after load shedding
    python scripts/bench_serving.py --litserve         # raced against LitServe (serving_vs_litserve_<machine>.json)
    python scripts/bench_serving.py --int8 --checkpoint A.pt --checkpoint B.pt --data ../shared/data/ag_news
                                                       # int8 vs fp32: benchmarks/serving_int8_<machine>.json

Two servers run side by side, each `python -m distrinews_lib.serving` in its own process on
127.0.0.1: "batched" (the defaults) and the baseline "--max-batch-size 1" (every request is its own
forward pass; same app, same framework, same model thread).  This process drives POST /predict at
concurrency 1, 4, 16 and 64 for a fixed time per level, split into slices that alternate between
the two servers (each after a short unrecorded warm-up), so background load on a shared machine
hits both alike.  It reports requests/s, p50/p95/p99 latency and errors.

--overload, --litserve and --int8 are other measurements, each in its module of distrinews_course/bench/
(serving_overload, serving_race with the LitServe competitor in serving_litserve, serving_int8), which documents its
method.

The load generator speaks HTTP/1.1 over plain asyncio streams with one keep-alive connection per
concurrent client: on a 2-core machine a heavier client (httpx, requests) would eat the CPU the
server is being measured on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing the package

from distrinews_course.bench.serving_compare import compare_main  # noqa: E402
from distrinews_course.bench.serving_int8 import int8_main  # noqa: E402
from distrinews_course.bench.serving_overload import overload_main  # noqa: E402
from distrinews_course.bench.serving_race import race_main  # noqa: E402
from distrinews_lib.errors import main_guard  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--checkpoint",
        type=Path,
        action="append",
        default=None,
        help="checkpoint to serve (default: a tiny random model made in a temporary folder); --int8 takes "
        "several (repeat the flag)",
    )
    p.add_argument("--quick", action="store_true", help="about 2 s per level: checks the benchmark runs, not how fast")
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help="measured seconds per level (default 8, quick 1.5; --litserve and --int8: per slice, 4)",
    )
    p.add_argument(
        "--warmup", type=float, default=None, help="unrecorded seconds before each level (default 1, quick 0.3)"
    )
    p.add_argument(
        "--rounds", type=int, default=None, help="alternating slices per level and configuration (default 3, quick 1)"
    )
    p.add_argument(
        "--levels",
        default=None,
        help="concurrency levels, comma separated (default 1,4,16,64; "
        "--overload 256,1024; --litserve 1,16,64,256; --int8 1,16)",
    )
    p.add_argument(
        "--max-batch-size", type=int, default=None, help="batched server's --max-batch-size (default: the server's)"
    )
    p.add_argument(
        "--batch-window-ms", type=float, default=None, help="batched server's --batch-window-ms (default: the server's)"
    )
    p.add_argument("--no-baseline", action="store_true", help="measure only the batched server (for tuning runs)")
    p.add_argument(
        "--overload",
        action="store_true",
        help="measure overload and abandoned work instead: concurrency 256 and 1024 (see OVERLOAD_DOC); "
        "writes benchmarks/serving_overload.{json,png}",
    )
    p.add_argument(
        "--before",
        default=None,
        metavar="REF",
        help="with --overload: also measure the server of this git commit, side by side (a temporary worktree)",
    )
    p.add_argument(
        "--litserve",
        action="store_true",
        help="race our server against LitServe serving the same checkpoint (serving_race.py); writes "
        "benchmarks/serving_vs_litserve_<machine>.json",
    )
    p.add_argument(
        "--int8",
        action="store_true",
        help="--quantize int8 against fp32 for each --checkpoint: accuracy on --data's test split, speed, "
        "serving throughput; writes benchmarks/serving_int8_<machine>.json",
    )
    p.add_argument(
        "--quantize",
        default=None,
        choices=["none", "int8"],
        help="with --litserve: the precision both competitors serve in (default none: fp32)",
    )
    p.add_argument(
        "--data",
        default="auto",
        help="with --int8: where AG News' test split comes from (auto: $DISTRINEWS_DATA_DIR, else the "
        "embedded sample; ../shared/data/ag_news has all 7,600 test texts)",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help="JSON results file (default benchmarks/serving.json, or the mode's file, see above)",
    )
    p.add_argument("--plot", type=Path, default=None, help="PNG figure (default: beside --output, .png)")
    args = p.parse_args(argv)
    args.levels_given, args.output_given = args.levels is not None, args.output is not None
    if args.levels is None:
        args.levels = "1,4,16,64"
    if args.output is None:
        args.output = REPO / "benchmarks" / "serving.json"
    if args.before and not args.overload:
        p.error("--before goes with --overload")
    if sum((args.overload, args.litserve, args.int8)) > 1:
        p.error("--overload, --litserve and --int8 are separate measurements: pick one")
    if args.quantize and not args.litserve:
        p.error("--quantize goes with --litserve (--int8 measures both precisions)")
    if args.checkpoint and len(args.checkpoint) > 1 and not args.int8:
        p.error("several --checkpoint go with --int8 only")
    return args


@main_guard
def main(argv=None):
    args = parse_args(argv)
    if args.overload:
        return overload_main(args)
    if args.litserve:
        return race_main(args)
    if args.int8:
        return int8_main(args)
    return compare_main(args)


if __name__ == "__main__":
    main()
