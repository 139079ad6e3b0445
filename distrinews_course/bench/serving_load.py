"""The serving benchmarks' load generator: keep-alive HTTP/1.1 clients on plain asyncio streams, and the statistics.

On a 2-core machine a heavier client (httpx, requests) would eat the CPU the server is being measured on, so each
concurrent client is one asyncio task with one keep-alive connection, in the benchmark's own process.
drive() measures back-to-back requests (any non-200 is an error); drive_overload() is the well-behaved client
past capacity (a shed request waits its Retry-After); send_and_close() leaves before the answer.
"""

from __future__ import annotations

import asyncio
import json
import statistics

# Short news-like texts of varied length, so batches need padding as real traffic does.
TEXTS = [
    "Stocks rally as tech shares surge after strong quarterly earnings from chip makers.",
    "Federer beats Nadal in a five-set Wimbledon final that lasted almost five hours.",
    "Oil prices climb as OPEC agrees to cut production for the rest of the year.",
    "NASA's new telescope sends back its first images of distant galaxies.",
    "UN Security Council meets on the crisis in the region as talks stall.",
    "Microsoft releases a security update for Windows after a worm spreads across the internet.",
    "Red Sox win the World Series for the first time since 1918.",
    "Central bank raises interest rates by a quarter point, citing inflation.",
    "Scientists sequence the genome of the chimpanzee, our closest living relative.",
    "Election results delayed as officials recount ballots in three provinces.",
    "Google shares jump in their first day of trading after the IPO.",
    "Olympic swimmer sets a new world record in the 200 metres freestyle.",
]


class Connection:
    """One keep-alive HTTP/1.1 connection: POST a JSON body, read status and body."""

    def __init__(self, port: int):
        self.port = port
        self.reader = self.writer = None
        self.retry_after = None  # the last response's Retry-After, in seconds

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        status = int(status_line.split()[1])
        length, close, self.retry_after = 0, False, None
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and "close" in value.lower():
                close = True
            elif name.lower() == "retry-after":
                self.retry_after = float(value)
        payload = await self.reader.readexactly(length)
        if close:
            self.close()
        return status, payload

    def close(self):
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


async def http_health(port: int) -> bool:
    conn = Connection(port)
    try:
        status, _ = await asyncio.wait_for(conn.request("GET", "/health"), 2)
        return status == 200
    except (OSError, asyncio.TimeoutError, ValueError, IndexError, asyncio.IncompleteReadError):
        return False
    finally:
        conn.close()


async def drive(port: int, concurrency: int, duration: float, warmup: float, timeout: float = 10.0):
    """`concurrency` clients each send POST /predict back to back; only the last `duration` s count.

    Returns (latencies in s, {error kind: count}, measured seconds)."""
    bodies = [json.dumps({"text": t}).encode() for t in TEXTS]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    start = loop.time()
    record_from, stop_at = start + warmup, start + warmup + duration

    async def client(k: int):
        conn = Connection(port)
        i = k
        while True:
            t0 = loop.time()
            if t0 >= stop_at:
                break
            try:
                status, payload = await asyncio.wait_for(
                    conn.request("POST", "/predict", bodies[i % len(bodies)]), timeout
                )
                ok = status == 200 and b'"label"' in payload
                kind = None if ok else f"HTTP {status}"
            except (OSError, asyncio.TimeoutError, ValueError, IndexError, asyncio.IncompleteReadError) as err:
                kind = type(err).__name__
                conn.close()
            t1 = loop.time()
            i += 1
            if t0 >= record_from:  # a request counts if it was sent inside the measured window
                if kind is None:
                    latencies.append(t1 - t0)
                else:
                    errors[kind] = errors.get(kind, 0) + 1
        conn.close()

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    elapsed = max(loop.time() - record_from, 1e-9)  # includes the tail of requests sent before stop_at
    return latencies, errors, elapsed


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def summarize(latencies, errors, elapsed, concurrency) -> dict:
    lat = sorted(latencies)
    ms = lambda v: round(v * 1000, 3)  # noqa: E731
    return {
        "concurrency": concurrency,
        "duration_s": round(elapsed, 3),
        "requests": len(lat),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "requests_per_s": round(len(lat) / elapsed, 1),
        "latency_ms": {
            "mean": ms(statistics.fmean(lat)) if lat else None,
            "p50": ms(percentile(lat, 50)),
            "p95": ms(percentile(lat, 95)),
            "p99": ms(percentile(lat, 99)),
            "max": ms(lat[-1]) if lat else None,
        },
    }


