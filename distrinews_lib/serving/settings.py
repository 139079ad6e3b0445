"""Everything the server is told, in one object (ServingSettings), and every limit in one table (SETTINGS):
its environment variable, its command-line flag, its default. The settings that are not numbers (checkpoint,
device, threads, precision) are listed in OPTIONS. These two lists are the only place the defaults are written:
app.py's docstring, `--help` and the README's table are generated from them (settings_table, settings_markdown).

`ServingSettings.resolve(...)` gathers a value for each field once: a given one (a command-line flag, or
create_app's caller) wins, then the DISTRINEWS_* environment variable, then the default; each is checked.
The command line resolves before it loads the checkpoint; create_app resolves when the server starts, so
plain `uvicorn distrinews_lib.serving.app:app` reads the environment then.

Two groups of limits in the table:

* **app** settings are applied by the FastAPI app (the model queue, batching, the app's own header limits);
* **connection** settings belong to the HTTP server: the command line passes them to uvicorn and to
  distrinews_lib.serving.protocol.HttpProtocol.  Plain uvicorn takes the same limits from its own flags
  and from `--http distrinews_lib.serving.protocol:HttpProtocol` (see app.py's docstring).

A bad value (not a number, out of range) is a UserError: one paragraph and exit code 2 from the command
line, a failed startup under plain uvicorn.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

from ..checkpoint import DEFAULT_CHECKPOINT
from ..devices import resolve_device
from ..errors import UserError
from .schemas import MAX_BATCH_TEXTS

ENV_CHECKPOINT = "DISTRINEWS_CHECKPOINT"
ENV_DEVICE = "DISTRINEWS_DEVICE"
ENV_TORCH_THREADS = "DISTRINEWS_TORCH_THREADS"
ENV_BATCHING = "DISTRINEWS_BATCHING"  # off: one forward pass per request (the benchmark's baseline)
ENV_QUANTIZE = "DISTRINEWS_QUANTIZE"
# --quantize: what the server computes in. none: the checkpoint's own fp32 weights; int8: dynamic int8 for the
# Linear layers (weights int8 once, activations quantized per batch), CPU only (see quantize.py).
QUANTIZE_CHOICES = {"none": "fp32", "int8": "int8"}  # flag value -> the precision /health reports


@dataclass(frozen=True)
class Setting:
    name: str  # field of ServingSettings
    env: str  # environment variable
    flag: str  # command-line flag of python -m distrinews_lib.serving
    kind: type  # int or float
    default: Any
    low: float  # smallest allowed value
    high: float  # largest allowed value
    help: str
    group: str  # "app" or "connection"
    short: str  # the meaning in a few words, for the tables (settings_table, settings_markdown)


SETTINGS = [
    # --- the model queue (app); defaults chosen on the tiny CPU model (benchmarks/serving.json): a lone request
    # never waits (collection stops when no other request is being read), 32 texts get most of the gain ---
    Setting(
        "max_batch_size",
        "DISTRINEWS_MAX_BATCH_SIZE",
        "--max-batch-size",
        int,
        32,
        1,
        4096,
        "most /predict requests run together in one forward pass (1 turns batching off)",
        "app",
        "most /predict requests per forward pass (1: no batching)",
    ),
    Setting(
        "batch_window_ms",
        "DISTRINEWS_BATCH_WINDOW_MS",
        "--batch-window-ms",
        float,
        2.0,
        0,
        1000,
        "longest wait, in ms, for more requests to join a batch",
        "app",
        "longest wait, in ms, for more requests to batch",
    ),
    # 512 requests, not 128 (#34): 128 waiting singles are under 0.1 s of the tiny model's work, so at 256 clients
    # it shed 8% of them (each client then waits Retry-After, 1 s) and cut throughput to 887 req/s; with 512 none
    # was shed, 1,477 req/s at the same p99 (LitServe, which never sheds, 753). The texts bound stays 512.
    Setting(
        "max_queue",
        "DISTRINEWS_MAX_QUEUE",
        "--max-queue",
        int,
        512,
        1,
        1_000_000,
        "most requests waiting for the model; more are refused at once with 503 and Retry-After",
        "app",
        "most requests waiting for the model",
    ),
    Setting(
        "max_queue_texts",
        "DISTRINEWS_MAX_QUEUE_TEXTS",
        "--max-queue-texts",
        int,
        512,
        MAX_BATCH_TEXTS,
        10_000_000,
        f"most texts waiting for the model (a /predict/batch call counts its texts; at least {MAX_BATCH_TEXTS}); "
        "more are refused with 503 and Retry-After",
        "app",
        f"most texts waiting for the model (at least {MAX_BATCH_TEXTS})",
    ),
    Setting(
        "deadline_s",
        "DISTRINEWS_DEADLINE_S",
        "--deadline",
        float,
        10.0,
        0.001,
        3600,
        "seconds a request may wait for its answer; later it gets 503, and if it had not reached the model "
        "yet, the model never sees it",
        "app",
        "seconds a request may wait for its answer",
    ),
    # --- connections (uvicorn) ---
    Setting(
        "limit_concurrency",
        "DISTRINEWS_LIMIT_CONCURRENCY",
        "--limit-concurrency",
        int,
        512,
        1,
        1_000_000,
        "most open connections (and requests in progress); past it a request gets 503 and Retry-After and its "
        "connection is closed",
        "connection",
        "most open connections / requests in progress",
    ),
    Setting(
        "timeout_keep_alive",
        "DISTRINEWS_TIMEOUT_KEEP_ALIVE",
        "--timeout-keep-alive",
        int,
        5,
        1,
        3600,
        "seconds an idle keep-alive connection stays open",
        "connection",
        "seconds an idle keep-alive connection stays open",
    ),
    Setting(
        "header_timeout",
        "DISTRINEWS_HEADER_TIMEOUT",
        "--header-timeout",
        float,
        10.0,
        0.1,
        3600,
        "seconds a client has to send a request's line and headers (from connecting, or from the request's "
        "first byte); then 408 and the connection is closed",
        "connection",
        "seconds to send a request's line and headers (408)",
    ),
    Setting(
        "body_timeout",
        "DISTRINEWS_BODY_TIMEOUT",
        "--body-timeout",
        float,
        30.0,
        0.1,
        3600,
        "seconds a client has to send a request's body once its headers are in; then 408 and close",
        "connection",
        "seconds to send a request's body (408)",
    ),
    Setting(
        "max_header_bytes",
        "DISTRINEWS_MAX_HEADER_BYTES",
        "--max-header-bytes",
        int,
        32 * 1024,
        1024,
        16 * 1024 * 1024,
        "largest request line plus headers, in bytes; larger gets 431",
        "connection",
        "largest request line + headers, in bytes (431)",
    ),
    Setting(
        "max_headers",
        "DISTRINEWS_MAX_HEADERS",
        "--max-headers",
        int,
        100,
        4,
        100_000,
        "most header lines in a request; more gets 431",
        "connection",
        "most header lines (431)",
    ),
]
BY_NAME = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class Option:
    """A setting that is not a bounded number: documented with the table, resolved by ServingSettings.resolve."""

    env: str
    flag: str
    default: str  # as written in the docs
    help: str


OPTIONS = [
    Option(ENV_CHECKPOINT, "--checkpoint", str(DEFAULT_CHECKPOINT), "the checkpoint file to serve"),
    Option(ENV_DEVICE, "--device", "cuda if available, else cpu", "cpu, cuda or cuda:N"),
    Option(
        ENV_TORCH_THREADS,
        "--torch-threads",
        "all CPU cores but one",
        "threads per forward pass (0 keeps torch's own setting)",
    ),
    Option(ENV_QUANTIZE, "--quantize", "none", "int8: dynamic int8 Linear layers (CPU only)"),
    Option(ENV_BATCHING, "", "on", "off: one forward pass per request (the benchmark's baseline)"),
]


def settings_table() -> str:
    """Every setting as a plain-text table (app.py's docstring): variable, flag, default, meaning."""
    rows = [(o.env, o.flag, o.default, o.help) for o in OPTIONS]
    rows += [(s.env, s.flag, f"{s.default:g}" if s.kind is float else str(s.default), s.short) for s in SETTINGS]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    head = ("environment variable", "CLI flag", "default", "meaning")
    widths = [max(w, len(h)) for w, h in zip(widths, head)]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3] for r in [head, *rows])


