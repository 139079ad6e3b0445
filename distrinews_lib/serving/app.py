"""The classification API: FastAPI app that serves one DistriNews checkpoint.

    uvicorn distrinews_lib.serving.app:app --port 8000        # checkpoints/distilbert_agnews.pt
    DISTRINEWS_CHECKPOINT=path/to/model.pt uvicorn distrinews_lib.serving.app:app
    python -m distrinews_lib.serving --checkpoint path/to/model.pt

Endpoints: GET /health, POST /predict, POST /predict/batch, and the OpenAPI page at /docs.
The model is loaded once, when the server starts (FastAPI lifespan), not when this module is
imported: importing it needs no checkpoint.

Settings for plain `uvicorn ...:app`, read at startup (create_app's arguments and the CLI's flags win):
  DISTRINEWS_CHECKPOINT        checkpoint file (default checkpoints/distilbert_agnews.pt)
  DISTRINEWS_DEVICE            cpu, cuda, cuda:N (default: cuda if available)
  DISTRINEWS_MAX_BATCH_SIZE    most requests per forward pass (default 32)
  DISTRINEWS_BATCH_WINDOW_MS   longest wait for more requests (default 2)
  DISTRINEWS_BATCHING=off      one forward pass per request (the benchmark's baseline)
  DISTRINEWS_TORCH_THREADS     torch threads (default: all CPU cores but one)
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Optional

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..checkpoint import DEFAULT_CHECKPOINT, CheckpointError, LoadedCheckpoint, load_checkpoint, predict_proba
from ..errors import UserError
from .batching import BatcherStopped, MicroBatcher
from .schemas import (
    MAX_BATCH_TEXTS, MAX_BODY_BYTES, MAX_TEXT_CHARS, BatchingInfo, BatchPredictRequest, BatchPredictResponse,
    CheckpointInfo, ErrorResponse, HealthResponse, Prediction, PredictRequest,
)

log = logging.getLogger("distrinews.serving")

# Defaults chosen on the tiny CPU model (see benchmarks/serving.json): collection stops as soon as no
# other request is being read, so a lone request never waits and 2 ms only caps a busy moment;
# 32 texts per pass already get most of the batching gain.
DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_BATCH_WINDOW_MS = 2.0
ENV_CHECKPOINT = "DISTRINEWS_CHECKPOINT"


# ----------------------------------------------------------------------------- settings & model


def resolve_device(device: Optional[str]) -> str:
    """'cuda' when there is a GPU and no device was asked for, else 'cpu'; a bad name is a UserError."""
    if not device or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UserError(f"device '{device}' is not a valid torch device; use cpu, cuda or cuda:N.") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device '{device}' was asked for, but this machine has no usable CUDA GPU; use --device cpu.")
    return str(dev)


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
    if max_batch_size is None:
        if os.environ.get("DISTRINEWS_BATCHING", "").strip().lower() in ("off", "0", "false", "no"):
            max_batch_size = 1
        else:
            max_batch_size = _env_number("DISTRINEWS_MAX_BATCH_SIZE", int, DEFAULT_MAX_BATCH_SIZE)
    if batch_window_ms is None:
        batch_window_ms = _env_number("DISTRINEWS_BATCH_WINDOW_MS", float, DEFAULT_BATCH_WINDOW_MS)
    if max_batch_size < 1:
        raise UserError(f"the maximum batch size must be at least 1 (got {max_batch_size}).")
    if not 0 <= batch_window_ms <= 1000:
        raise UserError(f"the batch window must be between 0 and 1000 ms (got {batch_window_ms}).")
    if max_batch_size == 1:
        batch_window_ms = 0.0  # nothing to wait for: every request runs alone
    return int(max_batch_size), float(batch_window_ms)


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


def load_for_serving(path, device: str) -> LoadedCheckpoint:
    """load_checkpoint, with any failure turned into a CheckpointError that names the path."""
    try:
        return load_checkpoint(path, device=device)
    except CheckpointError as err:
        if Path(path).is_absolute():
            raise
        # A relative path is read from the working directory; say which one, it is a common surprise.
        raise CheckpointError(f"{err} (Relative paths are read from the working directory {Path.cwd()}.)") from None
    except UserError:
        raise
    except Exception as err:  # e.g. a damaged tokenizer folder: transformers raises its own errors
        first = (str(err).splitlines() or [""])[0][:200]
        raise CheckpointError(f"checkpoint {path} could not be loaded ({type(err).__name__}: {first}).") from None


class Classifier:
    """The loaded checkpoint plus the one function the batcher calls: texts -> list of Prediction dicts."""

    def __init__(self, loaded: LoadedCheckpoint, device: str):
        self.loaded = loaded
        self.device = device
        self.labels = list(loaded.label_names)

    def predict(self, texts: list[str]) -> list[dict]:
        # predict_proba is the checkpoint's own prediction function (same tokenization, truncation to
        # max_length, softmax), so the API answers exactly what a notebook would compute.
        with torch.inference_mode():
            probs = predict_proba(self.loaded, texts, batch_size=max(len(texts), 1))
        best = probs.argmax(dim=-1).tolist()
        results = []
        for row, i in zip(probs.tolist(), best):
            results.append({"label": self.labels[i], "confidence": row[i],
                            "all_probabilities": dict(zip(self.labels, row))})
        return results

    def info(self) -> CheckpointInfo:
        meta = self.loaded.metadata or {}

        def pick(key, kind):
            value = meta.get(key)
            try:
                return kind(value) if value is not None else None
            except (TypeError, ValueError):
                return None

        return CheckpointInfo(
            path=str(self.loaded.path), data_source=pick("data_source", str), final_accuracy=pick("final_accuracy", float),
            world_size=pick("world_size", int), preset=pick("preset", str), model=pick("model", str),
            created=pick("created", str), max_length=self.loaded.max_length,
            versions=meta.get("versions") if isinstance(meta.get("versions"), dict) else None,
        )


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


class GuardMiddleware:
    """Plain ASGI middleware for two things FastAPI's handlers come too late for.

    * Bodies over MAX_BODY_BYTES get a 413 before anything parses them.
    * If the model cannot be loaded at startup, uvicorn would log the whole traceback; a UserError
      (missing/corrupt checkpoint, bad device) is reported as its one-paragraph message instead.
    """

    def __init__(self, app, max_body_bytes: int = MAX_BODY_BYTES):
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self._lifespan(scope, receive, send)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.max_body_bytes
            except ValueError:
                too_big = False  # the HTTP server itself rejects a malformed Content-Length
            if too_big:
                return await self._too_large(scope, receive, send)
            return await self.app(scope, receive, send)
        # No Content-Length (chunked upload): read it here, up to the limit, then replay it.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay([message]), send)
            chunks.append(message)
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
            if size > self.max_body_bytes:
                return await self._too_large(scope, receive, send)
        return await self.app(scope, _replay(chunks, receive), send)

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


# ----------------------------------------------------------------------------- the app

ERRORS = {
    400: {"model": ErrorResponse, "description": "The body is not valid JSON."},
    413: {"model": ErrorResponse, "description": f"The body is larger than {MAX_BODY_BYTES:,} bytes."},
    422: {"model": ErrorResponse, "description": "A field is missing, of the wrong type, empty, or over its limit."},
    503: {"model": ErrorResponse, "description": "The model is not loaded yet (starting) or any more (stopping)."},
}


def create_app(checkpoint_path=None, device: Optional[str] = None, max_batch_size: Optional[int] = None,
               batch_window_ms: Optional[float] = None, loaded: Optional[LoadedCheckpoint] = None,
               torch_threads: Optional[int] = None) -> FastAPI:
    """Build the API.  Nothing is loaded here; the lifespan loads the model when the server starts.

    checkpoint_path  None: $DISTRINEWS_CHECKPOINT, else checkpoints/distilbert_agnews.pt (read at startup)
    device           None/"auto": cuda if available, else cpu
    max_batch_size   how many single-text requests may share one forward pass (1 = no batching)
    batch_window_ms  how long to wait for more requests once one has arrived
    loaded           an already loaded checkpoint (the CLI checks and loads it before starting uvicorn)
    torch_threads    threads per forward pass; None: $DISTRINEWS_TORCH_THREADS, else all cores but one on
                     CPU; 0: leave torch's setting.  Restored when the server stops.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state = app.state
        size, window = resolve_batching(max_batch_size, batch_window_ms)
        if loaded is not None:
            dev = str(next(loaded.model.parameters()).device)
            ckpt = loaded
        else:
            path = Path(checkpoint_path or os.environ.get(ENV_CHECKPOINT) or DEFAULT_CHECKPOINT)
            dev = resolve_device(device or os.environ.get("DISTRINEWS_DEVICE"))
            log.info("loading checkpoint %s on %s", path, dev)
            ckpt = await asyncio.to_thread(load_for_serving, path, dev)
        threads = resolve_torch_threads(torch_threads, dev)
        previous_threads = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        classifier = Classifier(ckpt, dev)
        batcher = MicroBatcher(classifier.predict, max_batch_size=size, window_ms=window)
        await batcher.start()
        try:
            try:
                # One warm-up pass: the first client does not pay for lazy initialisation, and a
                # checkpoint that loads but cannot run is refused now rather than on every request.
                await batcher.run_now(["warm up"])
            except Exception as err:
                raise CheckpointError(f"checkpoint {ckpt.path} loaded but could not classify a text "
                                      f"({type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}).") from None
            # torch and transformers leave millions of long-lived objects; freezing them keeps each full
            # garbage collection from walking them all (pauses of several hundred ms under load otherwise).
            gc.collect()
            gc.freeze()
            state.classifier, state.batcher, state.status = classifier, batcher, "ok"
            log.info("serving %s (labels %s) on %s (%d torch threads), max batch %d, window %.1f ms",
                     ckpt.path, ", ".join(classifier.labels), dev, torch.get_num_threads(), size, window)
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
            "413 (too large), 422 (invalid field) or 503 (model not ready).\n\n"
            "Concurrent /predict calls are grouped into one forward pass (micro-batching); every "
            "response still belongs to its own request."
        ),
        lifespan=lifespan,
    )
    app.state.classifier = None
    app.state.batcher = None
    app.state.status = "loading"
    app.add_middleware(GuardMiddleware)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)

    def serving_batcher(request: Request) -> Optional[MicroBatcher]:
        """The running batcher, or None while the model is not loaded (starting) or any more (stopping)."""
        st = request.app.state
        return st.batcher if st.status == "ok" and st.batcher is not None and st.batcher.running else None

    def not_ready(why: str = "the model is not loaded yet (or the server is stopping)") -> JSONResponse:
        return error_response(503, f"{why}; retry shortly", headers={"Retry-After": "1"})

    @app.get("/", include_in_schema=False)
    async def root():
        return RedirectResponse("/docs")

    @app.get("/health", response_model=HealthResponse, responses={503: {"model": HealthResponse}},
             summary="Is the model loaded? Which checkpoint, device and labels?")
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
            ) if batcher else None,
        )
        return JSONResponse(body.model_dump(), status_code=200 if ok else 503)

    @app.post("/predict", response_model=Prediction, responses=ERRORS, summary="Classify one text")
    async def predict(body: PredictRequest, request: Request):
        batcher = serving_batcher(request)
        if batcher is None:
            return not_ready()
        try:
            return await batcher.submit(body.text)  # waits for the batch this request joins
        except BatcherStopped as err:
            return not_ready(str(err))

    @app.post("/predict/batch", response_model=BatchPredictResponse, responses=ERRORS,
              summary=f"Classify 1 to {MAX_BATCH_TEXTS} texts; results[i] belongs to texts[i]")
    async def predict_batch(body: BatchPredictRequest, request: Request):
        batcher = serving_batcher(request)
        if batcher is None:
            return not_ready()
        try:
            return {"results": await batcher.run_now(body.texts)}  # already a batch: one forward pass
        except BatcherStopped as err:
            return not_ready(str(err))

    return app


# `uvicorn distrinews_lib.serving.app:app`: the checkpoint path is read from the environment
# when the server starts, so importing this module loads nothing.
app = create_app()
