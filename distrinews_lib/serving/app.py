"""The classification API: FastAPI app that serves one DistriNews checkpoint.

    python -m distrinews_lib.serving --checkpoint path/to/model.pt      # the recommended way (all limits)
    uvicorn distrinews_lib.serving.app:app --port 8000                   # {checkpoint}
    DISTRINEWS_CHECKPOINT=path/to/model.pt uvicorn distrinews_lib.serving.app:app

Endpoints: GET (and HEAD) /health, POST /predict, POST /predict/batch, and the OpenAPI page at /docs,
which works offline (Swagger UI is served from this package, see static/README.md).
The model is loaded once, when the server starts (FastAPI lifespan), not when this module is
imported: importing it needs no checkpoint.  A checkpoint that cannot serve correctly (missing, empty,
corrupt, label names that do not match the model, a token window beyond its position table, NaN
weights, answers that are not finite probabilities) stops the startup with one paragraph:
`python -m distrinews_lib.serving` exits with code 2, plain uvicorn with its own code for a failed
startup, 3.

Overload is refused, not queued without end: requests wait for the model in a queue bounded in requests
and in texts; a request that does not fit gets 503 with Retry-After at once, one still unanswered at its
deadline gets 503, and work for a client that went away (or whose deadline passed) is dropped before it
reaches the model.  /health shows the queue and its counters.

Settings (settings.ServingSettings), read when the server starts (create_app's settings and the CLI's flags win
over the environment); this table is generated from settings.OPTIONS and settings.SETTINGS, where each default is
written once:

{settings}

The connection limits (limit_concurrency to max_headers) belong to the HTTP server: see protocol.py.
`python -m distrinews_lib.serving` applies all of them.  Plain uvicorn needs its own flags for the
connection limits:

    uvicorn distrinews_lib.serving.app:app --http distrinews_lib.serving.protocol:HttpProtocol \\
        --limit-concurrency {limit_concurrency} --timeout-keep-alive {timeout_keep_alive}

(--http ...:HttpProtocol brings the header/body timeouts, the header limits, JSON 503s with Retry-After at
the connection limit, and reads the DISTRINEWS_* connection variables above.)  Without it, uvicorn has no
header or body timeout; this app still answers 431 to requests over the header limits, but only after
uvicorn has read them whole.  With `--http h11`, add `--h11-max-incomplete-event-size {max_header_bytes}`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.middleware import Middleware

from .handlers import EXCEPTION_HANDLERS
from .lifespan import serving_lifespan
from .middleware import BodySizeLimit, ClientGoneLogging, HeaderLimits, StartupFailureMessage
from .rebuild import LoadedCheckpoint
from .routes import openapi_with_unique_ids, router
from .schemas import MAX_BATCH_TEXTS, MAX_BODY_BYTES, MAX_TEXT_CHARS
from .settings import ServingSettings, with_defaults

__doc__ = with_defaults(__doc__)  # the table and the defaults above, from the one list of them
STATIC_DIR = Path(__file__).resolve().parent / "static"


def create_app(settings: Optional[ServingSettings] = None, *, loaded: Optional[LoadedCheckpoint] = None) -> FastAPI:
    """Build the API.  Nothing is loaded here; the lifespan resolves `settings` (fields left None: the
    environment, else the defaults) and loads the model when the server starts.  `loaded`: a checkpoint
    already loaded and checked (the command line does that before starting uvicorn)."""

    app = FastAPI(
        title="DistriNews classifier",
        version="1.0",
        description=(
            "Classifies news texts into the AG News classes with a DistilBERT-style model trained with "
            "DDP in the DistriNews course.\n\n"
            f"Limits: each text 1 to {MAX_TEXT_CHARS:,} characters and not only whitespace (longer-than-window "
            f"texts are truncated to the model's token window); at most {MAX_BATCH_TEXTS} texts per "
            f"/predict/batch call; bodies up to {MAX_BODY_BYTES:,} bytes. Errors are JSON "
            '`{"detail": ..., "errors": [{"field", "message"}]}` with status 400 (bad JSON), '
            "413 (too large), 422 (invalid field), 431 (headers too large) or 503 (model not ready, or "
            "overloaded: retry after the `Retry-After` header's seconds).\n\n"
            "Concurrent /predict calls are grouped into one forward pass (micro-batching); every "
            "response still belongs to its own request. Requests wait in a bounded queue with a deadline; "
            "see `queue` in /health."
        ),
        lifespan=serving_lifespan(settings or ServingSettings(), loaded),
        # Outermost first; each does one thing (see middleware.py).
        middleware=[
            Middleware(StartupFailureMessage),
            Middleware(HeaderLimits),
            Middleware(ClientGoneLogging),
            Middleware(BodySizeLimit),
        ],
        exception_handlers=EXCEPTION_HANDLERS,
        docs_url=None,  # served below from local files: the default page loads Swagger UI from a CDN
        redoc_url=None,  # ReDoc would need a CDN too
    )
    app.state.classifier = None
    app.state.batcher = None
    app.state.settings = None  # resolved at startup
    app.state.status = "loading"
    app.mount("/docs/assets", StaticFiles(directory=STATIC_DIR), name="docs-assets")
    app.include_router(router)
    app.openapi = openapi_with_unique_ids(app)
    return app


# `uvicorn distrinews_lib.serving.app:app`: the settings are read from the environment when the server
# starts, so importing this module loads nothing.
app = create_app()
