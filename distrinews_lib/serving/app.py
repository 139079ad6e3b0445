"""The classification API: FastAPI app that serves one DistriNews checkpoint.

    python -m distrinews_lib.serving --checkpoint path/to/model.pt      # the recommended way (all limits)
    uvicorn distrinews_lib.serving.app:app --port 8000                   # checkpoints/distilbert_agnews.pt
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

Settings, read when the server starts (create_app's arguments and the CLI's flags win over the environment):

  environment variable          CLI flag               default  meaning
  DISTRINEWS_CHECKPOINT         --checkpoint           checkpoints/distilbert_agnews.pt
  DISTRINEWS_DEVICE             --device               cuda if available, else cpu
  DISTRINEWS_MAX_BATCH_SIZE     --max-batch-size       32       most /predict requests per forward pass
  DISTRINEWS_BATCH_WINDOW_MS    --batch-window-ms      2        longest wait for more requests to batch
  DISTRINEWS_BATCHING=off                                       one forward pass per request (the benchmark's baseline)
  DISTRINEWS_TORCH_THREADS      --torch-threads        all CPU cores but one
  DISTRINEWS_MAX_QUEUE          --max-queue            128      most requests waiting for the model
  DISTRINEWS_MAX_QUEUE_TEXTS    --max-queue-texts      512      most texts waiting for the model (>= 64)
  DISTRINEWS_DEADLINE_S         --deadline             10       seconds a request may wait for its answer

Connection limits (the HTTP server's; see protocol.py):

  DISTRINEWS_LIMIT_CONCURRENCY  --limit-concurrency    512      most open connections / requests in progress
  DISTRINEWS_TIMEOUT_KEEP_ALIVE --timeout-keep-alive   5        seconds an idle keep-alive connection stays open
  DISTRINEWS_HEADER_TIMEOUT     --header-timeout       10       seconds to send a request's line and headers (408)
  DISTRINEWS_BODY_TIMEOUT       --body-timeout         30       seconds to send a request's body (408)
  DISTRINEWS_MAX_HEADER_BYTES   --max-header-bytes     32768    largest request line + headers (431)
  DISTRINEWS_MAX_HEADERS        --max-headers          100      most header lines (431)

`python -m distrinews_lib.serving` applies all of them.  Plain uvicorn needs its own flags for the
connection limits:

    uvicorn distrinews_lib.serving.app:app --http distrinews_lib.serving.protocol:HttpProtocol \\
        --limit-concurrency 512 --timeout-keep-alive 5

(--http ...:HttpProtocol brings the header/body timeouts, the header limits, JSON 503s with Retry-After at
the connection limit, and reads the DISTRINEWS_* connection variables above.)  Without it, uvicorn has no
header or body timeout; this app still answers 431 to requests over the header limits, but only after
uvicorn has read them whole.  With `--http h11`, add `--h11-max-incomplete-event-size 32768`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import warnings
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Optional

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import UserError
from ..training.config import DEFAULT_CHECKPOINT
from ..training.precision import resolve_device
from . import settings as serving_settings
from .batching import BatcherStopped, ClientGone, DeadlineExceeded, MicroBatcher, Overloaded, ThrottledLog
from .inference import Classifier, LoadedCheckpoint, check_predictions, load_for_serving
from .schemas import (
    MAX_BATCH_TEXTS,
    MAX_BODY_BYTES,
    MAX_TEXT_CHARS,
    BatchingInfo,
    BatchPredictRequest,
    BatchPredictResponse,
    CheckpointInfo,
    ErrorResponse,
    HealthResponse,
    Prediction,
    PredictRequest,
    QueueInfo,
)

log = logging.getLogger("distrinews.serving")
throttled = ThrottledLog(log)
STATIC_DIR = Path(__file__).resolve().parent / "static"

# Defaults chosen on the tiny CPU model (see benchmarks/serving.json): collection stops as soon as no
# other request is being read, so a lone request never waits and 2 ms only caps a busy moment;
# 32 texts per pass already get most of the batching gain.
DEFAULT_MAX_BATCH_SIZE = serving_settings.BY_NAME["max_batch_size"].default
DEFAULT_BATCH_WINDOW_MS = serving_settings.BY_NAME["batch_window_ms"].default
ENV_CHECKPOINT = "DISTRINEWS_CHECKPOINT"


# ----------------------------------------------------------------------------- settings & model


def _env_number(name: str, kind, default):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise UserError(f"environment variable {name}={raw!r} is not a valid {kind.__name__}.") from None


def resolve_batching(max_batch_size: Optional[int], batch_window_ms: Optional[float]) -> tuple[int, float]:
    """Explicit arguments win; else DISTRINEWS_MAX_BATCH_SIZE / DISTRINEWS_BATCH_WINDOW_MS;
    DISTRINEWS_BATCHING=off serves each request alone (the unbatched baseline)."""
    if max_batch_size is None and os.environ.get("DISTRINEWS_BATCHING", "").strip().lower() in ("off", "0", "false", "no"):
        max_batch_size = 1
    size = serving_settings.resolve("max_batch_size", max_batch_size, source="the maximum batch size")
    window = serving_settings.resolve("batch_window_ms", batch_window_ms, source="the batch window (ms)")
    if size == 1:
        window = 0.0  # nothing to wait for: every request runs alone
    return int(size), float(window)


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use (containers, taskset)
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def resolve_torch_threads(threads: Optional[int], device: str) -> Optional[int]:
    """How many threads torch may use for one forward pass; None leaves torch's own setting.

    On CPU the default is one core fewer than available: the event loop needs a core to read
    requests and write responses while the model runs, and a small model gains little from the
    last core anyway.  OMP_NUM_THREADS, when set, is respected.
    """
    if threads is None:
        threads = _env_number("DISTRINEWS_TORCH_THREADS", int, None)
    if threads is not None:
        if threads < 0:
            raise UserError(f"the number of torch threads must be 0 (leave torch's setting) or more (got {threads}).")
        return threads or None
    if device != "cpu" or os.environ.get("OMP_NUM_THREADS"):
        return None
    return max(1, usable_cpus() - 1)


# ----------------------------------------------------------------------------- errors


def _field_name(loc) -> str:
    """('body', 'texts', 3) -> 'texts[3]'; ('body',) -> 'body'."""
    parts = [p for p in loc if p != "body"] if len(loc) > 1 else list(loc)
    name = ""
    for part in parts:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or "body"


def _message(err: dict) -> tuple[str, str]:
    """A readable (field, message) for one pydantic / FastAPI error."""
    kind, loc, ctx = err.get("type", ""), tuple(err.get("loc", ())), err.get("ctx") or {}
    field = _field_name(loc)
    if kind == "json_invalid":
        pos = loc[1] if len(loc) > 1 else "?"
        return "body", f"the request body is not valid JSON ({ctx.get('error', 'decode error')} at character {pos})"
    if field == "body":
        if kind == "missing":
            return "body", "the request body is missing; send JSON such as {\"text\": \"...\"}"
        # Not a JSON object: a list, a string, or a body sent without Content-Type: application/json.
        return "body", ("the request body must be a JSON object such as {\"text\": \"...\"}, "
                        "sent with Content-Type: application/json")
    if kind == "missing":
        return field, "is required"
    if kind in ("string_type", "string_strict_type"):
        return field, "must be a string"
    if kind in ("list_type",):
        return field, "must be a list of strings"
    if kind == "string_unicode":
        return field, "contains invalid Unicode (a lone surrogate such as \\ud800)"
    if kind == "string_too_short":
        return field, "must not be empty"
    if kind == "string_too_long":
        return field, f"is longer than the limit of {MAX_TEXT_CHARS:,} characters"
    if kind == "too_short":
        return field, "must contain at least one text"
    if kind == "too_long":
        return field, f"has more than the limit of {MAX_BATCH_TEXTS} texts; split it into several calls"
    msg = str(err.get("msg", "is invalid"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if field == "texts" and msg.startswith("texts["):  # the batch validator names the position itself
        field, _, msg = msg.partition(" ")
    return field, msg


def error_response(status: int, detail: str, errors: list | None = None, headers: dict | None = None) -> JSONResponse:
    body = ErrorResponse(detail=detail, errors=errors or [])
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    # Never echo the input back: it may be huge, or hold text that cannot be encoded as JSON.
    pairs = [_message(e) for e in exc.errors()]
    errors = [{"field": f, "message": m} for f, m in pairs]
    detail = "; ".join(f"{f}: {m}" if f != "body" else m for f, m in pairs[:5]) or "invalid request"
    invalid_json = any(e.get("type") == "json_invalid" for e in exc.errors())
    return error_response(400 if invalid_json else 422, detail, errors)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail = str(exc.detail)
    if exc.status_code == 400 and detail == "There was an error parsing the body":
        # FastAPI's words for a body json.loads cannot even start on: say what is usually wrong.
        detail = "the request body could not be parsed as JSON (it is not valid UTF-8, or it is nested too deeply)"
        return error_response(400, detail, [{"field": "body", "message": detail}])
    return error_response(exc.status_code, detail, headers=getattr(exc, "headers", None))


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    # A bug on our side, not the client's: log it in full, answer with one line (still a 500, so
    # tests and monitoring see it).
    log.exception("unexpected error while serving %s %s", request.method, request.url.path)
    return error_response(500, f"internal server error ({type(exc).__name__}); see the server log")


class _ClientGone(Exception):
    """Writing the response failed: the client's connection is already closed."""


