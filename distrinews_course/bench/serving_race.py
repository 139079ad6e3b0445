"""--litserve mode of scripts/bench_serving.py: our server raced against LitServe serving the same checkpoint, in one
run on one machine; writes benchmarks/serving_vs_litserve_<machine>.json. race() is the measurement, shared with
--int8 (serving_int8.py), which races the fp32 server against the int8 one the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from distrinews_lib.errors import UserError

from .serving_load import drive_overload, summarize_overload
from .serving_servers import REPO, Server, _versions, free_port, make_checkpoint, model_description
from .timing import cpu_busy_seconds

RACE_DOC = """\
Both servers run at once, each in its own process group, serving the same checkpoint. At each concurrency the
measurement alternates between them in rounds (A then B, then B then A, ...): each slice is an unrecorded warm-up,
then `duration_s` measured, with `concurrency` clients (one keep-alive connection each, all in this process,
asyncio HTTP/1.1) sending POST /predict back to back over the same 12 news texts. The server not being measured is
paused (SIGSTOP to its process group, SIGCONT before its own slice): idle LitServe polls its queues (its inference
worker asks the manager for work every millisecond), which would take CPU from the one being measured on a small
machine. A client answered 503/429 waits the Retry-After it was given, then goes on (a well-behaved client; our
server sheds when its queue is full). Per slice: answered requests per second, latency of the answered ones
(p50/p95/p99), every request that was not answered 200 (`failed`: shed plus errors), the server's CPU seconds (its
whole process group, from /proc) per answered request, and `others_cores`: CPU the rest of the machine used meanwhile
(other programs; this process's own load generator excluded). The level's figures pool its rounds.
"""


def pause(server: Server, paused: bool) -> None:
    os.killpg(server.proc.pid, signal.SIGSTOP if paused else signal.SIGCONT)


def measure_slice(server: Server, concurrency: int, duration: float, warmup: float) -> tuple[list, float, dict]:
    """One slice against one server: (records, measured seconds, {server_cpu_s, others_cores})."""
    busy0, own0, srv0, t0 = cpu_busy_seconds(), time.process_time(), server.cpu_seconds(), time.perf_counter()
    records, elapsed = asyncio.run(drive_overload(server.port, concurrency, duration, warmup))
    seconds = time.perf_counter() - t0
    server_cpu, own = server.cpu_seconds() - srv0, time.process_time() - own0
    busy1 = cpu_busy_seconds()
    others = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0 - own - server_cpu) / seconds)
    return (
        records,
        elapsed,
        {
            "server_cpu_s": round(server_cpu, 3),
            "others_cores": None if others is None else round(others, 3),
            "window_s": round(seconds, 2),
        },
    )


def summarize_slice(records, elapsed: float, extra: dict, deadline_s: float) -> dict:
    row = summarize_overload(records, elapsed, deadline_s)
    row["failed"] = row["shed"] + row["errors"]
    row["cpu_ms_per_answer"] = round(1000 * extra["server_cpu_s"] / row["answered"], 3) if row["answered"] else None
    return {**row, **extra}


def race(
    servers: dict[str, Server], levels: list[int], duration: float, warmup: float, rounds: int, deadline_s: float = 10.0
) -> list[dict]:
    """Every server measured at every level, alternating in rounds, the others paused (see RACE_DOC)."""
    names = list(servers)
    out = []
    for c in levels:
        pooled = {name: ([], 0.0, {"server_cpu_s": 0.0, "others_cores": [], "window_s": 0.0}) for name in names}
        per_round = []
        for r in range(rounds):
            order = names if r % 2 == 0 else names[::-1]
            this_round = {}
            for name in order:
                for other in names:
                    pause(servers[other], other != name)
                records, elapsed, extra = measure_slice(servers[name], c, duration, warmup)
                this_round[name] = summarize_slice(records, elapsed, extra, deadline_s)
                recs, secs, acc = pooled[name]
                recs.extend(records)
                acc["server_cpu_s"] += extra["server_cpu_s"]
                acc["window_s"] += extra["window_s"]
                acc["others_cores"].append(extra["others_cores"])
                pooled[name] = (recs, secs + elapsed, acc)
            per_round.append(this_round)
            print(
                f"  c={c:>4} round {r + 1}: "
                + "   ".join(
                    f"{n} {row['answered_per_s']:.0f}/s p99 {row['latency_answered_ms']['p99']} ms "
                    f"failed {row['failed']} (others {row['others_cores']} cores)"
                    for n, row in this_round.items()
                ),
                flush=True,
            )
        for name in names:
            pause(servers[name], False)
        row = {"concurrency": c, "rounds": per_round}
        for name, (recs, secs, acc) in pooled.items():
            known = [x for x in acc["others_cores"] if x is not None]
            acc["others_cores"] = round(max(known), 3) if known else None  # the worst slice of the level
            row[name] = summarize_slice(recs, secs, acc, deadline_s)
        out.append(row)
    return out


def idle_cpu(servers: dict[str, Server], seconds: float = 3.0) -> dict:
    """Each server's CPU use while nobody sends it anything (cores), measured alone."""
    out = {}
    for name, server in servers.items():
        for other in servers:
            pause(servers[other], other != name)
        time.sleep(0.5)
        c0 = server.cpu_seconds()
        time.sleep(seconds)
        out[name] = round((server.cpu_seconds() - c0) / seconds, 3)
    for server in servers.values():
        pause(server, False)
    return out


def litserve_version() -> str:
    try:
        import litserve
    except ImportError as err:
        raise UserError(
            f"--litserve needs LitServe, the competitor it races: pip install litserve (it is in "
            f"requirements-dev.txt; a benchmark dependency, the server never needs it). ({err})"
        ) from None
    return litserve.__version__


def litserve_command(checkpoint: Path, port: int, ours: dict, quantize: str) -> list[str]:
    """The LitServe competitor, configured as our server is (ours: its resolved settings)."""
    from .serving_litserve import COMMAND

    return [
        sys.executable,
        *COMMAND,
        "--checkpoint",
        str(checkpoint),
        "--port",
        str(port),
        "--max-batch-size",
        str(ours["max_batch_size"]),
        "--batch-timeout-ms",
        str(ours["batch_window_ms"]),
        "--timeout-s",
        str(ours["deadline_s"]),
        "--torch-threads",
        str(ours["torch_threads"]),
        "--workers",
        "1",
        "--quantize",
        quantize,
    ]


def our_settings() -> dict:
    """What `python -m distrinews_lib.serving --device cpu` resolves to on this machine (its defaults)."""
    from distrinews_lib.serving.settings import ServingSettings

    s = ServingSettings.resolve(device="cpu")
    return {
        "max_batch_size": s.max_batch_size,
        "batch_window_ms": s.batch_window_ms,
        "deadline_s": s.deadline_s,
        "max_queue": s.max_queue,
        "torch_threads": s.torch_threads,
    }


@contextlib.contextmanager
def race_servers(checkpoint: Path, quantize: str = "none", quiet: bool = False):
    """Our server and the LitServe competitor on the same checkpoint, started side by side, ready; both stopped
    (with every process they started) on leaving."""
    ours = our_settings()
    ports = free_port(), free_port()
    servers = {
        "ours": Server(checkpoint, ports[0], ["--device", "cpu", "--quantize", quantize]),
        "litserve": Server(checkpoint, ports[1], [], cmd=litserve_command(checkpoint, ports[1], ours, quantize)),
    }
    for server in servers.values():
        server.launch()
    try:
        for name, server in servers.items():
            server.__enter__()
            if not quiet:
                print(f"[{name}] ready: {' '.join(server.cmd)}", flush=True)
        yield servers
    finally:
        for server in servers.values():
            server.__exit__(None, None, None)


def small_race(
    checkpoint: Path,
    levels: list[int],
    duration: float = 1.5,
    warmup: float = 0.3,
    rounds: int = 2,
    quantize: str = "none",
) -> list[dict]:
    """race_servers and race in one call, quietly (chapter 10's small race). The load generator runs its own asyncio
    loop, so where the caller already runs one (a Jupyter kernel does) it runs in a thread of its own."""
    from concurrent.futures import ThreadPoolExecutor

    def run() -> list[dict]:
        with race_servers(Path(checkpoint), quantize, quiet=True) as servers:
            return race(servers, levels, duration, warmup, rounds, our_settings()["deadline_s"])

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def race_headline(levels: list[dict]) -> dict:
    lines, targets = [], {}
    for row in levels:
        ours, lit = row["ours"], row["litserve"]
        tput = ours["answered_per_s"] / lit["answered_per_s"] if lit["answered_per_s"] else None
        p99o, p99l = ours["latency_answered_ms"]["p99"], lit["latency_answered_ms"]["p99"]
        met = tput is not None and tput >= 1 and p99o <= p99l
        targets[str(row["concurrency"])] = {
            "throughput_ratio_ours_over_litserve": round(tput, 3) if tput else None,
            "p99_ms": {"ours": p99o, "litserve": p99l},
            "met": met,
        }
        lines.append(
            f"c={row['concurrency']}: ours {ours['answered_per_s']:.0f} req/s p50 "
            f"{ours['latency_answered_ms']['p50']} ms p99 {p99o} ms failed {ours['failed']} | LitServe "
            f"{lit['answered_per_s']:.0f} req/s p50 {lit['latency_answered_ms']['p50']} ms p99 {p99l} ms "
            f"failed {lit['failed']} | throughput {tput:.2f}x, target (>= 1x, p99 no worse) "
            f"{'met' if met else 'NOT met'}"
        )
    return {"lines": lines, "targets": targets}


def race_main(args) -> None:
    from .provenance import load_average, machine_slug, provenance
    from .serving_compare import parse_levels

    version = litserve_version()
    levels = parse_levels(args.levels) if args.levels_given else ([1, 16] if args.quick else [1, 16, 64, 256])
    duration = args.duration if args.duration is not None else (0.6 if args.quick else 4.0)
    warmup = args.warmup if args.warmup is not None else (0.3 if args.quick else 1.0)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    quantize = args.quantize or "none"
    ours = our_settings()
    info = provenance()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="distrinews-race-") as tmp:
        checkpoint = args.checkpoint[0] if args.checkpoint else make_checkpoint(Path(tmp))
        if not Path(checkpoint).is_file():
            raise UserError(f"--checkpoint {checkpoint} does not exist")
        with race_servers(checkpoint, quantize) as servers:
            processes = {name: server.processes() for name, server in servers.items()}
            results = race(servers, levels, duration, warmup, rounds, ours["deadline_s"])
            idle = idle_cpu(servers, 1.0 if args.quick else 3.0)
        model = model_description(checkpoint)
        if not args.checkpoint:
            model["checkpoint"] = "tiny random DistilBERT made by the benchmark (seed 0, max_length 64)"
    report = {
        "what": "our server (python -m distrinews_lib.serving, its defaults) raced against LitServe serving the same "
        "checkpoint through its own API (a LitAPI with batched predict), in one run on one machine (issue 34)",
        "quick": args.quick,
        "provenance": info,
        "versions": {
            **_versions("litserve", "fastapi", "uvicorn", "pydantic", "httptools", "uvloop", "pyzmq"),
            "litserve": version,
        },
        "model": model,
        "precision": {"none": "fp32", "int8": "int8"}.get(quantize, quantize),
        "competitors": {
            "ours": {
                "command": servers["ours"].cmd,
                "settings": ours,
                "workers": "1 process: the event loop reads requests, 1 model thread runs batches",
            },
            "litserve": {
                "command": servers["litserve"].cmd,
                "settings": {
                    "max_batch_size": ours["max_batch_size"],
                    "batch_timeout_s": ours["batch_window_ms"] / 1000,
                    "timeout_s": ours["deadline_s"],
                    "workers_per_device": 1,
                    "num_api_servers": "default (1: one per inference worker)",
                    "torch_threads": ours["torch_threads"],
                },
                "code": "distrinews_course/bench/serving_litserve.py",
            },
        },
        "settings": {
            "concurrency_levels": levels,
            "duration_s_per_slice": duration,
            "warmup_s_per_slice": warmup,
            "rounds": rounds,
            "method": RACE_DOC,
        },
        "levels": results,
        "idle_cpu_cores": idle,
        "processes": processes,
        "load_average_at_end": load_average(),  # 1, 5 and 15 minutes; the start is in provenance
        "wall_time_s": round(time.time() - started, 1),
    }
    report["headline"] = race_headline(results)
    out = args.output if args.output_given else REPO / "benchmarks" / f"serving_vs_litserve_{machine_slug()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print("\n" + "\n".join(report["headline"]["lines"]))
    print(f"idle CPU (cores): {idle}")
    print(f"wrote {out}")
