"""What a served model costs per text, and how its latency grows with load (chapter 10's two measurements).

    costs = cost_per_text(server.base)            # /predict/batch of 1, 2, 4 ... 64 texts: ms per text
    levels = latency_under_load(server.port)      # 1, 2, 4 ... 32 clients sending /predict back to back

The load comes from keep-alive HTTP/1.1 clients on plain asyncio streams (distrinews_course.bench.serving_load, the
serving benchmarks' client: a heavier one would eat the CPU the server is measured on). Each client sends its next
request as soon as the last one is answered (a closed loop), so N clients keep N requests in flight. A notebook's
kernel already runs an asyncio loop, so the clients run on a loop of their own in a worker thread.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .bench.serving_load import TEXTS, drive, server_batching, summarize
from .live_server import call

CLIENTS = (1, 2, 4, 8, 16, 32)
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class BatchCost:
    size: int  # texts in one /predict/batch call
    ms_per_call: float  # the median of the calls' times
    calls: int

    @property
    def ms_per_text(self) -> float:
        return self.ms_per_call / self.size


def cost_per_text(base, sizes=BATCH_SIZES, calls: int = 5) -> list[BatchCost]:
    """Time `calls` /predict/batch calls of each size, one after another (after one unrecorded call per size). The
    median, because one call in a few is slowed by something else on a shared machine."""
    costs = []
    for size in sizes:
        body = {"texts": [TEXTS[i % len(TEXTS)] for i in range(size)]}
        call(base, "POST", "/predict/batch", body)  # warm-up: the first call of a new shape is slower
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            status, answer = call(base, "POST", "/predict/batch", body)
            times.append(1000 * (time.perf_counter() - t))
            if status != 200:
                raise RuntimeError(f"/predict/batch with {size} texts answered {status}: {answer}")
        costs.append(BatchCost(size, statistics.median(times), calls))
    return costs


def batching_pays(costs: list[BatchCost], factor: float = 2.0) -> bool:
    """A text in the largest batch costs at most 1/factor of a text sent alone. 2: on the course's CPU model a batch of
    64 costs a text about a tenth of a lone call (the HTTP round trip, the tokenizer call and the model's launch are
    paid once per call); on a GPU the gain is larger. Half leaves room for a busy machine and a bigger model."""
    one = next(c for c in costs if c.size == 1)
    most = max(costs, key=lambda c: c.size)
    return most.size > 1 and most.ms_per_text * factor <= one.ms_per_text


@dataclass
class LoadLevel:
    clients: int
    answered: int
    errors: int
    seconds: float
    per_s: float  # answered requests per second
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_batch: float  # requests per forward pass while this level ran (/health's counters)
    mean_ms: float = float("nan")  # the mean latency: Little's law's time in flight


async def _levels(port: int, clients, seconds: float, warmup: float) -> list[LoadLevel]:
    levels = []
    for n in clients:
        await drive(port, n, warmup, 0)  # unrecorded: the server at this load (its connections close after)
        before = await server_batching(port)
        latencies, errors, elapsed = await drive(port, n, seconds, 0)
        after = await server_batching(port)
        s = summarize(latencies, errors, elapsed, n)
        passes = after["batches_run"] - before["batches_run"]
        levels.append(
            LoadLevel(
                n,
                s["requests"],
                s["errors"],
                s["duration_s"],
                s["requests_per_s"],
                s["latency_ms"]["p50"],
                s["latency_ms"]["p95"],
                s["latency_ms"]["p99"],
                round((after["texts_run"] - before["texts_run"]) / passes, 2) if passes else float("nan"),
                s["latency_ms"]["mean"] if s["latency_ms"]["mean"] is not None else float("nan"),
            )
        )
    return levels


def latency_under_load(port: int, clients=CLIENTS, seconds: float = 0.8, warmup: float = 0.2) -> list[LoadLevel]:
    """For each number of clients: `warmup` s unrecorded, then `seconds` s of POST /predict measured."""
    with ThreadPoolExecutor(1) as pool:  # its own event loop: the kernel's is already running
        return pool.submit(asyncio.run, _levels(port, clients, seconds, warmup)).result()


def throughput_grows(levels: list[LoadLevel], factor: float = 1.5) -> bool:
    """The most loaded level answered at least `factor` times the requests per second of one client, with no error.
    1.5: the course's CPU model answered about 3x as many at 16-64 clients as at 1 (benchmarks/serving.json), as
    micro-batching puts concurrent requests into one forward pass; without batching it stays near 1x, because one
    client already keeps the model busy between its requests' round trips only part of the time."""
    one = next(x for x in levels if x.clients == 1)
    most = max(levels, key=lambda x: x.clients)
    return all(x.errors == 0 for x in levels) and most.per_s >= factor * one.per_s


def requests_grouped(levels: list[LoadLevel], at_least: float = 2.0) -> bool:
    """At the most loaded level the server ran at least `at_least` requests per forward pass on average: with many
    requests in flight, each pass finds several waiting. One client can never give more than 1."""
    most = max(levels, key=lambda x: x.clients)
    return most.mean_batch >= at_least


