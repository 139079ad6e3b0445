"""docs/serving.md and its tables and figures, made from the committed serving measurements: micro-batching
(benchmarks/serving.json), overload (serving_overload.json), the race against LitServe
(serving_vs_litserve_<machine>.json) and int8 against fp32 (serving_int8_<machine>.json).

    python -m distrinews_course.bench.serving_tables     # writes docs/serving.md and docs/serving_*.png
    serving_page(root), write_serving_page(root)          # what a docs generator calls

Every figure comes from the file; the caption names the machine and the date it came from."""

from __future__ import annotations

import json
from pathlib import Path


def _where(report: dict, path: str) -> str:
    p = report["provenance"]
    info = p.get("machine_info") or {}
    load = [x for x in (p.get("load_average_at_start"), report.get("load_average_at_end")) if x]
    return (
        f"`{path}`: {p['machine']} ({info.get('cpu_count', '?')} CPU cores), {p['started'][:16].replace('T', ' ')}"
        f" UTC, torch {p['versions'].get('torch')}"
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


# --- docs/serving.md: the operator's page, every figure and table on it read from benchmarks/serving*.json ---------

PAGE = "docs/serving.md"
GENERATOR = "python -m distrinews_course.bench.serving_tables"


def _records(root: Path) -> dict:
    bench = Path(root) / "benchmarks"

    def first(pattern):
        paths = sorted(bench.glob(pattern))
        return (paths[0].relative_to(root).as_posix(), json.loads(paths[0].read_text())) if paths else None

    return {
        "batching": first("serving.json"),
        "overload": first("serving_overload.json"),
        "race": first("serving_vs_litserve_*.json"),
        "int8": first("serving_int8_*.json"),
    }


def batching_table(report: dict, path: str) -> str:
    """benchmarks/serving.json: the micro-batched server against --max-batch-size 1, one row per concurrency."""
    m = report["machine"]
    on, off = (next(c for c in report["configs"] if c["name"].startswith(n)) for n in ("batched", "baseline"))
    lines = [
        f"`{path}`: {m['cpu']} ({m['cpu_count']} CPU cores), {report['created'][:16].replace('T', ' ')} UTC, torch "
        f"{report['versions']['torch']}, the {report['model']['metadata_model']} model, {report['settings']['rounds']} "
        f"alternating rounds of {report['settings']['duration_s'] / report['settings']['rounds']:.2g} s per level.",
        "",
        "| clients | batched req/s | one pass per request req/s | ratio | p99 ms (batched / one per request) "
        "| errors |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for a, b in zip(on["levels"], off["levels"]):
        lines.append(
            f"| {a['concurrency']} | {a['requests_per_s']:,.0f} | {b['requests_per_s']:,.0f} "
            f"| **{a['requests_per_s'] / b['requests_per_s']:.2f}x** "
            f"| {a['latency_ms']['p99']:.1f} / {b['latency_ms']['p99']:.1f} | {a['errors'] + b['errors']} |"
        )
    return "\n".join(lines)


def overload_tables(report: dict, path: str) -> str:
    """benchmarks/serving_overload.json: past capacity, the server before load shedding against the one after."""
    names = [n for n in ("before", "after") if n in report["servers"]]
    deadline = report["settings"]["deadline_s_of_after"]
    lines = [
        f"{_where(report, path)}; before: the server as it was before load shedding, after: with it; "
        f"{report['settings']['duration_s']:g} s per level.",
        "",
        "| clients | server | answered req/s | shed (503) | p99 ms of answered | answered within "
        f"{deadline:g} s | errors |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for row in report["levels"]:
        for name in names:
            r = row[name]
            lines.append(
                f"| {row['concurrency']} | {name} | {r['answered_per_s']:,.0f} | {r['shed']:,} of {r['sent']:,} "
                f"({100 * (r['shed_fraction'] or 0):.1f}%) | {r['latency_answered_ms']['p99']} "
                f"| {r['answered_within_deadline']:,} of {r['answered']:,} | {r['errors']} |"
            )
    lines += [
        "",
        "Requests whose clients left before the answer (sent, then the connection closed at once), and a real request "
        "sent right after them:",
        "",
        "| burst | server | the real request waited | server CPU spent on the burst |",
        "|---|---|---:|---:|",
    ]
    for burst in report["abandoned"][names[0]]:
        for name in names:
            b = report["abandoned"][name][burst]
            lines.append(f"| {b['label']} | {name} | {b['probe_wait_s']} s | {b['server_cpu_s']} s |")
    return "\n".join(lines)


def plot_race(report: dict, path) -> None:
    """Answered requests per second and p99 latency against clients, ours and LitServe, from the race's record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clients = [row["concurrency"] for row in report["levels"]]
    fig, (thr, p99) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, label in (("ours", "DistriNews"), ("litserve", f"LitServe {report['versions']['litserve']}")):
        thr.plot(clients, [row[name]["answered_per_s"] for row in report["levels"]], "o-", label=label)
        p99.plot(clients, [row[name]["latency_answered_ms"]["p99"] for row in report["levels"]], "s-", label=label)
    thr.set(ylabel="answered requests / s", title="throughput", ylim=(0, None))
    p99.set(ylabel="p99 latency of answered (ms)", title="tail latency", yscale="log")
    for ax in (thr, p99):
        ax.set_xscale("log", base=2)
        ax.set_xticks(clients, [str(c) for c in clients])
        ax.minorticks_off()
        ax.set_xlabel("clients sending /predict back to back")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"the same checkpoint ({model_name(report['model'])}), {report['provenance']['machine']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def int8_findings(report: dict) -> str:
    """One line per checkpoint: where its fp32 forward pass spends its time, and what int8 did to speed and
    accuracy."""
    lines = []
    for r in report["checkpoints"]:
        acc = r["accuracy"]
        lines.append(
            f"- {model_name(r['model'])} ({r['model']['parameters'] / 1e6:.1f} M parameters): its `Linear` layers take "
            f"{100 * r['fp32_time']['linear_share_of_forward']:.0f}% of the fp32 forward time; int8 served "
            f"{r['speedup_at_16_clients']:.2f}x fp32's requests per second at 16 clients, with accuracy "
            f"{100 * acc['fp32']:.2f}% -> {100 * acc['int8']:.2f}%."
        )
    return "\n".join(lines)


def serving_page(root) -> str:
    """docs/serving.md: how to run the server and what it refuses (from the code's own tables), then every serving
    benchmark, each table and figure read from its record."""
    from distrinews_lib.checkpoint import DEFAULT_CHECKPOINT
    from distrinews_lib.serving.settings import BY_NAME as limits
    from distrinews_lib.serving.settings import OPTIONS, settings_markdown

    records = _records(root)
    uvicorn_flags = (
        f"--limit-concurrency {limits['limit_concurrency'].default} "
        f"--timeout-keep-alive {limits['timeout_keep_alive'].default}"
    )
    options = ["| flag | environment variable | default | meaning |", "|---|---|---|---|"] + [
        f"| {f'`{o.flag}`' if o.flag else '-'} | `{o.env}` | {o.default} | {o.help} |" for o in OPTIONS
    ]
    parts = [
        f"""# Serving a DistriNews checkpoint

<!-- Generated by `{GENERATOR}` from benchmarks/serving*.json and
distrinews_lib/serving/settings.py: edit those (or the generator), then run it again. -->

Chapter 10 serves the checkpoint that DDP trained and measures its latency under load. This page is for the operator
who runs the server: the commands, what the server refuses, every limit, and what the serving benchmarks measured.

## Run it

    python -m distrinews_lib.serving --checkpoint PATH --host 127.0.0.1 --port 8000   # recommended: every limit below
    uvicorn distrinews_lib.serving.app:app --port 8000                  # serves {DEFAULT_CHECKPOINT}

`GET /health` (and `HEAD`), `POST /predict {{"text": ...}}`, `POST /predict/batch {{"texts": [...]}}`, `/docs`
(Swagger UI served from the package, so it works offline; licence in `distrinews_lib/serving/static/`).
Concurrent single-text requests are micro-batched into one forward pass. Bad input gets a 4xx with a
message; the OpenAPI schema states every limit the server enforces (schemathesis checks both agree).

**A checkpoint that cannot serve correctly does not start**: missing, empty, a folder, corrupt, label names
that do not match the model's outputs (or repeat), a `max_length` beyond the model's position embeddings,
NaN/infinite weights, or a model that loads but cannot classify or answers non-finite probabilities. The
command line says why in one paragraph and exits with code 2; plain uvicorn logs the same paragraph and exits
with its own code for a failed startup, 3. `/health` names the checkpoint's file, not its folder.

**Overload is refused, not queued without end.** Requests wait for the model in a queue bounded in requests
and in texts; one that does not fit gets `503` with `Retry-After` at once, one not answered within its
deadline gets `503`, and work for a client that has gone (or whose deadline passed) is dropped before it
reaches the model. `/health` shows the queue and what it shed, expired and dropped. Slow and abusive
connections are cut off: header and body timeouts (`408`), header size and count limits (`431`), and a
connection limit (`503` with `Retry-After`).

**int8 on a CPU**: `--quantize int8` (or `DISTRINEWS_QUANTIZE=int8`) stores every `torch.nn.Linear` layer's weights
as int8 and runs those products in int8 (torch's dynamic quantization, per-channel weights); embeddings, LayerNorm
and softmax stay fp32, and `/health` reports `precision` (`fp32` or `int8`) and how it was quantized. It is refused at
start-up, in one paragraph, where it does not apply: another device than the CPU, a model whose `Linear` layers hold
under half of its weights outside the embeddings (GPT-2's layers are `Conv1D`), or one whose int8 answers move a
class probability by more than 0.1 on eight test texts.

## Settings

Each is a flag, or an environment variable for plain uvicorn. Both tables are generated from
`distrinews_lib/serving/settings.py`, where each default is written once.
""",
        "\n".join(options),
        "",
        settings_markdown(),
        f"""
`DISTRINEWS_BATCHING=off` is `--max-batch-size 1`. Plain uvicorn applies the connection limits only with its own
flags: `uvicorn distrinews_lib.serving.app:app --http distrinews_lib.serving.protocol:HttpProtocol
{uvicorn_flags}` (the `--http` protocol brings the timeouts, the header limits and the
JSON `503`s, configured by the variables above). Without it uvicorn has no header or body timeout, and oversized
headers still get `431` from the app, but only after uvicorn has read them whole.

## What the benchmarks measured

    python scripts/bench_serving.py              # micro-batching against one forward pass per request
    python scripts/bench_serving.py --overload --before REF   # past capacity, before and after a change
    python scripts/bench_serving.py --litserve   # the same checkpoint served by LitServe, raced
    python scripts/bench_serving.py --int8 --checkpoint A.pt --checkpoint B.pt --data ../shared/data/ag_news

Every table and figure below is read from the record it names, which holds the machine, the date and the command.
""",
    ]
    if records["batching"]:
        path, report = records["batching"]
        parts += [
            "### Micro-batching against one forward pass per request\n",
            "The same server twice, side by side: with its defaults, and with `--max-batch-size 1`.\n",
            batching_table(report, path),
            "\n![micro-batching against one forward pass per request](serving_batching.png)\n",
        ]
    if records["overload"]:
        path, report = records["overload"]
        parts += [
            "### Past capacity: load shedding\n",
            overload_tables(report, path),
            "\n![past capacity, before and after load shedding](serving_overload.png)\n",
        ]
    if records["race"]:
        path, report = records["race"]
        findings = race_findings(report)
        parts += [
            "### Against LitServe\n",
            "LitServe serves the same checkpoint through a `LitAPI` with a batched `predict`, its batch size and "
            "timeout set as ours, one inference worker; one load generator drives both in alternating rounds.\n",
            race_table(report, path),
            "\n" + ("Where LitServe did better:\n\n" + findings if findings else "LitServe did better nowhere.") + "\n",
            "![ours against LitServe](serving_vs_litserve.png)\n",
        ]
    if records["int8"]:
        path, report = records["int8"]
        parts += ["### int8 against fp32\n", int8_table(report, path), "", int8_findings(report) + "\n"]
    return "\n".join(parts).rstrip() + "\n"


def write_serving_page(root) -> list[Path]:
    """Write docs/serving.md and its figures; returns the paths written."""
    from .serving_compare import plot
    from .serving_overload import plot_overload

    root = Path(root)
    docs = root / "docs"
    docs.mkdir(exist_ok=True)
    records = _records(root)
    written = []
    for name, key, draw in (
        ("serving_batching.png", "batching", plot),
        ("serving_overload.png", "overload", plot_overload),
        ("serving_vs_litserve.png", "race", plot_race),
    ):
        if records[key]:
            draw(records[key][1], docs / name)
            written.append(docs / name)
    page = root / PAGE
    page.write_text(serving_page(root))
    return [page, *written]


if __name__ == "__main__":
    for p in write_serving_page(Path(__file__).resolve().parents[2]):
        print(f"wrote {p}")
