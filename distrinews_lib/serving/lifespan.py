"""The server's life: resolve the settings, load and check the model (start_classifier, in a thread: it blocks), run
the batcher; stop it on shutdown.

Nothing happens at import or in create_app: the model is loaded when the server starts, so importing the app
needs no checkpoint, and plain uvicorn reads the DISTRINEWS_* environment then.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Optional

import torch
from fastapi import FastAPI

from .batching import MicroBatcher
from .inference import Classifier
from .loading import ready_to_serve
from .rebuild import LoadedCheckpoint, load_for_serving
from .settings import ServingSettings

log = logging.getLogger("distrinews.serving")


def start_classifier(given: ServingSettings, loaded: Optional[LoadedCheckpoint] = None):
    """(settings, Classifier) the server starts with, the blocking part of its start: the settings resolved now (fields
    left None: the environment, else the defaults; a model already loaded keeps its device), the checkpoint loaded
    unless given (fp32 first), torch's threads set, and the model made ready under them (loading.ready_to_serve): a
    checkpoint that loads but cannot classify, answers NaN or drifts in int8 is refused now rather than on every
    request. Also the warm-up: the first client does not pay for lazy initialisation."""
    if loaded is not None:  # the model already sits on its device
        given = dataclasses.replace(given, device=str(next(loaded.model.parameters()).device))
    settings = given.resolved()
    if loaded is None:
        log.info("loading checkpoint %s on %s (%s)", settings.checkpoint, settings.device, settings.quantize)
        loaded = load_for_serving(settings.checkpoint, settings.device)
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    return settings, Classifier(ready_to_serve(loaded, settings.quantize), settings.device)


def serving_lifespan(given: ServingSettings, loaded: Optional[LoadedCheckpoint] = None):
    """The FastAPI lifespan for these settings (fields left None: the environment, else the defaults) and,
    when the command line has loaded and checked it already, this checkpoint."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state = app.state
        previous_threads = torch.get_num_threads()
        try:
            settings, classifier = await asyncio.to_thread(start_classifier, given, loaded)
            if settings.torch_threads:  # this thread too (start_classifier set it in its own)
                torch.set_num_threads(settings.torch_threads)
            batcher = MicroBatcher(
                classifier.predict,
                window_ms=settings.batch_window_ms,
                max_batch_size=settings.max_batch_size,
                max_queue=settings.max_queue,
                max_queue_texts=settings.max_queue_texts,
                deadline_s=settings.deadline_s,
            )
            await batcher.start()
        except BaseException:
            torch.set_num_threads(previous_threads)
            raise
        try:
            # torch and transformers leave millions of long-lived objects; freezing them keeps each full
            # garbage collection from walking them all (pauses of several hundred ms under load otherwise).
            gc.collect()
            gc.freeze()
            state.classifier, state.batcher, state.settings, state.status = classifier, batcher, settings, "ok"
            log.info(
                "serving %s (labels %s) on %s in %s (%d torch threads), max batch %d, window %.1f ms, queue %d "
                "requests / %d texts, deadline %g s",
                Path(classifier.loaded.path).name,
                ", ".join(classifier.labels),
                settings.device,
                classifier.loaded.precision,
                torch.get_num_threads(),
                settings.max_batch_size,
                settings.batch_window_ms,
                batcher.max_queue,
                batcher.max_queue_texts,
                batcher.deadline_s,
            )
            yield
        finally:
            state.status = "stopping"
            await batcher.stop()
            torch.set_num_threads(previous_threads)

    return lifespan
