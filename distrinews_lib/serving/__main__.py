"""Command line: python -m distrinews_lib.serving --checkpoint PATH [--host 127.0.0.1] [--port 8000] [limits]

In one pass, before uvicorn starts: the settings resolved (settings.py), the checkpoint read and its model rebuilt
(rebuild.py), then made ready (loading.py: made to classify, int8 if asked), so a missing, empty, corrupt or
inconsistent checkpoint, or one that loads but cannot classify (or answers NaN, or drifts in int8), ends with one clear
paragraph and exit code 2 instead of a half-started server.  So does a bad flag or DISTRINEWS_* setting.

Every limit is a flag whose default comes from its DISTRINEWS_* environment variable, else the value in
settings.py's table (`--help` lists them; app.py's docstring has the table).
"""

from __future__ import annotations

import argparse
import copy
import sys

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from ..checkpoint import DEFAULT_CHECKPOINT
from ..errors import USER_ERROR_EXIT, UserError, main_guard
from .app import create_app
from .loading import ready_to_serve
from .rebuild import load_for_serving
from .settings import ENV_CHECKPOINT, ENV_DEVICE, ENV_QUANTIZE, ENV_TORCH_THREADS, SETTINGS, ServingSettings

try:
    from .protocol import HttpProtocol
except ImportError:  # uvicorn without httptools (not uvicorn[standard]): h11 with its header limit only
    HttpProtocol = None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m distrinews_lib.serving",
        description="Serve a DistriNews checkpoint: GET /health, POST /predict, POST /predict/batch, docs at /docs.",
    )
    p.add_argument(
        "--checkpoint", default=None, help=f"checkpoint file (default: ${ENV_CHECKPOINT} or {DEFAULT_CHECKPOINT})"
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)",
    )
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument(
        "--device", default=None, help=f"cpu, cuda or cuda:N (default: ${ENV_DEVICE}, else cuda if available, else cpu)"
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help=f"threads per forward pass (default: ${ENV_TORCH_THREADS}, else all CPU cores but one, "
        "leaving one for the web server; 0 keeps torch's own setting)",
    )
    p.add_argument(
        "--quantize",
        default=None,
        metavar="{none,int8}",
        help=f"int8: the Linear layers in dynamic int8, on the CPU; refused at start-up for a model it does "
        f"not apply to (default: ${ENV_QUANTIZE}, else none)",
    )
    for s in SETTINGS:
        # Read as text and checked by ServingSettings.resolve, so a flag and its variable give the same message.
        p.add_argument(
            s.flag, dest=s.name, default=None, metavar="N", help=f"{s.help} (default: ${s.env}, else {s.default})"
        )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn log level (default info)",
    )
    return p.parse_args(argv)


def settings_from(args: argparse.Namespace) -> ServingSettings:
    """Flags win, then DISTRINEWS_* variables, then defaults: gathered and checked once, here."""
    return ServingSettings.resolve(
        checkpoint=args.checkpoint,
        device=args.device,
        torch_threads=args.torch_threads,
        quantize=args.quantize,
        **{s.name: getattr(args, s.name) for s in SETTINGS},
    )


def log_config(level: str) -> dict:
    """uvicorn's logging setup, plus the app's own logger (distrinews.serving) on the same handler."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["distrinews"] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    return config


@main_guard
def main(argv=None) -> None:
    args = parse_args(argv)
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is not a TCP port (0..65535).")
    logging_config = log_config(args.log_level)
    settings = settings_from(args)
    # In one pass, before uvicorn starts: the file read and its model rebuilt (missing, empty, corrupt, inconsistent),
    # then made ready (answering NaN, or moved too far by int8): a CheckpointError is one message and exit code 2.
    loaded = load_for_serving(settings.checkpoint, settings.device)
    loaded = ready_to_serve(loaded, settings.quantize)
    app = create_app(settings, loaded=loaded)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_config=logging_config,
        http=HttpProtocol.configured(settings) if HttpProtocol else "h11",
        limit_concurrency=settings.limit_concurrency,
        timeout_keep_alive=settings.timeout_keep_alive,
        h11_max_incomplete_event_size=settings.max_header_bytes,
    )
    print(
        f"DistriNews: serving {settings.checkpoint} on {settings.device} in {loaded.precision} "
        f"at http://{args.host}:{args.port} (API docs: http://{args.host}:{args.port}/docs)",
        file=sys.stderr,
        flush=True,
    )
    if HttpProtocol is None:
        print(
            "DistriNews: httptools is not installed (pip install 'uvicorn[standard]'), so the header and body "
            "timeouts are off; h11 still limits the header size.",
            file=sys.stderr,
            flush=True,
        )
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
