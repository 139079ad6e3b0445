"""The default mode of scripts/bench_serving.py: the micro-batched server against the same server with
--max-batch-size 1, measured side by side at each concurrency; writes benchmarks/serving.{json,png}."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

from distrinews_lib.errors import UserError

from .serving_load import drive, server_batching, summarize
from .serving_servers import (
    Server,
    _versions,
    cpu_name,
    free_port,
    git_commit,
    load_average,
    make_checkpoint,
    model_description,
)


def measure(
    configs: dict, checkpoint: Path, levels: list[int], duration: float, warmup: float, rounds: int
) -> list[dict]:
    """Start every server configuration at once, then measure them in turns at each level.

    Each level is split into `rounds` slices that alternate between the configurations, so a
    burst of background load on a shared machine hits both sides alike and the ratio stays fair.
    """
    servers = {name: Server(checkpoint, free_port(), extra) for name, extra in configs.items()}
    started = [server.launch() for server in servers.values()]  # start side by side, then wait for each
    try:
        for name, server in servers.items():
            server.__enter__()
            print(f"[{name}] {shlex.join(server.cmd)}", flush=True)
        results = {name: {"name": name, "server_command": server.cmd, "levels": []} for name, server in servers.items()}
        for c in levels:
            acc = {name: ([], {}, 0.0) for name in servers}
            for _ in range(rounds):
                for name, server in servers.items():
                    lat, errs, secs = asyncio.run(drive(server.port, c, duration / rounds, warmup))
                    all_lat, all_errs, all_secs = acc[name]
                    all_lat.extend(lat)
                    for kind, n in errs.items():
                        all_errs[kind] = all_errs.get(kind, 0) + n
                    acc[name] = (all_lat, all_errs, all_secs + secs)
            for name in servers:
                row = summarize(*acc[name], c)
                results[name]["levels"].append(row)
                lat = row["latency_ms"]
                print(
                    f"  {name:<24} concurrency {c:>3}: {row['requests_per_s']:>8.1f} req/s   "
                    f"p50 {lat['p50']:7.2f} ms   p95 {lat['p95']:7.2f} ms   p99 {lat['p99']:7.2f} ms   "
                    f"errors {row['errors']}",
                    flush=True,
                )
        for name, server in servers.items():
            results[name]["server_batching"] = asyncio.run(server_batching(server.port))
        return list(results.values())
    finally:
        for server in started:
            server.__exit__(None, None, None)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for cfg, style, color in zip(report["configs"], ("o-", "s--"), ("tab:blue", "tab:orange")):
        xs = [r["concurrency"] for r in cfg["levels"]]
        ax1.plot(xs, [r["requests_per_s"] for r in cfg["levels"]], style, color=color, label=cfg["name"])
        ax2.plot(xs, [r["latency_ms"]["p99"] for r in cfg["levels"]], style, color=color, label=f"{cfg['name']} p99")
        ax2.plot(
            xs,
            [r["latency_ms"]["p50"] for r in cfg["levels"]],
            style,
            color=color,
            alpha=0.35,
            label=f"{cfg['name']} p50",
        )
    batched = report["configs"][0]["levels"]
    for row in batched:  # the speed-up over the baseline, written above each batched point
        ratio = report["throughput_ratio_batched_over_baseline"].get(str(row["concurrency"]))
        if ratio is not None:
            ax1.annotate(
                f"{ratio:.1f}x",
                (row["concurrency"], row["requests_per_s"]),
                textcoords="offset points",
                xytext=(0, 7),
                ha="center",
                fontsize=9,
            )
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        levels = report["settings"]["concurrency_levels"]
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent clients")
        ax.grid(True, alpha=0.3)
        ax.legend()
    ax1.margins(y=0.12)  # room for the ratio labels
    ax1.set_ylabel("requests / s")
    ax1.set_title("Throughput (POST /predict)")
    ax2.set_ylabel("latency (ms)")
    ax2.set_yscale("log")
    ax2.axhline(100, color="grey", lw=0.8, ls=":")
    ax2.text(1, 100, " 100 ms", va="bottom", fontsize=8, color="grey")
    ax2.set_title("Latency")
    machine = report["machine"]
    fig.suptitle(
        f"DistriNews serving, {report['model']['type']} ({report['model']['parameters']:,} params), "
        f"{machine['cpu_count']} CPU cores (load average {machine['load_average_1min_before']} at start)",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--levels {text!r} must be comma-separated integers such as 1,4,16,64") from None
    if not levels or min(levels) < 1:
        raise UserError("--levels needs at least one concurrency of 1 or more")
    return levels


def compare_main(args) -> None:
    """The batched server against --max-batch-size 1 (see scripts/bench_serving.py's docstring)."""
    import torch

    duration = args.duration if args.duration is not None else (1.5 if args.quick else 8.0)
    warmup = args.warmup if args.warmup is not None else (0.3 if args.quick else 0.5)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    levels = parse_levels(args.levels)

    with tempfile.TemporaryDirectory(prefix="distrinews-bench-") as tmp:
        given = args.checkpoint[0] if args.checkpoint else None  # --checkpoint may be repeated for --int8 only
        checkpoint = given or make_checkpoint(Path(tmp))
        if given is not None and not given.is_file():
            raise UserError(f"--checkpoint {given} does not exist")
        batched_extra = []
        if args.max_batch_size is not None:
            batched_extra += ["--max-batch-size", str(args.max_batch_size)]
        if args.batch_window_ms is not None:
            batched_extra += ["--batch-window-ms", str(args.batch_window_ms)]
        started = time.time()
        load_before = load_average()
        wanted = {"batched": batched_extra}
        if not args.no_baseline:
            wanted["baseline (no batching)"] = ["--max-batch-size", "1"]
        configs = measure(wanted, checkpoint, levels, duration, warmup, rounds)
        model = model_description(checkpoint)
        if given is None:
            model["checkpoint"] = (
                "tiny random DistilBERT made by this script (build_model(RunConfig(model='tiny', "
                "seed=0), AG_NEWS_LABELS), max_length 64)"
            )

    batched, baseline = configs[0], configs[-1]
    ratios = (
        {
            str(b["concurrency"]): round(b["requests_per_s"] / max(a["requests_per_s"], 1e-9), 2)
            for b, a in zip(batched["levels"], baseline["levels"])
        }
        if len(configs) > 1
        else {}
    )
    report = {
        "what": (
            "POST /predict throughput and latency, micro-batched server vs the same server with --max-batch-size 1"
        ),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": args.quick,
        "machine": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpu": cpu_name(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            # Other work on the machine changes the figures (a busy CPU hurts the baseline most).
            "load_average_1min_before": load_before,
            "load_average_1min_after": load_average(),
        },
        "versions": {
            "torch": torch.__version__,
            **_versions("transformers", "fastapi", "uvicorn", "pydantic", "httptools", "uvloop"),
        },
        # uvicorn picks its HTTP parser and event loop by what is installed: the C ones are much cheaper.
        "uvicorn_http": "httptools" if importlib.util.find_spec("httptools") else "h11",
        "uvicorn_loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        "git_commit": git_commit(),
        "model": model,
        "settings": {
            "concurrency_levels": levels,
            "duration_s": duration,
            "warmup_s_per_slice": warmup,
            "rounds": rounds,
            "method": "both servers run at once; each level is measured in `rounds` alternating slices "
            "of duration/rounds seconds per server, after an unrecorded warm-up per slice",
            "client": "asyncio HTTP/1.1, one keep-alive connection per concurrent client, separate process",
        },
        "configs": configs,
        "throughput_ratio_batched_over_baseline": ratios,
        "wall_time_s": round(time.time() - started, 1),
    }
    c16 = next((r for r in batched["levels"] if r["concurrency"] == 16), None)
    if c16 is not None and ratios:
        report["target_at_concurrency_16"] = {
            "goal": ">= 3x baseline requests/s, p99 < 100 ms, 0 errors",
            "ratio": ratios["16"],
            "p99_ms": c16["latency_ms"]["p99"],
            "errors": c16["errors"],
            "met": ratios["16"] >= 3 and c16["latency_ms"]["p99"] < 100 and c16["errors"] == 0,
        }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    png = args.plot or args.output.with_suffix(".png")
    plot(report, png)
    print("\nbatched / baseline requests/s: " + ", ".join(f"c={c}: {r}x" for c, r in ratios.items()))
    if "target_at_concurrency_16" in report:
        t = report["target_at_concurrency_16"]
        print(
            f"target at concurrency 16 ({t['goal']}): ratio {t['ratio']}x, p99 {t['p99_ms']} ms, "
            f"errors {t['errors']} -> {'met' if t['met'] else 'NOT met'}"
        )
    print(f"wrote {args.output} and {png}")
