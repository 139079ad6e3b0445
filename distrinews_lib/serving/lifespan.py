"""The server's life: resolve the settings, load and check the model, run the batcher; stop it on shutdown.

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
from .inference import Classifier, LoadedCheckpoint, load_for_serving
from .loading import ready_to_serve
from .settings import QUANTIZE_CHOICES, ServingSettings

log = logging.getLogger("distrinews.serving")


def serving_lifespan(given: ServingSettings, loaded: Optional[LoadedCheckpoint] = None):
    """The FastAPI lifespan for these settings (fields left None: the environment, else the defaults) and,
    when the command line has loaded and checked it already, this checkpoint."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state = app.state
        if loaded is not None:  # the model already sits on its device
            given_now = dataclasses.replace(given, device=str(next(loaded.model.parameters()).device))
        else:
            given_now = given
        settings = given_now.resolved()
        if loaded is not None:  # checked by the command line already, or to be checked below
            ckpt = loaded
        else:
            log.info(
                "loading checkpoint %s on %s (%s)",
                settings.checkpoint,
                settings.device,
                QUANTIZE_CHOICES[settings.quantize],
            )
            ckpt = await asyncio.to_thread(load_for_serving, settings.checkpoint, settings.device)  # fp32 first
        previous_threads = torch.get_num_threads()
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        try:
            # In the precision asked for, and its answers checked (int8's against fp32's, taken before quantizing):
            # a checkpoint that loads but cannot classify, answers NaN or drifts in int8 is refused now rather than
            # on every request. Also the warm-up: the first client does not pay for lazy initialisation.
            ckpt = await asyncio.to_thread(ready_to_serve, ckpt, settings.quantize)
            classifier = Classifier(ckpt, settings.device)
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
                Path(ckpt.path).name,
                ", ".join(classifier.labels),
                settings.device,
                ckpt.precision,
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
