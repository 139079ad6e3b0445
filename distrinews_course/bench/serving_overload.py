"""--overload mode of scripts/bench_serving.py: the server past its capacity and work for clients that left,
before and after load shedding (issue 12), side by side; writes benchmarks/serving_overload.{json,png}."""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

from distrinews_lib.errors import UserError

from .serving_load import (
    TEXTS,
    Connection,
    drive_overload,
    health_json,
    raw_post,
    send_and_close,
    summarize_overload,
)
from .serving_servers import REPO, Server, commit_of, free_port, make_checkpoint_with, wait_idle

OVERLOAD_DOC = """\
--overload: the server past its capacity, before and after load shedding (issue 12), side by side.

Both servers run at once, each `python -m distrinews_lib.serving` with its defaults: "after" from this
checkout, "before" from a temporary git worktree of --before REF (each serves a tiny random model saved
by its own code: the checkpoint format changed in between). At each concurrency (256 and 1024) each
server in turn gets that many clients, each with a keep-alive connection, sending POST /predict back to
back; a client answered 503/429 waits the Retry-After it was given (a well-behaved client) and goes on.
Reported per level: requests sent, answered (200), shed (503/429), other errors, p50/p95/p99 of the
answered ones, and how many were answered within the deadline (10 s).

Then the abandoned work: 2,000 /predict requests, each sent and its connection closed at once, then 100
maximal /predict/batch calls (64 texts of 10,000 characters) likewise; after each burst a real request
is timed until it is answered (it waits behind whatever work the server still does; if it is refused
with 503 it is sent again every 0.1 s), and the server process's CPU seconds until it is idle again are
read from /proc, with its own counters where it has them.
"""

MAXIMAL_TEXT = ("Stocks rally on Wall Street as tech shares surge after strong quarterly earnings. " * 130)[:10_000]


def work_counters(health: dict) -> dict:
    """What the server says it computed; the old server counts /predict texts only as batches x mean size."""
    b = health.get("batching") or {}
    texts, estimated = b.get("texts_run"), False
    if texts is None:  # the old server: batches x their mean size (rounded to 2 decimals), so approximate
        texts, estimated = b.get("batches_run", 0) * (b.get("mean_batch_size") or 0), True
    return {
        "predict_texts_run": texts,
        "estimated": estimated,
        "batch_calls_run": b.get("batch_calls_run"),
        "queue": health.get("queue"),
    }


def abandoned_burst(server: "Server", requests: list[bytes]) -> dict:
    """Send-and-close every request, time one real request right after, then the CPU the server spent."""
    port, pid = server.port, server.proc.pid
    cpu0 = wait_idle(pid)
    before = work_counters(asyncio.run(health_json(port)))
    sent_s = asyncio.run(send_and_close(port, requests))

    async def probe():
        # Polls every 0.1 s until answered: this measures when the server is free for real work again, not
        # how a client honouring Retry-After would fare (the first Retry-After is recorded too).
        t, statuses, retry_after = time.perf_counter(), [], None
        while True:
            conn = Connection(port)
            try:
                body = json.dumps({"text": TEXTS[0]}).encode()
                status, _ = await asyncio.wait_for(conn.request("POST", "/predict", body), 900)
            finally:
                conn.close()
            statuses.append(status)
            if status not in (429, 503) or time.perf_counter() - t > 900:
                return statuses, time.perf_counter() - t, retry_after
            retry_after = retry_after or conn.retry_after
            await asyncio.sleep(0.1)

    statuses, probe_s, retry_after = asyncio.run(probe())
    status = statuses[-1]
    cpu1 = wait_idle(pid)
    after = work_counters(asyncio.run(health_json(port)))
    texts = max(0, round(after["predict_texts_run"] - before["predict_texts_run"]) - 1)  # not the probe
    calls = (after["batch_calls_run"] - before["batch_calls_run"]) if after["batch_calls_run"] is not None else None
    delta = {"predict_texts_run": texts, "batch_calls_run": calls}
    if after["estimated"]:
        delta["note"] = "server reports /predict texts only approximately and /predict/batch calls not at all"
    queue = {
        k: v - (before["queue"] or {}).get(k, 0)
        for k, v in (after["queue"] or {}).items()
        if isinstance(v, int) and k not in ("max_requests", "max_texts", "waiting_requests", "waiting_texts")
    }
    return {
        "requests": len(requests),
        "burst_sent_s": round(sent_s, 2),
        "probe_status": status,
        "probe_wait_s": round(probe_s, 3),
        "probe_refused": len(statuses) - 1,
        "probe_first_retry_after": retry_after,
        "server_cpu_s": round(cpu1 - cpu0, 2),
        "computed": delta,
        "server_queue_counters": queue or None,
    }


