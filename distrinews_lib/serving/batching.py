"""Micro-batching with a bounded queue: many concurrent requests share forward passes, overload is refused.

A transformer classifies 16 texts in one forward pass much faster than in 16 passes: the fixed
cost of a pass (Python dispatch, kernel launches, weight reads) is paid once.  So each request
becomes a *job* on a queue and awaits its future; one worker task takes the first waiting job,
collects more single-text jobs for at most `window_ms` (or until `max_batch_size`), runs the model
once in a worker thread, and hands each result back to its own request.  While that forward pass
runs, new requests queue up, so under load batches grow by themselves; the window only has to
catch requests that are being read at the same moment, and it ends early when none are.
A /predict/batch call is one job with its own texts and runs as its own forward pass.

Overload is refused instead of queued without end:

* the queue is bounded in jobs (`max_queue`) and in texts (`max_queue_texts`); a job that does not fit
  raises `Overloaded` at once (the app answers 503 with Retry-After);
* every job has a deadline; one still waiting when it passes is dropped before the model sees it;
* a job can be cancelled (its client went away, or its deadline passed while the app waited): if it
  has not reached the model, it never does.

With max_batch_size=1 the same code serves every request on its own: the unbatched baseline.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Sequence

log = logging.getLogger("distrinews.serving")


class BatcherStopped(RuntimeError):
    """The batcher is not running (server starting up or shutting down)."""


class Overloaded(RuntimeError):
    """The queue is full; `retry_after` is a whole number of seconds worth waiting before trying again."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class DeadlineExceeded(RuntimeError):
    """The job's deadline passed before its answer was ready."""


class JobAbandoned(RuntimeError):
    """The job's client went away; nobody waits for the answer any more."""


class Job:
    """Texts from one request, waiting for (or in) a forward pass."""

    __slots__ = ("texts", "single", "future", "deadline", "state", "drop_reason")

    def __init__(self, texts: list[str], single: bool, future: asyncio.Future, deadline: float):
        self.texts = texts
        self.single = single  # a /predict text: may share a forward pass with other single texts
        self.future = future
        self.deadline = deadline  # event-loop time
        self.state = "queued"  # queued -> running, or queued -> dropped
        self.drop_reason: Optional[str] = None


