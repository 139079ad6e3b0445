"""Markdown tables of the committed serving measurements (chapter 10 shows them): the race against LitServe
(benchmarks/serving_vs_litserve_<machine>.json) and int8 against fp32 (benchmarks/serving_int8_<machine>.json).
Every figure comes from the file; the caption names the machine and the date it came from."""

from __future__ import annotations


def _where(report: dict, path: str) -> str:
    p = report["provenance"]
    info = p.get("machine_info") or {}
    load = [x for x in (p.get("load_average_at_start"), report.get("load_average_at_end")) if x]
    return (
        f"`{path}`: {p['machine']} ({info.get('cpu_count', '?')} CPU cores), {p['started'][:16].replace('T', ' ')}"
        f" UTC, torch {p['versions'].get('torch')}, git {p.get('git_commit')}"
        + (f", load average (1 min) {' then '.join(f'{x[0]:.1f}' for x in load)}" if load else "")
        + (" (a quick run)" if report.get("quick") else "")
    )


def model_name(model: dict) -> str:
    """The model's name as its checkpoint records it; a local folder (a model copied onto the machine) by its
    folder's name, so no machine's path reaches the page."""
    name = str(model.get("metadata_model") or "?")
    parts = [x for x in name.replace("\\", "/").split("/") if x]
    return parts[-2] if len(parts) > 2 and parts[-1] == "model" else (parts[-1] if parts else name)


def race_table(report: dict, path: str) -> str:
    others = [
        row[name]["others_cores"]
        for row in report["levels"]
        for name in ("ours", "litserve")
        if row[name].get("others_cores") is not None
    ]
    lines = [
        f"**Ours against LitServe {report['versions']['litserve']}**, {model_name(report['model'])} "
        f"model in {report.get('precision', 'fp32')}: {_where(report, path)}; other programs used up to "
        f"{max(others, default=0):.2f} cores during a slice.",
        "",
        race_rows(report["levels"]),
    ]
    idle = report.get("idle_cpu_cores") or {}
    if idle:
        lines += ["", f"Idle, with no requests: ours used {idle.get('ours')} cores, LitServe {idle.get('litserve')}."]
    return "\n".join(lines)


def race_rows(levels: list[dict]) -> str:
    """The race's Markdown table: one row per concurrency, ours against LitServe."""
    lines = [
        "| clients | ours req/s | LitServe req/s | ours / LitServe | p50 ms (ours / LitServe) "
        "| p99 ms (ours / LitServe) | failed (ours / LitServe) | server CPU ms per answer (ours / LitServe) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in levels:
        o, li = row["ours"], row["litserve"]
        lines.append(
            f"| {row['concurrency']} | {o['answered_per_s']:,.0f} | {li['answered_per_s']:,.0f} "
            f"| **{throughput_ratio(row):.2f}x** "
            f"| {o['latency_answered_ms']['p50']} / {li['latency_answered_ms']['p50']} "
            f"| {o['latency_answered_ms']['p99']} / {li['latency_answered_ms']['p99']} "
            f"| {o['failed']} / {li['failed']} | {o['cpu_ms_per_answer']} / {li['cpu_ms_per_answer']} |"
        )
    return "\n".join(lines)


def throughput_ratio(row: dict) -> float:
    """Ours' answered requests per second over LitServe's, at one level of the race."""
    li = row["litserve"]["answered_per_s"]
    return row["ours"]["answered_per_s"] / li if li else float("nan")


def cpu_ratio(row: dict) -> float | None:
    """LitServe's server CPU per answer over ours, at one level."""
    o, li = row["ours"]["cpu_ms_per_answer"], row["litserve"]["cpu_ms_per_answer"]
    return li / o if o and li else None


def int8_table(report: dict, path: str) -> str:
    lines = [
        f"**int8 against fp32** on {report['data']['test_texts']:,} test texts ({report['data']['detail']}): "
        f"{_where(report, path)}.",
        "",
        "| checkpoint | parameters | in Linear layers | Linear share of fp32 forward time | accuracy fp32 "
        "| accuracy int8 | difference | model alone: int8 speed-up | serving, 16 clients: fp32 / int8 req/s "
        "| speed-up |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["checkpoints"]:
        m, acc = r["model"], r["accuracy"]
        at16 = next((x for x in r.get("serving", []) if x["concurrency"] == 16), None)
        serving = f"{at16['fp32']['answered_per_s']:,.0f} / {at16['int8']['answered_per_s']:,.0f}" if at16 else "-"
        lines.append(
            f"| {model_name(m)} (`{str(m['checkpoint']).rsplit('/', 1)[-1]}`) | {m['parameters']:,} "
            f"| {100 * m['linear_share_of_all']:.0f}% | {100 * r['fp32_time']['linear_share_of_forward']:.0f}% "
            f"| {100 * acc['fp32']:.2f}% | {100 * acc['int8']:.2f}% | {acc['delta_points']:+.2f} points "
            f"| {r['model_only']['speedup']:.2f}x | {serving} "
            f"| **{r.get('speedup_at_16_clients', float('nan')):.2f}x** |"
        )
    return "\n".join(lines)


def race_findings(report: dict) -> str:
    """One line per concurrency where LitServe did better on some measure (throughput, p99, failed requests), with
    the numbers and why, from the file; an empty string where it did better on none."""
    lines = []
    for row in report["levels"]:
        o, li = row["ours"], row["litserve"]
        worse = []
        if o["answered_per_s"] < li["answered_per_s"]:
            worse.append(f"throughput {o['answered_per_s']:,.0f} against {li['answered_per_s']:,.0f} req/s")
        if o["latency_answered_ms"]["p99"] > li["latency_answered_ms"]["p99"]:
            worse.append(f"p99 {o['latency_answered_ms']['p99']} against {li['latency_answered_ms']['p99']} ms")
        if o["failed"] > li["failed"]:
            sent = o["answered"] + o["failed"]
            why = (
                f"{o['shed']:,} shed by design, answered 503 with Retry-After at once because "
                f"{report['competitors']['ours']['settings']['max_queue']} requests were waiting already (LitServe "
                "queues without a bound: every client waits longer instead)"
                if o["shed"]
                else "errors"
            )
            worse.append(
                f"fewer failed requests, ours {o['failed']:,} of {sent:,} ({100 * o['failed'] / sent:.1f}%) "
                f"against {li['failed']:,}: {why}"
            )
        if worse:
            lines.append(f"- {row['concurrency']} clients: LitServe did better on " + "; ".join(worse) + ".")
    return "\n".join(lines)
