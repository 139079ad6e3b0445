"""Markdown tables of the committed serving measurements (chapter 10 shows them): the race against LitServe
(benchmarks/serving_vs_litserve_<machine>.json) and int8 against fp32 (benchmarks/serving_int8_<machine>.json).
Every figure comes from the file; the caption names the machine and the date it came from."""

from __future__ import annotations


def _where(report: dict, path: str) -> str:
    p = report["provenance"]
    info = p.get("machine_info") or {}
    return (f"`{path}`: {p['machine']} ({info.get('cpu_count', '?')} CPU cores), {p['started'][:10]}, "
            f"torch {p['versions'].get('torch')}, git {p.get('git_commit')}"
            + (" (a quick run)" if report.get("quick") else ""))


def race_table(report: dict, path: str) -> str:
    others = [row[name]["others_cores"] for row in report["levels"] for name in ("ours", "litserve")
              if row[name].get("others_cores") is not None]
    lines = [f"**Ours against LitServe {report['versions']['litserve']}**, {report['model'].get('metadata_model')} "
             f"model in {report.get('precision', 'fp32')}: {_where(report, path)}; other programs used up to "
             f"{max(others, default=0):.2f} cores during a slice.", "", race_rows(report["levels"])]
    idle = report.get("idle_cpu_cores") or {}
    if idle:
        lines += ["", f"Idle, with no requests: ours used {idle.get('ours')} cores, LitServe {idle.get('litserve')}."]
    return "\n".join(lines)


def race_rows(levels: list[dict]) -> str:
    """The race's Markdown table: one row per concurrency, ours against LitServe."""
    lines = ["| clients | ours req/s | LitServe req/s | ours / LitServe | p50 ms (ours / LitServe) "
             "| p99 ms (ours / LitServe) | failed (ours / LitServe) | server CPU ms per answer (ours / LitServe) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in levels:
        o, li = row["ours"], row["litserve"]
        lines.append(
            f"| {row['concurrency']} | {o['answered_per_s']:,.0f} | {li['answered_per_s']:,.0f} "
            f"| **{throughput_ratio(row):.2f}x** "
            f"| {o['latency_answered_ms']['p50']} / {li['latency_answered_ms']['p50']} "
            f"| {o['latency_answered_ms']['p99']} / {li['latency_answered_ms']['p99']} "
            f"| {o['failed']} / {li['failed']} | {o['cpu_ms_per_answer']} / {li['cpu_ms_per_answer']} |")
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
    lines = [f"**int8 against fp32** on {report['data']['test_texts']:,} test texts ({report['data']['detail']}): "
             f"{_where(report, path)}.", "",
             "| checkpoint | parameters | in Linear layers | Linear share of fp32 forward time | accuracy fp32 "
             "| accuracy int8 | difference | model alone: int8 speed-up | serving, 16 clients: fp32 / int8 req/s "
             "| speed-up |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["checkpoints"]:
        m, acc = r["model"], r["accuracy"]
        at16 = next((x for x in r.get("serving", []) if x["concurrency"] == 16), None)
        serving = f"{at16['fp32']['answered_per_s']:,.0f} / {at16['int8']['answered_per_s']:,.0f}" if at16 else "-"
        lines.append(
            f"| {m.get('metadata_model')} (`{str(m['checkpoint']).rsplit('/', 1)[-1]}`) | {m['parameters']:,} "
            f"| {100 * m['linear_share_of_all']:.0f}% | {100 * r['fp32_time']['linear_share_of_forward']:.0f}% "
            f"| {100 * acc['fp32']:.2f}% | {100 * acc['int8']:.2f}% | {acc['delta_points']:+.2f} points "
            f"| {r['model_only']['speedup']:.2f}x | {serving} "
            f"| **{r.get('speedup_at_16_clients', float('nan')):.2f}x** |")
    return "\n".join(lines)