def littles_law_holds(levels: list[LoadLevel], low: float = 0.75) -> bool:
    """Little's law at every level: requests in flight = answered/s x mean latency, and in this closed loop each
    client has one request in flight from its first send to its last answer (it sends the next at once), so the
    product must be the number of clients, a little under. Under: after its last answer a client waits, idle, for
    the level's slowest last request (one latency, 2-5% of a 0.8 s window here); low=0.75 leaves room for a straggler
    of a quarter of the window. Over 1.02x the clients (rounding) the figures would hold more requests in flight than
    there are clients: a wrong answered/s or a latency that misses part of a request's time fails either bound.
    A level with errors fails: a failed request was in flight too, but neither answered/s nor the mean counts it."""
    return bool(levels) and all(
        x.errors == 0 and low * x.clients <= x.per_s * x.mean_ms / 1000 <= 1.02 * x.clients for x in levels
    )


def load_table(levels: list[LoadLevel]) -> str:
    rows = [
        f"{'clients':>7} {'answered/s':>10} {'mean ms':>7} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} "
        f"{'per pass':>8} {'errors':>6}"
    ]
    rows += [
        f"{x.clients:>7} {x.per_s:>10,.0f} {x.mean_ms:>7.1f} {x.p50_ms:>7.1f} {x.p95_ms:>7.1f} {x.p99_ms:>7.1f} "
        f"{x.mean_batch:>8.1f} {x.errors:>6}"
        for x in levels
    ]
    return "\n".join(rows)


def batching_wins(batched: LoadLevel, unbatched: LoadLevel, factor: float = 1.5) -> bool:
    """At the same number of clients, the micro-batching server answered at least `factor` times the requests per
    second of the same server with --max-batch-size 1. 1.5: benchmarks/serving.json measured 2.9x at 16 clients
    and 4.0x at 64 on the course's CPU model, side by side."""
    return batched.clients == unbatched.clients and batched.per_s >= factor * unbatched.per_s


def first_step(levels: list[LoadLevel], grew: float = 1.05, grouped: float = 1.5) -> str:
    """A sentence on the step from the fewest clients to the next when the answers per second did not grow there
    (at most `grew` times), or "" when they did. It states what the run measured (answers per second, requests per
    pass, p50); why two clients did not group (each request arriving while the other's pass ran, or the shared
    cores slowing the server) it offers only as a guess, since no figure of the run tests it. `grouped`: the
    requests per pass from which this counts as grouping (1.5: half the passes ran two or more)."""
    levels = sorted(levels, key=lambda x: x.clients)
    if len(levels) < 2 or levels[1].per_s > grew * levels[0].per_s:
        return ""
    a, b = levels[0], levels[1]
    said = (
        f"From {a.clients} to {b.clients} clients the answers per second "
        f"{'did not grow' if b.per_s <= a.per_s else 'hardly grew'} ({a.per_s:,.0f} -> "
        f"{b.per_s:,.0f})"
    )
    if b.mean_batch < grouped:
        said += (
            f" and each forward pass still ran {b.mean_batch:.1f} request, while the median latency rose (p50 "
            f"{a.p50_ms:.1f} -> {b.p50_ms:.1f} ms): the second client added waiting, not answers. Why its requests"
            " did not group, this run does not test; one guess is that each arrived while the other's pass ran."
        )
    else:
        said += "."
    start = next((x for x in levels if x.mean_batch >= grouped), None)
    if start is not None and start.clients > b.clients:
        said += (
            f" Grouping, and with it the gain, started at {start.clients} clients ({start.mean_batch:.1f} per pass)."
        )
    return said


def load_paragraph(levels: list[LoadLevel], grew_at_least: float = 1.1) -> str:
    """The load curve in words, every figure the run's: one client's floor, the most loaded level's answers per
    second and requests per pass, the first step when it gave nothing (first_step), and whether the last step up
    still grew the answers per second by `grew_at_least` (1.1: a step that doubles the clients and gains under 10%
    has flattened)."""
    levels = sorted(levels, key=lambda x: x.clients)
    first, prev, most = levels[0], levels[-2], levels[-1]
    grew = most.per_s / prev.per_s
    knee = (
        f"From {prev.clients} to {most.clients} clients the answers per second still grew {grew:.2f}x: this run did "
        "not reach the load where they stop growing."
        if grew >= grew_at_least
        else f"From {prev.clients} to {most.clients} clients the answers per second went only {grew:.2f}x: the curve "
        "has flattened, and more clients would mostly add waiting."
    )
    return " ".join(
        x
        for x in (
            f"With one client a request took {first.p50_ms:.1f} ms (p50) and the server answered {first.per_s:,.0f} "
            f"a second. With {most.clients} clients it answered {most.per_s:,.0f} a second, "
            f"{most.per_s / first.per_s:.1f}x as many, while it ran {most.mean_batch:.1f} requests per forward "
            f"pass; each request took {most.p50_ms:.1f} ms (p50), {most.p95_ms:.1f} ms at p95.",
            first_step(levels),
            knee,
        )
        if x
    )
