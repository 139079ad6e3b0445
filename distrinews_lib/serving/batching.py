"""Micro-batching: many concurrent single-text requests share one forward pass.

A transformer classifies 16 texts in one forward pass much faster than in 16 passes: the fixed
cost of a pass (Python dispatch, kernel launches, weight reads) is paid once.  So each request
puts its text on a queue and awaits a future; one worker task takes the first waiting text,
collects more for at most `window_ms` (or until `max_batch_size`), runs the model once in a
worker thread, and hands each result back to its own request.  While that forward pass runs,
new requests queue up, so under load batches grow by themselves; the window only has to catch
requests that are being read at the same moment, and it ends early when none are.

With max_batch_size=1 the same code serves every request on its own: the unbatched baseline.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

log = logging.getLogger("distrinews.serving")


class BatcherStopped(RuntimeError):
    """The batcher is not running (server starting up or shutting down)."""


class MicroBatcher:
    """Collect texts from concurrent requests into batches for `predict_batch(texts) -> results`.

    predict_batch runs in one dedicated thread: the event loop stays free to accept and parse the
    next requests meanwhile, and the model and tokenizer (not thread-safe) are never used from two
    threads at once.
    """

    def __init__(self, predict_batch: Callable[[list[str]], Sequence], max_batch_size: int = 32,
                 window_ms: float = 2.0):
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if window_ms < 0:
            raise ValueError("window_ms must be >= 0")
        self.predict_batch = predict_batch
        self.max_batch_size = int(max_batch_size)
        self.window_s = float(window_ms) / 1000.0
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        # Counters for /health and the benchmark: how well requests are being grouped.
        self.batches_run = 0
        self.texts_run = 0

    @property
    def running(self) -> bool:
        return self._worker is not None and not self._worker.done()

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="distrinews-model")
        self._worker = asyncio.get_running_loop().create_task(self._run(), name="distrinews-batcher")

    async def stop(self) -> None:
        """Stop the worker; requests still waiting get BatcherStopped (the app turns it into a 503)."""
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
            self._worker = None
        if self._queue is not None:
            while not self._queue.empty():
                _, fut = self._queue.get_nowait()
                if not fut.done():
                    fut.set_exception(BatcherStopped("the server is shutting down"))
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def submit(self, text: str):
        """Classify one text; resolves when the batch it joined has run."""
        if not self.running:
            raise BatcherStopped("the model is not ready")
        fut = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((text, fut))
        return await fut

    async def run_now(self, texts: list[str]):
        """Classify a caller's own batch (POST /predict/batch) in the same model thread, without queueing."""
        if not self.running:
            raise BatcherStopped("the model is not ready")
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.predict_batch, texts)

    async def _collect(self, batch: list) -> None:
        """Wait for one request, then gather more into `batch`, for at most window_s or max_batch_size.

        Collection ends early as soon as one turn of the event loop brings no new request: then no
        other request is being read right now, and waiting longer would only add latency.
        """
        queue = self._queue
        batch.append(await queue.get())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.window_s
        while len(batch) < self.max_batch_size:
            if not queue.empty():  # already waiting: take it without awaiting
                batch.append(queue.get_nowait())
                continue
            if loop.time() >= deadline:
                break
            # One turn of the loop: reads sockets, runs the handlers of requests that just arrived.
            await asyncio.sleep(0)
            if queue.empty():
                break

    async def _run(self) -> None:
        batch: list = []
        try:
            while True:
                batch = []
                await self._collect(batch)
                await self._serve(batch)
        finally:
            # Cancelled (shutdown) with requests in hand: tell them instead of leaving them hanging.
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(BatcherStopped("the server is shutting down"))

    async def _serve(self, batch: list) -> None:
        """One forward pass for the whole batch; each result goes to its own request's future."""
        loop = asyncio.get_running_loop()
        # A client that disconnected cancels its future; don't spend model time on it.
        batch = [(text, fut) for text, fut in batch if not fut.done()]
        if not batch:
            return
        texts = [text for text, _ in batch]
        try:
            results = await loop.run_in_executor(self._executor, self.predict_batch, texts)
        except Exception:
            # One bad text must not fail the others that shared its batch: retry them one by one.
            log.exception("batch of %d failed; retrying its texts one at a time", len(texts))
        else:
            self.batches_run += 1
            self.texts_run += len(texts)
            for (_, fut), result in zip(batch, results):
                if not fut.done():
                    fut.set_result(result)
            return
        for text, fut in batch:
            try:
                result = (await loop.run_in_executor(self._executor, self.predict_batch, [text]))[0]
            except Exception as err:
                if not fut.done():
                    fut.set_exception(err)
            else:
                if not fut.done():
                    fut.set_result(result)