def plot_overload(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ("before", "after") if n in report["servers"]]
    colors = {"before": "tab:orange", "after": "tab:blue"}
    levels = report["settings"]["concurrency_levels"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    width = 0.8 / len(names)
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(levels))]
        rows = [next(r for r in report["levels"] if r["concurrency"] == c)[name] for c in levels]
        axes[0].bar(xs, [r["latency_answered_ms"]["p99"] for r in rows], width, color=colors[name], label=name)
        axes[1].bar(xs, [100 * (r["shed_fraction"] or 0) for r in rows], width, color=colors[name], label=name)
    for ax, title, unit in (
        (axes[0], "p99 latency of answered requests", "ms"),
        (axes[1], "requests shed (503 + Retry-After)", "% of sent"),
    ):
        ax.set_xticks(range(len(levels)), [f"{c} clients" for c in levels])
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit)
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)
    bursts = list(report["abandoned"][names[0]])
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(bursts))]
        axes[2].bar(
            xs, [report["abandoned"][name][b]["probe_wait_s"] for b in bursts], width, color=colors[name], label=name
        )
    axes[2].set_xticks(range(len(bursts)), [report["abandoned"][names[0]][b]["label"] for b in bursts], fontsize=8)
    axes[2].set_yscale("log")
    axes[2].set_ylabel("s (log)")
    axes[2].set_title("wait of a real request sent after\nrequests whose clients left", fontsize=10)
    axes[2].legend()
    axes[2].grid(True, axis="y", alpha=0.3)
    fig.suptitle(
        f"DistriNews server past its capacity, tiny model, {report['provenance']['machine']} "
        f"(load average {report['provenance']['load_average_at_start']} at start)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def overload_main(args) -> None:
    from .provenance import provenance

    levels = [int(x) for x in args.levels.split(",")] if args.levels_given else ([8] if args.quick else [256, 1024])
    duration = args.duration if args.duration is not None else (1.0 if args.quick else 20.0)
    warmup = args.warmup if args.warmup is not None else (0.3 if args.quick else 2.0)
    n_single, n_batch = (20, 2) if args.quick else (2000, 100)
    deadline_s = 10.0
    info = provenance()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="distrinews-overload-") as tmp:
        tmp = Path(tmp)
        trees = {"after": REPO}
        if args.before:
            before_tree = tmp / "before"
            r = subprocess.run(
                ["git", "worktree", "add", "--detach", str(before_tree), args.before],
                cwd=REPO,
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                raise UserError(f"--before {args.before}: git worktree add failed: {r.stderr.strip()[:300]}")
            trees = {"before": before_tree, "after": REPO}
        commits = {name: commit_of(tree) for name, tree in trees.items()}
        try:
            servers = {
                name: Server(make_checkpoint_with(tree, tmp / f"ckpt_{name}"), free_port(), [], tree=tree)
                for name, tree in trees.items()
            }
            for server in servers.values():
                server.launch()
            try:
                for name, server in servers.items():
                    server.__enter__()
                    print(f"[{name}] {commit_of(server.tree)[:12]}: {shlex.join(server.cmd)}", flush=True)
                results = []
                for c in levels:
                    row = {"concurrency": c}
                    for name, server in servers.items():
                        wait_idle(server.proc.pid)
                        records, elapsed = asyncio.run(drive_overload(server.port, c, duration, warmup))
                        row[name] = summarize_overload(records, elapsed, deadline_s)
                        r = row[name]
                        print(
                            f"  {name:<6} c={c:>5}: sent {r['sent']:>6}  answered {r['answered']:>6}  "
                            f"shed {r['shed']:>6}  errors {r['errors']:>4}  "
                            f"p99 answered {r['latency_answered_ms']['p99']} ms",
                            flush=True,
                        )
                    results.append(row)
                bursts = {
                    "predict": (
                        f"{n_single} /predict",
                        [raw_post("/predict", {"text": TEXTS[i % len(TEXTS)]}) for i in range(n_single)],
                    ),
                    "batch": (
                        f"{n_batch} maximal /predict/batch",
                        [raw_post("/predict/batch", {"texts": [MAXIMAL_TEXT] * 64}) for _ in range(n_batch)],
                    ),
                }
                abandoned = {}
                for name, server in servers.items():
                    abandoned[name] = {}
                    for key, (label, requests) in bursts.items():
                        res = abandoned_burst(server, requests)
                        res["label"] = label
                        abandoned[name][key] = res
                        print(
                            f"  {name:<6} {label} sent and closed: a real request then waited "
                            f"{res['probe_wait_s']} s; server CPU {res['server_cpu_s']} s; "
                            f"computed {res['computed']}",
                            flush=True,
                        )
            finally:
                for server in servers.values():
                    server.__exit__(None, None, None)
        finally:
            if args.before:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(tmp / "before")], cwd=REPO, capture_output=True
                )
    report = {
        "what": "the server past its capacity (POST /predict at high concurrency) and work for clients that left: "
        "before and after load shedding (issue 12), measured side by side in one run",
        "quick": args.quick,
        "provenance": info,
        "servers": {
            name: {"git_commit": commits[name], "command": s.cmd, "settings": "defaults"} for name, s in servers.items()
        },
        "settings": {
            "concurrency_levels": levels,
            "duration_s": duration,
            "warmup_s": warmup,
            "deadline_s_of_after": deadline_s,
            "client": "asyncio HTTP/1.1 in this process, one keep-alive connection per client, back to back; "
            "a shed client (503/429) waits its Retry-After, then goes on; 60 s client timeout",
            "method": OVERLOAD_DOC,
        },
        "levels": results,
        "abandoned": abandoned,
        "wall_time_s": round(time.time() - started, 1),
    }
    report["headline"] = overload_headline(report)
    out = args.output if args.output_given else REPO / "benchmarks" / "serving_overload.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    png = args.plot or out.with_suffix(".png")
    plot_overload(report, png)
    print("\n" + "\n".join(report["headline"]["lines"]))
    print(f"wrote {out} and {png}")


def overload_headline(report: dict) -> dict:
    lines = []
    for row in report["levels"]:
        for name in ("before", "after"):
            if name in row:
                r = row[name]
                lines.append(
                    f"c={row['concurrency']} {name}: shed {r['shed']} of {r['sent']} "
                    f"({100 * (r['shed_fraction'] or 0):.1f}%), p99 of answered "
                    f"{r['latency_answered_ms']['p99']} ms, answered within "
                    f"{report['settings']['deadline_s_of_after']:g} s: "
                    f"{r['answered_within_deadline']} of {r['answered']}, errors {r['errors']}"
                )
    for name, bursts in report["abandoned"].items():
        for b in bursts.values():
            lines.append(
                f"{name}: {b['label']} sent and closed -> a real request waited {b['probe_wait_s']} s, "
                f"server CPU {b['server_cpu_s']} s, computed {b['computed']}"
            )
    return {"lines": lines}