async def server_batching(port: int) -> dict:
    conn = Connection(port)
    try:
        _, payload = await conn.request("GET", "/health")
        return json.loads(payload).get("batching") or {}
    finally:
        conn.close()


async def drive_overload(port: int, concurrency: int, duration: float, warmup: float, timeout: float = 60.0):
    """`concurrency` clients POST /predict back to back; shed ones honour Retry-After. Records every request
    sent inside the measured window: (kind, latency s), kind one of ok, shed, an HTTP status, an error name."""
    bodies = [json.dumps({"text": t}).encode() for t in TEXTS]
    records: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    record_from, stop_at = start + warmup, start + warmup + duration

    async def client(k: int):
        conn, i = Connection(port), k
        while True:
            t0 = loop.time()
            if t0 >= stop_at:
                break
            wait = 0.0
            try:
                status, payload = await asyncio.wait_for(
                    conn.request("POST", "/predict", bodies[i % len(bodies)]), timeout
                )
                if status == 200 and b'"label"' in payload:
                    kind = "ok"
                elif status in (429, 503):
                    kind, wait = "shed", conn.retry_after or 1.0
                else:
                    kind = f"HTTP {status}"
            except (OSError, asyncio.TimeoutError, ValueError, IndexError, asyncio.IncompleteReadError) as err:
                kind = type(err).__name__
                conn.close()
                wait = 0.05
            t1 = loop.time()
            i += 1
            if t0 >= record_from:
                records.append((kind, t1 - t0))
            if wait:
                await asyncio.sleep(min(wait, max(0.0, stop_at - loop.time())))
        conn.close()

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return records, loop.time() - record_from


def summarize_overload(records, elapsed: float, deadline_s: float) -> dict:
    ok = sorted(lat for kind, lat in records if kind == "ok")
    shed = sorted(lat for kind, lat in records if kind == "shed")
    errors: dict[str, int] = {}
    for kind, _ in records:
        if kind not in ("ok", "shed"):
            errors[kind] = errors.get(kind, 0) + 1
    ms = lambda v: round(v * 1000, 1)  # noqa: E731
    sent = len(records)
    return {
        "sent": sent,
        "answered": len(ok),
        "shed": len(shed),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "shed_fraction": round(len(shed) / sent, 4) if sent else None,
        "answered_per_s": round(len(ok) / elapsed, 1),
        "answered_within_deadline": sum(1 for v in ok if v <= deadline_s),
        "latency_answered_ms": {
            "p50": ms(percentile(ok, 50)),
            "p95": ms(percentile(ok, 95)),
            "p99": ms(percentile(ok, 99)),
            "max": ms(ok[-1]) if ok else None,
        },
        "latency_shed_ms": {"p50": ms(percentile(shed, 50)), "p99": ms(percentile(shed, 99))} if shed else None,
        "measured_s": round(elapsed, 2),
    }


async def send_and_close(port: int, requests: list[bytes], parallel: int = 100) -> float:
    """Send each request on its own connection and close it at once, `parallel` at a time; seconds taken."""
    sem = asyncio.Semaphore(parallel)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(raw: bytes):
        async with sem:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(raw)
                await writer.drain()
                writer.close()
            except OSError:
                pass

    await asyncio.gather(*(one(r) for r in requests))
    return loop.time() - start


def raw_post(path: str, payload: dict) -> bytes:
    body = json.dumps(payload).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def health_json(port: int) -> dict:
    conn = Connection(port)
    try:
        _, payload = await asyncio.wait_for(conn.request("GET", "/health"), 60)
        return json.loads(payload)
    finally:
        conn.close()
