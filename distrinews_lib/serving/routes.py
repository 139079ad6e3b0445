"""The API's routes: /, /docs (Swagger UI from local files), /health, /predict and /predict/batch.

A prediction is a job on the app's MicroBatcher (app.state.batcher, started by the lifespan); the handler
waits for its answer, its deadline, or its client leaving, whichever comes first.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from typing import Optional

import torch
from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, RedirectResponse, Response

from .batching import BatcherStopped, DeadlineExceeded, JobAbandoned, MicroBatcher, Overloaded, ThrottledLog
from .handlers import error_response
from .inference import Classifier
from .schemas import (
    MAX_BATCH_TEXTS,
    MAX_BODY_BYTES,
    BatchingInfo,
    BatchPredictRequest,
    BatchPredictResponse,
    CheckpointInfo,
    ErrorResponse,
    HealthResponse,
    Prediction,
    PredictRequest,
    QuantizationInfo,
    QueueInfo,
)

throttled = ThrottledLog(logging.getLogger("distrinews.serving"))
router = APIRouter()

RETRY_AFTER_HEADER = {
    "Retry-After": {"description": "Whole seconds worth waiting before trying again.", "schema": {"type": "integer"}}
}
ERRORS = {
    400: {"model": ErrorResponse, "description": "The body is not valid JSON."},
    413: {"model": ErrorResponse, "description": f"The body is larger than {MAX_BODY_BYTES:,} bytes."},
    422: {"model": ErrorResponse, "description": "A field is missing, of the wrong type, empty, or over its limit."},
    503: {
        "model": ErrorResponse,
        "headers": RETRY_AFTER_HEADER,
        "description": "The model is not loaded yet (starting) or any more (stopping), or the server is "
        "overloaded: its queue is full, or the request was not answered within its deadline.",
    },
}


async def cancel_when_gone(receive, batcher: MicroBatcher, job) -> None:
    """Drop the job when its client goes. The body has been read, so the server's next message is the
    disconnect (uvicorn sends it as soon as the connection is lost; the command line's protocol as soon as
    the client closes its side)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            batcher.cancel(job, "abandoned")
            return


def serving_batcher(request: Request) -> Optional[MicroBatcher]:
    """The running batcher, or None while the model is not loaded (starting) or any more (stopping)."""
    st = request.app.state
    return st.batcher if st.status == "ok" and st.batcher is not None and st.batcher.running else None


def not_ready(why: str = "the model is not loaded yet (or the server is stopping)") -> JSONResponse:
    return error_response(503, f"{why}; retry shortly", headers={"Retry-After": "1"})


def too_late(batcher: MicroBatcher) -> JSONResponse:
    wait = batcher.retry_after()
    throttled(
        "deadline",
        logging.WARNING,
        "answered 503: a request was not answered within its deadline of %g s",
        batcher.deadline_s,
    )
    return error_response(
        503,
        f"the server is overloaded: the request was not answered within its deadline of "
        f"{batcher.deadline_s:g} s; retry after {wait} s",
        headers={"Retry-After": str(wait)},
    )


async def classify(request: Request, texts: list[str], single: bool):
    """Queue the texts for the model and wait for their results, the deadline, or the client leaving."""
    batcher = serving_batcher(request)
    if batcher is None:
        return not_ready()
    try:
        job = batcher.enqueue(texts, single=single)
    except Overloaded as err:
        throttled("shed", logging.WARNING, "answered 503 with Retry-After %d: %s", err.retry_after, err)
        return error_response(
            503, f"{err}; retry after {err.retry_after} s", headers={"Retry-After": str(err.retry_after)}
        )
    except BatcherStopped as err:
        return not_ready(str(err))
    loop = asyncio.get_running_loop()
    # The client may leave while it waits: then the job is dropped (if it has not reached the model yet).
    watcher = loop.create_task(cancel_when_gone(request.receive, batcher, job))
    timer = loop.call_later(max(0.0, job.deadline - loop.time()), batcher.cancel, job, "expired")
    try:
        return await job.future
    except DeadlineExceeded:
        return too_late(batcher)
    except JobAbandoned:
        return Response(status_code=499)  # nobody to answer (nginx's "client closed request")
    except BatcherStopped as err:
        return not_ready(str(err))
    except asyncio.CancelledError:  # the handler itself was cancelled: the answer is not wanted
        batcher.cancel(job, "abandoned")
        raise
    finally:
        timer.cancel()
        watcher.cancel()