class MicroBatcher:
    """Collect texts from concurrent requests into batches for `predict_batch(texts) -> results`.

    predict_batch runs in one dedicated thread: the event loop stays free to accept and parse the
    next requests meanwhile, and the model and tokenizer (not thread-safe) are never used from two
    threads at once.
    """

    def __init__(
        self,
        predict_batch: Callable[[list[str]], Sequence],
        max_batch_size: int = 32,
        window_ms: float = 2.0,
        max_queue: int = 128,
        max_queue_texts: int = 512,
        deadline_s: float = 10.0,
    ):
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if window_ms < 0:
            raise ValueError("window_ms must be >= 0")
        if max_queue < 1 or max_queue_texts < 1 or deadline_s <= 0:
            raise ValueError("max_queue, max_queue_texts and deadline_s must be positive")
        self.predict_batch = predict_batch
        self.max_batch_size = int(max_batch_size)
        self.window_s = float(window_ms) / 1000.0
        self.max_queue = int(max_queue)
        self.max_queue_texts = int(max_queue_texts)
        self.deadline_s = float(deadline_s)
        self._jobs: deque[Job] = deque()
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.waiting_jobs = 0  # queued, not dropped, not yet taken by the worker
        self.waiting_texts = 0
        self._seconds_per_text = 0.0  # running average of model time per text (for Retry-After)
        # Counters for /health and the benchmark.
        self.batches_run = 0  # forward passes for /predict texts
        self.texts_run = 0  # /predict texts classified
        self.batch_calls_run = 0  # /predict/batch calls classified
        self.shed = 0  # refused because the queue was full
        self.expired = 0  # dropped at their deadline, before the model
        self.abandoned = 0  # dropped because their client went away, before the model
        self.texts_dropped = 0  # texts of the expired and abandoned jobs: model work saved
        self.texts_unused = 0  # texts computed whose answer nobody was waiting for any more

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        return self._worker is not None and not self._worker.done()

    async def start(self) -> None:
        self._jobs = deque()
        self._wakeup = asyncio.Event()
        self.waiting_jobs = self.waiting_texts = 0
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
        while self._jobs:
            job = self._jobs.popleft()
            if not job.future.done():
                job.future.set_exception(BatcherStopped("the server is shutting down"))
        self.waiting_jobs = self.waiting_texts = 0
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # ------------------------------------------------------------------ submitting

    def retry_after(self) -> int:
        """Whole seconds after which the queue has probably drained (at least 1)."""
        return max(1, math.ceil(self.waiting_texts * self._seconds_per_text))

    def enqueue(self, texts: list[str], single: bool, deadline_s: Optional[float] = None) -> Job:
        """Queue a job and return it (await job.future for the results). Raises Overloaded when it does
        not fit in the queue, BatcherStopped when the batcher is not running."""
        if not self.running:
            raise BatcherStopped("the model is not ready")
        n = len(texts)
        if self.waiting_jobs + 1 > self.max_queue or self.waiting_texts + n > self.max_queue_texts:
            self.shed += 1
            raise Overloaded(
                f"the server is overloaded: {self.waiting_jobs} requests with {self.waiting_texts} texts are already "
                f"waiting for the model (limits {self.max_queue} requests, {self.max_queue_texts} texts)",
                self.retry_after(),
            )
        loop = asyncio.get_running_loop()
        job = Job(list(texts), single, loop.create_future(), loop.time() + (deadline_s or self.deadline_s))
        self._jobs.append(job)
        self.waiting_jobs += 1
        self.waiting_texts += n
        self._wakeup.set()
        return job

    def cancel(self, job: Job, reason: str = "abandoned") -> None:
        """The job's answer is no longer wanted ('abandoned': the client went away; 'expired': its deadline
        passed). If it has not reached the model it never will, and its place in the queue is freed now.
        Its future gets JobAbandoned or DeadlineExceeded."""
        if job.state == "queued":
            self._drop(job, reason)
        elif job.drop_reason is None:
            job.drop_reason = reason
        if not job.future.done():
            _fail(
                job.future,
                DeadlineExceeded("the request's deadline passed")
                if reason == "expired"
                else JobAbandoned("the client went away"),
            )

    def _drop(self, job: Job, reason: str) -> None:
        job.state, job.drop_reason = "dropped", reason
        self.waiting_jobs -= 1
        self.waiting_texts -= len(job.texts)
        self.texts_dropped += len(job.texts)
        if reason == "expired":
            self.expired += 1
        else:
            self.abandoned += 1

    async def submit(self, text: str):
        """Classify one text; resolves when the batch it joined has run."""
        job = self.enqueue([text], single=True)
        return (await job.future)[0]

    async def run_now(self, texts: list[str]):
        """Classify a caller's own batch as one job (one forward pass of its own)."""
        job = self.enqueue(texts, single=False)
        return await job.future

    # ------------------------------------------------------------------ the worker

    def _next_live(self, pop: bool) -> Optional[Job]:
        """The first job in the queue that still wants an answer; dead ones at the front are discarded."""
        now = asyncio.get_running_loop().time()
        while self._jobs:
            job = self._jobs[0]
            if job.state == "queued" and job.future.done():  # cancelled without cancel() (should not happen)
                self._drop(job, "abandoned")
            elif job.state == "queued" and now >= job.deadline:
                self._drop(job, "expired")
                _fail(job.future, DeadlineExceeded("the request waited past its deadline"))
            if job.state == "dropped":
                self._jobs.popleft()
                continue
            if pop:
                self._jobs.popleft()
                job.state = "running"
                self.waiting_jobs -= 1
                self.waiting_texts -= len(job.texts)
            return job
        return None

    async def _collect(self) -> list[Job]:
        """Wait for one live job, then gather more single-text jobs, for at most window_s or max_batch_size.

        Collection ends early as soon as one turn of the event loop brings no new request: then no
        other request is being read right now, and waiting longer would only add latency.
        """
        while True:
            job = self._next_live(pop=True)
            if job is not None:
                break
            self._wakeup.clear()
            await self._wakeup.wait()
        batch = [job]
        if not job.single:
            return batch
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.window_s
        while len(batch) < self.max_batch_size:
            nxt = self._next_live(pop=False)
            if nxt is not None:
                if not nxt.single:
                    break  # a /predict/batch call runs on its own, next
                batch.append(self._next_live(pop=True))
                continue
            if loop.time() >= deadline:
                break
            # One turn of the loop: reads sockets, runs the handlers of requests that just arrived.
            await asyncio.sleep(0)
            if self._next_live(pop=False) is None:
                break
        return batch

    async def _run(self) -> None:
        batch: list = []
        try:
            while True:
                batch = []
                batch = await self._collect()
                await self._serve(batch)
        finally:
            # Cancelled (shutdown) with requests in hand: tell them instead of leaving them hanging.
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(BatcherStopped("the server is shutting down"))

    async def _predict(self, texts: list[str]):
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        results = await loop.run_in_executor(self._executor, self.predict_batch, texts)
        per_text = (time.perf_counter() - start) / max(len(texts), 1)
        self._seconds_per_text = (
            per_text if not self._seconds_per_text else 0.8 * self._seconds_per_text + 0.2 * per_text
        )
        return results

    async def _serve(self, batch: list[Job]) -> None:
        """One forward pass for the whole batch; each result goes to its own request's future."""
        # One turn of the loop first: the watchers of requests queued a moment ago run, so a client that has
        # already left is noticed now; don't spend model time on it.
        await asyncio.sleep(0)
        live = []
        for job in batch:
            if job.future.done():
                if job.drop_reason == "expired":
                    self.expired += 1
                else:
                    self.abandoned += 1
                self.texts_dropped += len(job.texts)
            else:
                live.append(job)
        if not live:
            return
        texts = [text for job in live for text in job.texts]
        try:
            results = await self._predict(texts)
        except Exception as err:
            if len(live) == 1:
                if not live[0].future.done():
                    live[0].future.set_exception(err)
                return
            # One bad text must not fail the others that shared its batch: retry them one by one.
            log.exception("batch of %d failed; retrying its texts one at a time", len(texts))
            for job in live:
                await self._serve_alone(job)
            return
        self._count(live)
        i = 0
        for job in live:
            n = len(job.texts)
            self._deliver(job, results[i : i + n])
            i += n

    async def _serve_alone(self, job: Job) -> None:
        if job.future.done():
            return
        try:
            results = await self._predict(job.texts)
        except Exception as err:
            if not job.future.done():
                job.future.set_exception(err)
        else:
            self._count([job])
            self._deliver(job, results)

    def _count(self, jobs: list[Job]) -> None:
        singles = [job for job in jobs if job.single]
        if singles:
            self.batches_run += 1
            self.texts_run += len(singles)
        self.batch_calls_run += len(jobs) - len(singles)

    def _deliver(self, job: Job, results) -> None:
        if job.future.done():  # its client left (or its deadline passed) while the model ran
            self.texts_unused += len(job.texts)
        else:
            job.future.set_result(list(results))


def _fail(future: asyncio.Future, error: BaseException) -> None:
    future.set_exception(error)
    future.exception()  # marks it retrieved: whoever waited for it may be gone, and asyncio would log it


class ThrottledLog:
    """Log one line at most every `every_s` seconds per kind of event, with how many were left out.

    Under overload a line per refused request would cost the CPU the server needs and bury the log."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0):
        self.logger = logger
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def __call__(self, kind: str, level: int, msg: str, *args) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.every_s:
            self._skipped[kind] = self._skipped.get(kind, 0) + 1
            return
        skipped = self._skipped.pop(kind, 0)
        self._last[kind] = now
        if skipped:
            msg += f" (and {skipped} more like it in the last {now - last:.0f} s)"
        self.logger.log(level, msg, *args)