def with_defaults(text: str) -> str:
    """`text` with {settings} replaced by settings_table(), {checkpoint} by the default checkpoint, and each {name}
    of SETTINGS by its default."""
    text = text.replace("{settings}", settings_table()).replace("{checkpoint}", str(DEFAULT_CHECKPOINT))
    for s in SETTINGS:
        text = text.replace("{" + s.name + "}", f"{s.default:g}" if s.kind is float else str(s.default))
    return text


def settings_markdown() -> str:
    """The limits (SETTINGS) as the README's Markdown table: flag, environment variable, default, limit."""
    lines = ["| flag | environment variable | default | limit |", "|---|---|---|---|"]
    for s in SETTINGS:
        default = f"{s.default:g}" if s.kind is float else str(s.default)
        lines.append(f"| `{s.flag}` | `{s.env}` | {default} | {s.short} |")
    return "\n".join(lines)


def _parse(setting: Setting, raw, source: str):
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = setting.kind(raw.strip()) if isinstance(raw, str) else setting.kind(raw)
        if setting.kind is int and not isinstance(raw, str) and float(raw) != value:
            raise ValueError
    except (TypeError, ValueError):
        kind = "whole number" if setting.kind is int else "number"
        raise UserError(f"{source}={raw!r} is not a {kind}; {setting.help} (default {setting.default}).") from None
    if not setting.low <= value <= setting.high or value != value:  # value != value: NaN
        low, high = (f"{int(v):,}" if setting.kind is int else f"{v:g}" for v in (setting.low, setting.high))
        raise UserError(f"{source}={raw!r} is out of range: it must be between {low} and {high} ({setting.help}).")
    return value