@router.get("/", include_in_schema=False)
async def root():
    return RedirectResponse("/docs")


@router.get("/docs", include_in_schema=False)
async def docs(request: Request):
    root_path = request.scope.get("root_path", "").rstrip("/")
    return get_swagger_ui_html(
        openapi_url=root_path + request.app.openapi_url,
        title=request.app.title + " - API docs",
        swagger_js_url=root_path + "/docs/assets/swagger-ui-bundle.js",
        swagger_css_url=root_path + "/docs/assets/swagger-ui.css",
        swagger_favicon_url=root_path + "/docs/assets/favicon-32x32.png",
        # No validator badge: it would send the schema to validator.swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.api_route(
    "/health",
    methods=["GET", "HEAD"],
    response_model=HealthResponse,
    responses={503: {"model": HealthResponse}},
    summary="Is the model loaded? Which checkpoint, device and labels? How full is the queue?",
)
async def health(request: Request):
    st = request.app.state
    clf: Optional[Classifier] = st.classifier
    batcher: Optional[MicroBatcher] = st.batcher
    ok = st.status == "ok" and batcher is not None and batcher.running
    body = HealthResponse(
        status="ok" if ok else st.status,
        model_loaded=clf is not None and ok,
        device=clf.device if clf else None,
        precision=clf.loaded.precision if clf else None,
        quantization=QuantizationInfo(**clf.loaded.quantization) if clf and clf.loaded.quantization else None,
        labels=clf.labels if clf else [],
        checkpoint=clf.info() if clf else CheckpointInfo(),
        batching=BatchingInfo(
            max_batch_size=batcher.max_batch_size,
            batch_window_ms=batcher.window_s * 1000,
            torch_threads=torch.get_num_threads(),
            batches_run=batcher.batches_run,
            mean_batch_size=round(batcher.texts_run / batcher.batches_run, 2) if batcher.batches_run else None,
            texts_run=batcher.texts_run,
            batch_calls_run=batcher.batch_calls_run,
        )
        if batcher
        else None,
        queue=QueueInfo(
            max_requests=batcher.max_queue,
            max_texts=batcher.max_queue_texts,
            deadline_s=batcher.deadline_s,
            waiting_requests=batcher.waiting_jobs,
            waiting_texts=batcher.waiting_texts,
            shed=batcher.shed,
            expired=batcher.expired,
            abandoned=batcher.abandoned,
            texts_dropped=batcher.texts_dropped,
            texts_unused=batcher.texts_unused,
        )
        if batcher
        else None,
    )
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)


@router.post("/predict", response_model=Prediction, responses=ERRORS, summary="Classify one text")
async def predict(body: PredictRequest, request: Request):
    result = await classify(request, [body.text], single=True)
    return result[0] if isinstance(result, list) else result


@router.post(
    "/predict/batch",
    response_model=BatchPredictResponse,
    responses=ERRORS,
    summary=f"Classify 1 to {MAX_BATCH_TEXTS} texts; results[i] belongs to texts[i]",
)
async def predict_batch(body: BatchPredictRequest, request: Request):
    result = await classify(request, body.texts, single=False)  # already a batch: one forward pass
    return {"results": result} if isinstance(result, list) else result


def openapi_with_unique_ids(app: FastAPI):
    """app.openapi, with one operationId per method of /health."""

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

    return openapi
