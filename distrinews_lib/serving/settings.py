"""Every limit of the server in one table: its environment variable, its command-line flag, its default.

Two groups:

* **app** settings are read by the FastAPI app when it starts (create_app's arguments win, then the
  environment), so they work the same under `python -m distrinews_lib.serving` and plain
  `uvicorn distrinews_lib.serving.app:app`.
* **connection** settings belong to the HTTP server: the command line passes them to uvicorn and to
  distrinews_lib.serving.protocol.HttpProtocol.  Plain uvicorn takes the same limits from its own flags
  and from `--http distrinews_lib.serving.protocol:HttpProtocol` (see app.py's docstring).

A bad value (not a number, out of range) is a UserError: one paragraph and exit code 2 from the command
line, a failed startup under plain uvicorn.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import UserError
from .schemas import MAX_BATCH_TEXTS


@dataclass(frozen=True)
class Setting:
    name: str            # attribute / create_app argument
    env: str             # environment variable
    flag: str            # command-line flag of python -m distrinews_lib.serving
    kind: type           # int or float
    default: Any
    low: float           # smallest allowed value
    high: float          # largest allowed value
    help: str
    group: str           # "app" or "connection"


SETTINGS = [
    # --- the model queue (app) ---
    Setting("max_batch_size", "DISTRINEWS_MAX_BATCH_SIZE", "--max-batch-size", int, 32, 1, 4096,
            "most /predict requests run together in one forward pass (1 turns batching off)", "app"),
    Setting("batch_window_ms", "DISTRINEWS_BATCH_WINDOW_MS", "--batch-window-ms", float, 2.0, 0, 1000,
            "longest wait, in ms, for more requests to join a batch", "app"),
    Setting("max_queue", "DISTRINEWS_MAX_QUEUE", "--max-queue", int, 128, 1, 1_000_000,
            "most requests waiting for the model; more are refused at once with 503 and Retry-After", "app"),
    Setting("max_queue_texts", "DISTRINEWS_MAX_QUEUE_TEXTS", "--max-queue-texts", int, 512, MAX_BATCH_TEXTS, 10_000_000,
            f"most texts waiting for the model (a /predict/batch call counts its texts; at least {MAX_BATCH_TEXTS}); "
            "more are refused with 503 and Retry-After", "app"),
    Setting("deadline_s", "DISTRINEWS_DEADLINE_S", "--deadline", float, 10.0, 0.001, 3600,
            "seconds a request may wait for its answer; later it gets 503, and if it had not reached the model "
            "yet, the model never sees it", "app"),
    # --- connections (uvicorn) ---
    Setting("limit_concurrency", "DISTRINEWS_LIMIT_CONCURRENCY", "--limit-concurrency", int, 512, 1, 1_000_000,
            "most open connections (and requests in progress); past it a request gets 503 and Retry-After and its "
            "connection is closed", "connection"),
    Setting("timeout_keep_alive", "DISTRINEWS_TIMEOUT_KEEP_ALIVE", "--timeout-keep-alive", int, 5, 1, 3600,
            "seconds an idle keep-alive connection stays open", "connection"),
    Setting("header_timeout", "DISTRINEWS_HEADER_TIMEOUT", "--header-timeout", float, 10.0, 0.1, 3600,
            "seconds a client has to send a request's line and headers (from connecting, or from the request's "
            "first byte); then 408 and the connection is closed", "connection"),
    Setting("body_timeout", "DISTRINEWS_BODY_TIMEOUT", "--body-timeout", float, 30.0, 0.1, 3600,
            "seconds a client has to send a request's body once its headers are in; then 408 and close", "connection"),
    Setting("max_header_bytes", "DISTRINEWS_MAX_HEADER_BYTES", "--max-header-bytes", int, 32 * 1024, 1024, 16 * 1024 * 1024,
            "largest request line plus headers, in bytes; larger gets 431", "connection"),
    Setting("max_headers", "DISTRINEWS_MAX_HEADERS", "--max-headers", int, 100, 4, 100_000,
            "most header lines in a request; more gets 431", "connection"),
]
BY_NAME = {s.name: s for s in SETTINGS}


def _parse(setting: Setting, raw, source: str):
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = setting.kind(raw.strip()) if isinstance(raw, str) else setting.kind(raw)
        if setting.kind is int and not isinstance(raw, str) and float(raw) != value:
            raise ValueError
    except (TypeError, ValueError):
        kind = "whole number" if setting.kind is int else "number"
        raise UserError(f"{source}={raw!r} is not a {kind}; {setting.help} "
                        f"(default {setting.default}).") from None
    if not setting.low <= value <= setting.high or value != value:  # value != value: NaN
        low, high = (f"{int(v):,}" if setting.kind is int else f"{v:g}" for v in (setting.low, setting.high))
        raise UserError(f"{source}={raw!r} is out of range: it must be between {low} and {high} ({setting.help}).")
    return value


def resolve(name: str, value=None, *, source: Optional[str] = None):
    """An explicit value wins (checked), else the environment variable (checked), else the default."""
    setting = BY_NAME[name]
    if value is not None:
        return _parse(setting, value, source or setting.flag)
    raw = os.environ.get(setting.env)
    if raw is None or raw.strip() == "":
        return setting.default
    return _parse(setting, raw, f"environment variable {setting.env}")


def resolve_all(group: Optional[str] = None, **explicit) -> dict:
    """{name: value} for every setting (or one group); explicit non-None values win over the environment."""
    return {s.name: resolve(s.name, explicit.get(s.name)) for s in SETTINGS if group in (None, s.group)}