def resolve(name: str, value=None):
    """An explicit value wins (checked), else the environment variable (checked), else the default."""
    setting = BY_NAME[name]
    if value is not None:
        return _parse(setting, value, setting.flag)
    raw = os.environ.get(setting.env)
    if raw is None or raw.strip() == "":
        return setting.default
    return _parse(setting, raw, f"environment variable {setting.env}")


def resolve_all(group: Optional[str] = None, **explicit) -> dict:
    """{name: value} for every setting (or one group); explicit non-None values win over the environment."""
    return {s.name: resolve(s.name, explicit.get(s.name)) for s in SETTINGS if group in (None, s.group)}


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (containers, taskset)
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _quantize(given: Optional[str]) -> tuple[str, str]:
    """(the --quantize value, where it came from): the flag, else $DISTRINEWS_QUANTIZE, else none. Checked here against
    the choices; against the device, once that is resolved (ServingSettings.resolve)."""
    source = "--quantize"
    if given is None:
        given, source = os.environ.get(ENV_QUANTIZE, "").strip() or "none", f"environment variable {ENV_QUANTIZE}"
    value = str(given).strip().lower()
    if value not in QUANTIZE_CHOICES:
        raise UserError(
            f"{source}={given!r} is not a precision this server offers: none (the checkpoint's fp32 "
            "weights, the default) or int8 (dynamic int8 for the Linear layers, on the CPU)."
        )
    return value, source


