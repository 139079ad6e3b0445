"""Command line: python -m distrinews_lib.serving --checkpoint PATH [--host 127.0.0.1] [--port 8000] [limits]

The checkpoint is loaded, checked and made to classify two texts *before* uvicorn starts, so a missing,
empty, corrupt or inconsistent checkpoint, or one that loads but cannot classify (or answers NaN), ends
with one clear paragraph and exit code 2 instead of a half-started server.  So does a bad flag or
DISTRINEWS_* setting.

Limits (each flag's default comes from its environment variable, else the value shown; see app.py):

  --max-queue 128            most requests waiting for the model; more get 503 with Retry-After
  --max-queue-texts 512      most texts waiting for the model; more get 503 with Retry-After
  --deadline 10              seconds a request may wait for its answer, then 503 (dropped unseen if it
                             had not reached the model)
  --limit-concurrency 512    most open connections / requests in progress, then 503 with Retry-After
  --timeout-keep-alive 5     seconds an idle keep-alive connection stays open
  --header-timeout 10        seconds to send a request's line and headers, then 408 and close
  --body-timeout 30          seconds to send a request's body, then 408 and close
  --max-header-bytes 32768   largest request line + headers, else 431
  --max-headers 100          most header lines, else 431
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

from ..errors import USER_ERROR_EXIT, UserError, main_guard
from . import settings as serving_settings


def parse_args(argv=None) -> argparse.Namespace:
    from ..training.config import DEFAULT_CHECKPOINT
    from .app import ENV_CHECKPOINT

    p = argparse.ArgumentParser(
        prog="python -m distrinews_lib.serving",
        description="Serve a DistriNews checkpoint: GET /health, POST /predict, POST /predict/batch, docs at /docs.",
    )
    p.add_argument("--checkpoint", default=os.environ.get(ENV_CHECKPOINT) or str(DEFAULT_CHECKPOINT),
                   help=f"checkpoint file (default: ${ENV_CHECKPOINT} or {DEFAULT_CHECKPOINT})")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: $DISTRINEWS_DEVICE, else cuda if "
                                                  "available, else cpu)")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="threads per forward pass (default: all CPU cores but one, leaving one for the web "
                        "server; 0 keeps torch's own setting)")
    for s in serving_settings.SETTINGS:
        # Read as text and checked by settings.resolve, so a flag and its variable give the same message.
        p.add_argument(s.flag, dest=s.name, default=None, metavar="N",
                       help=f"{s.help} (default: ${s.env}, else {s.default})")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn log level (default info)")
    return p.parse_args(argv)


def log_config(level: str) -> dict:
    """uvicorn's logging setup, plus the app's own logger (distrinews.serving) on the same handler."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["distrinews"] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    return config


@main_guard
def main(argv=None) -> None:
    args = parse_args(argv)
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is not a TCP port (0..65535).")
    values = {s.name: serving_settings.resolve(s.name, getattr(args, s.name)) for s in serving_settings.SETTINGS}

    import uvicorn

    from ..training.precision import resolve_device
    from .app import create_app, resolve_batching
    from .inference import check_for_serving

    try:
        from .protocol import HttpProtocol
    except ImportError:  # uvicorn without httptools (not uvicorn[standard]): h11 with its header limit only
        HttpProtocol = None

    size, window = resolve_batching(values["max_batch_size"], values["batch_window_ms"])
    device = str(resolve_device(args.device or os.environ.get("DISTRINEWS_DEVICE")))
    # Missing, empty, corrupt, inconsistent, or answering NaN: CheckpointError -> one message, exit 2.
    loaded = check_for_serving(args.checkpoint, device)
    app = create_app(loaded=loaded, max_batch_size=size, batch_window_ms=window, torch_threads=args.torch_threads,
                     max_queue=values["max_queue"], max_queue_texts=values["max_queue_texts"],
                     deadline_s=values["deadline_s"], max_header_bytes=values["max_header_bytes"],
                     max_headers=values["max_headers"])
    connection = {s.name: values[s.name] for s in serving_settings.SETTINGS if s.group == "connection"}
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, log_config=log_config(args.log_level),
        http=HttpProtocol.configured(**connection) if HttpProtocol else "h11",
        limit_concurrency=connection["limit_concurrency"], timeout_keep_alive=connection["timeout_keep_alive"],
        h11_max_incomplete_event_size=connection["max_header_bytes"],
    )
    print(f"DistriNews: serving {args.checkpoint} on {device} at http://{args.host}:{args.port} "
          f"(API docs: http://{args.host}:{args.port}/docs)", file=sys.stderr, flush=True)
    if HttpProtocol is None:
        print("DistriNews: httptools is not installed (pip install 'uvicorn[standard]'), so the header and body "
              "timeouts are off; h11 still limits the header size.", file=sys.stderr, flush=True)
    server = uvicorn.Server(config)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        # The startup failed after the checks above (uvicorn has logged why): still a user's problem, so the
        # same exit code as any other refused start (plain uvicorn uses 3).
        sys.exit(USER_ERROR_EXIT)


if __name__ == "__main__":
    main()
