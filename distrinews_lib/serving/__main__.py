"""Command line: python -m distrinews_lib.serving --checkpoint PATH [--host 127.0.0.1] [--port 8000]

The checkpoint is loaded and checked *before* uvicorn starts, so a missing or corrupt file ends
with one clear message and exit code 2 instead of a half-started server.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import UserError, main_guard


def parse_args(argv=None) -> argparse.Namespace:
    from .app import DEFAULT_BATCH_WINDOW_MS, DEFAULT_MAX_BATCH_SIZE, ENV_CHECKPOINT
    from ..checkpoint import DEFAULT_CHECKPOINT

    p = argparse.ArgumentParser(
        prog="python -m distrinews_lib.serving",
        description="Serve a DistriNews checkpoint: GET /health, POST /predict, POST /predict/batch, docs at /docs.",
    )
    p.add_argument("--checkpoint", default=os.environ.get(ENV_CHECKPOINT) or str(DEFAULT_CHECKPOINT),
                   help=f"checkpoint file (default: ${ENV_CHECKPOINT} or {DEFAULT_CHECKPOINT})")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument("--max-batch-size", type=int, default=None,
                   help=f"most concurrent requests per forward pass (default {DEFAULT_MAX_BATCH_SIZE}; 1 turns batching off)")
    p.add_argument("--batch-window-ms", type=float, default=None,
                   help=f"how long to wait for more requests to batch (default {DEFAULT_BATCH_WINDOW_MS} ms)")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="threads per forward pass (default: all CPU cores but one, leaving one for the web "
                        "server; 0 keeps torch's own setting)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn log level (default info)")
    return p.parse_args(argv)


@main_guard
def main(argv=None) -> None:
    args = parse_args(argv)
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port} is not a TCP port (0..65535).")

    import uvicorn

    from .app import create_app, load_for_serving, resolve_batching, resolve_device

    size, window = resolve_batching(args.max_batch_size, args.batch_window_ms)
    device = resolve_device(args.device)
    loaded = load_for_serving(args.checkpoint, device)  # CheckpointError -> one message, exit 2
    app = create_app(loaded=loaded, max_batch_size=size, batch_window_ms=window, torch_threads=args.torch_threads)
    print(f"DistriNews: serving {args.checkpoint} on {device} at http://{args.host}:{args.port} "
          f"(API docs: http://{args.host}:{args.port}/docs)", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