def _torch_threads(given: Optional[int]) -> Optional[int]:
    """Threads per forward pass as given (the flag, else $DISTRINEWS_TORCH_THREADS), checked; None: the device's
    default (cpu_threads on the CPU, torch's own setting elsewhere). 0 leaves torch's own setting."""
    if given is None:
        raw = os.environ.get(ENV_TORCH_THREADS, "").strip()
        try:
            given = int(raw) if raw else None
        except ValueError:
            raise UserError(f"environment variable {ENV_TORCH_THREADS}={raw!r} is not a valid int.") from None
    if given is not None and given < 0:
        raise UserError(f"the number of torch threads must be 0 (leave torch's setting) or more (got {given}).")
    return given


def cpu_threads() -> int:
    """The CPU's default threads per forward pass: one core fewer than available, since the event loop needs a core to
    read requests and write responses while the model runs (and a small model gains little from the last core anyway);
    0 (torch's own setting) where OMP_NUM_THREADS says how many."""
    return 0 if os.environ.get("OMP_NUM_THREADS") else max(1, usable_cpus() - 1)


@dataclass(frozen=True)
class ServingSettings:
    """What the server is told. A field left None is filled in by resolve(): environment, else default."""

    checkpoint: Optional[str | Path] = None  # $DISTRINEWS_CHECKPOINT, else checkpoints/distilbert_agnews.pt
    device: Optional[str] = None  # auto, cpu, cuda, cuda:N; $DISTRINEWS_DEVICE, else cuda if available
    torch_threads: Optional[int] = None  # 0: leave torch's setting; $DISTRINEWS_TORCH_THREADS, else all cores but one
    quantize: Optional[str] = None  # none or int8; $DISTRINEWS_QUANTIZE, else none
    # The table's settings (see SETTINGS for each one's meaning, range and default):
    max_batch_size: Optional[int] = None  # 1: no batching; $DISTRINEWS_BATCHING=off gives 1 too
    batch_window_ms: Optional[float] = None
    max_queue: Optional[int] = None
    max_queue_texts: Optional[int] = None
    deadline_s: Optional[float] = None
    limit_concurrency: Optional[int] = None
    timeout_keep_alive: Optional[int] = None
    header_timeout: Optional[float] = None
    body_timeout: Optional[float] = None
    max_header_bytes: Optional[int] = None
    max_headers: Optional[int] = None

    @classmethod
    def resolve(cls, **given) -> "ServingSettings":
        """Every field filled in and checked: a given (not None) value wins, then the environment, then the default."""
        given = {k: v for k, v in given.items() if v is not None}
        if "max_batch_size" not in given and os.environ.get(ENV_BATCHING, "").strip().lower() in (
            "off",
            "0",
            "false",
            "no",
        ):
            given["max_batch_size"] = 1
        values = resolve_all(**given)
        if values["max_batch_size"] == 1:
            values["batch_window_ms"] = 0.0  # nothing to wait for: every request runs alone
        threads = _torch_threads(given.get("torch_threads"))
        quantize, source = _quantize(given.get("quantize"))
        device = str(resolve_device(given.get("device") or os.environ.get(ENV_DEVICE)))  # the training's rule too
        if quantize == "int8" and device != "cpu":
            raise UserError(
                f"{source}=int8 runs on the CPU only (torch's dynamic int8 kernels are CPU kernels), but this "
                f"server would run on {device}. Serve with --device cpu, or leave out --quantize on a GPU."
            )
        return cls(
            checkpoint=Path(given.get("checkpoint") or os.environ.get(ENV_CHECKPOINT) or DEFAULT_CHECKPOINT),
            device=device,
            torch_threads=threads if threads is not None else cpu_threads() if device == "cpu" else 0,
            quantize=quantize,
            **values,
        )

    def resolved(self) -> "ServingSettings":
        """This object's given fields, the others filled in (see resolve)."""
        return self.resolve(**{f.name: getattr(self, f.name) for f in fields(self)})


def serve_command(checkpoint, port: int, extra=()) -> list[str]:
    """The command line that starts this server on 127.0.0.1:`port` with warnings-only logs (what the chapter's live
    server and the serving benchmarks launch)."""
    return [sys.executable, "-m", "distrinews_lib.serving", "--checkpoint", str(checkpoint), "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "warning", *extra]  # fmt: skip