class GuardMiddleware:
    """Plain ASGI middleware for what FastAPI's handlers come too late for.

    * Bodies over MAX_BODY_BYTES get a 413 before anything parses them.
    * Requests over the header limits get a 431 (a backstop for plain uvicorn: protocol.HttpProtocol
      refuses them earlier, while they are still being received).
    * A response that cannot be written because the client has gone is one log line, not two
      tracebacks (uvicorn with uvloop raises when writing to a socket it has just closed).
    * If the model cannot be loaded at startup, uvicorn would log the whole traceback; a UserError
      (missing/corrupt checkpoint, bad device or setting) is reported as its one-paragraph message instead.
    """

    def __init__(self, app, max_body_bytes: int = MAX_BODY_BYTES, max_header_bytes: Optional[int] = None,
                 max_headers: Optional[int] = None):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self._explicit = {"max_header_bytes": max_header_bytes, "max_headers": max_headers}
        self.max_header_bytes: Optional[int] = None  # resolved at startup (explicit, else the environment)
        self.max_headers: Optional[int] = None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self._lifespan(scope, receive, send)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = scope.get("headers") or []
        if self.max_headers is not None and (
                len(headers) > self.max_headers
                or sum(len(k) + len(v) + 4 for k, v in headers) + len(scope.get("raw_path") or b"") > self.max_header_bytes):
            throttled("431", logging.WARNING, "refused a request over the header limits (431)")
            response = error_response(431, f"the request has more than {self.max_headers} header lines or "
                                           f"{self.max_header_bytes:,} bytes of request line and headers")
            return await response(scope, receive, send)
        try:
            return await self._guarded(scope, receive, send, headers)
        except _ClientGone as gone:
            throttled("gone", logging.INFO, "client %s went away before its response to %s %s was sent (%s)",
                      "%s:%s" % tuple(scope.get("client") or ("?", "?")), scope.get("method"), scope.get("path"),
                      gone)
            # Let the server see the closed connection before this request ends, so it does not also
            # report a response that was never completed.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(receive(), 1.0)

    async def _guarded(self, scope, receive, send, headers):
        async def guarded_send(message):
            try:
                await send(message)
            except Exception as err:
                raise _ClientGone(f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:100]}") from None

        length = dict(headers).get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.max_body_bytes
            except ValueError:
                too_big = False  # the HTTP server itself rejects a malformed Content-Length
            if too_big:
                return await self._too_large(scope, receive, guarded_send)
            return await self.app(scope, receive, guarded_send)
        # No Content-Length (chunked upload): read it here, up to the limit, then replay it.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay([message]), guarded_send)
            chunks.append(message)
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
            if size > self.max_body_bytes:
                return await self._too_large(scope, receive, guarded_send)
        return await self.app(scope, _replay(chunks, receive), guarded_send)

    async def _too_large(self, scope, receive, send):
        response = error_response(413, f"the request body is larger than the limit of {self.max_body_bytes:,} bytes "
                                       f"(at most {MAX_BATCH_TEXTS} texts of {MAX_TEXT_CHARS:,} characters)")
        await response(scope, receive, send)

    async def _lifespan(self, scope, receive, send):
        held = []

        async def hold_failure(message):
            # Starlette sends "startup.failed" with the traceback text, then re-raises: keep the
            # message until we know whether the error is a UserError with a better text.
            if message["type"] == "lifespan.startup.failed":
                held.append(message)
                return
            if message["type"] == "lifespan.startup.complete":
                self.max_header_bytes = serving_settings.resolve("max_header_bytes", self._explicit["max_header_bytes"])
                self.max_headers = serving_settings.resolve("max_headers", self._explicit["max_headers"])
            await send(message)

        try:
            await self.app(scope, receive, hold_failure)
        except UserError as err:
            text = "DistriNews server cannot start: " + " ".join(str(err).split())
            await send({"type": "lifespan.startup.failed", "message": text})
            raise
        except BaseException:
            for message in held:
                await send(message)
            raise
        for message in held:
            await send(message)


def _replay(messages, receive=None):
    pending = list(messages)

    async def replay():
        if pending:
            return pending.pop(0)
        if receive is None:
            return {"type": "http.disconnect"}
        return await receive()

    return replay


async def _cancel_when_gone(receive, batcher: MicroBatcher, job) -> None:
    """Drop the job when its client goes. The body has been read, so the server's next message is the
    disconnect (uvicorn sends it as soon as the connection is lost; the command line's protocol as soon as
    the client closes its side)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            batcher.cancel(job, "abandoned")
            return


# ----------------------------------------------------------------------------- the app

RETRY_AFTER_HEADER = {"Retry-After": {"description": "Whole seconds worth waiting before trying again.",
                                      "schema": {"type": "integer"}}}
ERRORS = {
    400: {"model": ErrorResponse, "description": "The body is not valid JSON."},
    413: {"model": ErrorResponse, "description": f"The body is larger than {MAX_BODY_BYTES:,} bytes."},
    422: {"model": ErrorResponse, "description": "A field is missing, of the wrong type, empty, or over its limit."},
    503: {"model": ErrorResponse, "headers": RETRY_AFTER_HEADER,
          "description": "The model is not loaded yet (starting) or any more (stopping), or the server is "
                         "overloaded: its queue is full, or the request was not answered within its deadline."},
}


def create_app(checkpoint_path=None, device: Optional[str] = None, max_batch_size: Optional[int] = None,
               batch_window_ms: Optional[float] = None, loaded: Optional[LoadedCheckpoint] = None,
               torch_threads: Optional[int] = None, max_queue: Optional[int] = None,
               max_queue_texts: Optional[int] = None, deadline_s: Optional[float] = None,
               max_header_bytes: Optional[int] = None, max_headers: Optional[int] = None) -> FastAPI:
    """Build the API.  Nothing is loaded here; the lifespan loads the model when the server starts.

    checkpoint_path  None: $DISTRINEWS_CHECKPOINT, else checkpoints/distilbert_agnews.pt (read at startup)
    device           None/"auto": cuda if available, else cpu
    max_batch_size   how many single-text requests may share one forward pass (1 = no batching)
    batch_window_ms  how long to wait for more requests once one has arrived
    loaded           an already loaded checkpoint (the CLI checks and loads it before starting uvicorn)
    torch_threads    threads per forward pass; None: $DISTRINEWS_TORCH_THREADS, else all cores but one on
                     CPU; 0: leave torch's setting.  Restored when the server stops.
    max_queue, max_queue_texts, deadline_s
                     the queue's bounds and the per-request deadline (None: the environment, else the
                     defaults in settings.py)
    max_header_bytes, max_headers
                     the header limits this app itself enforces (431), for servers whose protocol does not
                     (None: the environment, else the defaults)
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state = app.state
        size, window = resolve_batching(max_batch_size, batch_window_ms)
        queue = serving_settings.resolve_all("app", max_queue=max_queue, max_queue_texts=max_queue_texts,
                                             deadline_s=deadline_s)
        if loaded is not None:
            dev = str(next(loaded.model.parameters()).device)
            ckpt = loaded
        else:
            path = Path(checkpoint_path or os.environ.get(ENV_CHECKPOINT) or DEFAULT_CHECKPOINT)
            dev = str(resolve_device(device or os.environ.get("DISTRINEWS_DEVICE")))
            log.info("loading checkpoint %s on %s", path, dev)
            ckpt = await asyncio.to_thread(load_for_serving, path, dev)
        threads = resolve_torch_threads(torch_threads, dev)
        previous_threads = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            # Warm-up: the first client does not pay for lazy initialisation, and a checkpoint that loads
            # but cannot classify, or answers NaN, is refused now rather than on every request.
            await asyncio.to_thread(check_predictions, ckpt)
            classifier = Classifier(ckpt, dev)
            batcher = MicroBatcher(classifier.predict, max_batch_size=size, window_ms=window,
                                   max_queue=queue["max_queue"], max_queue_texts=queue["max_queue_texts"],
                                   deadline_s=queue["deadline_s"])
            await batcher.start()
        except BaseException:
            torch.set_num_threads(previous_threads)
            raise
        try:
            # torch and transformers leave millions of long-lived objects; freezing them keeps each full
            # garbage collection from walking them all (pauses of several hundred ms under load otherwise).
            gc.collect()
            gc.freeze()
            state.classifier, state.batcher, state.status = classifier, batcher, "ok"
            log.info("serving %s (labels %s) on %s (%d torch threads), max batch %d, window %.1f ms, queue %d requests / "
                     "%d texts, deadline %g s", Path(ckpt.path).name, ", ".join(classifier.labels), dev,
                     torch.get_num_threads(), size, window, batcher.max_queue, batcher.max_queue_texts,
                     batcher.deadline_s)
            yield
        finally:
            state.status = "stopping"
            await batcher.stop()
            torch.set_num_threads(previous_threads)

    app = FastAPI(
        title="DistriNews classifier",
        version="1.0",
        description=(
            "Classifies news texts into the AG News classes with a DistilBERT-style model trained with "
            "DDP in the DistriNews course.\n\n"
            f"Limits: each text 1 to {MAX_TEXT_CHARS:,} characters and not only whitespace (longer-than-window "
            f"texts are truncated to the model's token window); at most {MAX_BATCH_TEXTS} texts per "
            f"/predict/batch call; bodies up to {MAX_BODY_BYTES:,} bytes. Errors are JSON "
            "`{\"detail\": ..., \"errors\": [{\"field\", \"message\"}]}` with status 400 (bad JSON), "
            "413 (too large), 422 (invalid field), 431 (headers too large) or 503 (model not ready, or "
            "overloaded: retry after the `Retry-After` header's seconds).\n\n"
            "Concurrent /predict calls are grouped into one forward pass (micro-batching); every "
            "response still belongs to its own request. Requests wait in a bounded queue with a deadline; "
            "see `queue` in /health."
        ),
        lifespan=lifespan,
        docs_url=None,   # served below from local files: the default page loads Swagger UI from a CDN
        redoc_url=None,  # ReDoc would need a CDN too
    )
    app.state.classifier = None
    app.state.batcher = None
    app.state.status = "loading"
    app.add_middleware(GuardMiddleware, max_header_bytes=max_header_bytes, max_headers=max_headers)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
    app.mount("/docs/assets", StaticFiles(directory=STATIC_DIR), name="docs-assets")

    def serving_batcher(request: Request) -> Optional[MicroBatcher]:
        """The running batcher, or None while the model is not loaded (starting) or any more (stopping)."""
        st = request.app.state
        return st.batcher if st.status == "ok" and st.batcher is not None and st.batcher.running else None

    def not_ready(why: str = "the model is not loaded yet (or the server is stopping)") -> JSONResponse:
        return error_response(503, f"{why}; retry shortly", headers={"Retry-After": "1"})

    def too_late(batcher: MicroBatcher) -> JSONResponse:
        wait = batcher.retry_after()
        throttled("deadline", logging.WARNING, "answered 503: a request was not answered within its deadline of %g s",
                  batcher.deadline_s)
        return error_response(503, f"the server is overloaded: the request was not answered within its deadline of "
                                   f"{batcher.deadline_s:g} s; retry after {wait} s", headers={"Retry-After": str(wait)})

    async def classify(request: Request, texts: list[str], single: bool):
        """Queue the texts for the model and wait for their results, the deadline, or the client leaving."""
        batcher = serving_batcher(request)
        if batcher is None:
            return not_ready()
        try:
            job = batcher.enqueue(texts, single=single)
        except Overloaded as err:
            throttled("shed", logging.WARNING, "answered 503 with Retry-After %d: %s", err.retry_after, err)
            return error_response(503, f"{err}; retry after {err.retry_after} s",
                                  headers={"Retry-After": str(err.retry_after)})
        except BatcherStopped as err:
            return not_ready(str(err))
        loop = asyncio.get_running_loop()
        # The client may leave while it waits: then the job is dropped (if it has not reached the model yet).
        watcher = loop.create_task(_cancel_when_gone(request.receive, batcher, job))
        timer = loop.call_later(max(0.0, job.deadline - loop.time()), batcher.cancel, job, "expired")
        try:
            return await job.future
        except DeadlineExceeded:
            return too_late(batcher)
        except ClientGone:
            return Response(status_code=499)  # nobody to answer (nginx's "client closed request")
        except BatcherStopped as err:
            return not_ready(str(err))
        except asyncio.CancelledError:  # the handler itself was cancelled: the answer is not wanted
            batcher.cancel(job, "abandoned")
            raise
        finally:
            timer.cancel()
            watcher.cancel()

    @app.get("/", include_in_schema=False)
    async def root():
        return RedirectResponse("/docs")

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request):
        root_path = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root_path + app.openapi_url, title=app.title + " - API docs",
            swagger_js_url=root_path + "/docs/assets/swagger-ui-bundle.js",
            swagger_css_url=root_path + "/docs/assets/swagger-ui.css",
            swagger_favicon_url=root_path + "/docs/assets/favicon-32x32.png",
            # No validator badge: it would send the schema to validator.swagger.io.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.api_route("/health", methods=["GET", "HEAD"], response_model=HealthResponse,
                   responses={503: {"model": HealthResponse}},
                   summary="Is the model loaded? Which checkpoint, device and labels? How full is the queue?")
    async def health(request: Request):
        st = request.app.state
        clf: Optional[Classifier] = st.classifier
        batcher: Optional[MicroBatcher] = st.batcher
        ok = st.status == "ok" and batcher is not None and batcher.running
        body = HealthResponse(
            status="ok" if ok else st.status,
            model_loaded=clf is not None and ok,
            device=clf.device if clf else None,
            labels=clf.labels if clf else [],
            checkpoint=clf.info() if clf else CheckpointInfo(),
            batching=BatchingInfo(
                max_batch_size=batcher.max_batch_size, batch_window_ms=batcher.window_s * 1000,
                torch_threads=torch.get_num_threads(), batches_run=batcher.batches_run,
                mean_batch_size=round(batcher.texts_run / batcher.batches_run, 2) if batcher.batches_run else None,
                texts_run=batcher.texts_run, batch_calls_run=batcher.batch_calls_run,
            ) if batcher else None,
            queue=QueueInfo(
                max_requests=batcher.max_queue, max_texts=batcher.max_queue_texts, deadline_s=batcher.deadline_s,
                waiting_requests=batcher.waiting_jobs, waiting_texts=batcher.waiting_texts, shed=batcher.shed,
                expired=batcher.expired, abandoned=batcher.abandoned, texts_dropped=batcher.texts_dropped,
                texts_unused=batcher.texts_unused,
            ) if batcher else None,
        )
        return JSONResponse(body.model_dump(), status_code=200 if ok else 503)

    @app.post("/predict", response_model=Prediction, responses=ERRORS, summary="Classify one text")
    async def predict(body: PredictRequest, request: Request):
        result = await classify(request, [body.text], single=True)
        return result[0] if isinstance(result, list) else result

    @app.post("/predict/batch", response_model=BatchPredictResponse, responses=ERRORS,
              summary=f"Classify 1 to {MAX_BATCH_TEXTS} texts; results[i] belongs to texts[i]")
    async def predict_batch(body: BatchPredictRequest, request: Request):
        result = await classify(request, body.texts, single=False)  # already a batch: one forward pass
        return {"results": result} if isinstance(result, list) else result

    def openapi() -> dict:
        # One route answers GET and HEAD /health (so a 405 lists both in Allow); FastAPI would give both
        # operations the same operationId, which OpenAPI forbids.
        if app.openapi_schema is None:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Duplicate Operation ID")
                spec = FastAPI.openapi(app)
            for method, operation in spec["paths"].get("/health", {}).items():
                operation["operationId"] = f"health_{method}"
        return app.openapi_schema

    app.openapi = openapi
    return app


# `uvicorn distrinews_lib.serving.app:app`: the checkpoint path is read from the environment
# when the server starts, so importing this module loads nothing.
app = create_app()
