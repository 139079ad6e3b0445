"""The checker's view of a rung's collectives: every Python-level collective on the default group recorded (and, for
the overlap case, slowed as on a slow link), and the sandbox each case runs in (a default group of its own)."""

from __future__ import annotations

import functools
import inspect
import threading
import time
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from distrinews_lib.errors import UserError

from .rung import AGREEMENT_GROUPS
from .timeline import wire_bytes

# torch.distributed's collectives a rung (or FSDP2) calls from Python: name -> (kind, argument holding the full buffer)
WATCHED = {
    "all_reduce": ("all_reduce", "tensor"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "all_gather_single": ("all_gather", "output_tensor"),
}


def is_agreement(group) -> bool:
    """Whether `group` is an agreement group (rung.agreement_group): its collectives are not counted or slowed."""
    return any(group is g for g in list(AGREEMENT_GROUPS.values()))


def forget_agreement(default) -> None:
    """Destroy the agreement group made under `default`, if any (a sandbox, on its way out)."""
    group = AGREEMENT_GROUPS.pop(default, None)
    if group is not None:
        dist.destroy_process_group(group)


class Collectives:
    """While active, every Python-level collective on the default group is recorded (kind, bytes of the whole
    buffer, dtype, launched inside backward or not, blocking or async). With delay_s > 0 each behaves as on a slow
    link: its work completes no sooner than delay_s after its launch (wait(), its future, a blocking call). A wait
    for one inside backward (`in_backward`, set by the caller around loss.backward()) is recorded too.
    torch's DDP reduces in C++, so it is neither watched nor slowed."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s, self.calls, self.waits_in_backward, self.in_backward = delay_s, [], [], False
        self._saved, self.active, self.paused = {}, False, False

    @contextmanager
    def pause(self):
        """Neither record nor slow the collectives of the block (the checker reading the weights, not training)."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False

    def __enter__(self):
        self.active = True
        for name, (kind, arg) in WATCHED.items():
            fn = getattr(dist, name, None)
            if fn is not None:
                self._saved[name] = fn
                setattr(dist, name, self._wrap(fn, kind, arg))
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        self.active = False
        return False

    def _wrap(self, fn, kind, arg):
        sig = inspect.signature(fn)

        @functools.wraps(fn)  # its signature stays the collective's: a second watcher can bind it too
        def watched(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            group, buffer = bound.arguments.get("group"), bound.arguments[arg]
            if self.paused or (group is not None and is_agreement(group)):
                return fn(*args, **kwargs)  # the rungs' agreements and the checker's own: not the training's traffic
            for t in bound.arguments.values():  # a freed tensor here would crash gloo (a segfault), not raise
                if torch.is_tensor(t) and t.untyped_storage().nbytes() < t.numel() * t.element_size():
                    raise UserError(
                        f"a collective ({kind}) was given a tensor whose memory is freed: give it "
                        "back (resize its storage) before a collective writes into it"
                    )
            record = {
                "kind": kind,
                "group": None if group is None else tuple(dist.get_process_group_ranks(group)),
                "bytes": buffer.numel() * buffer.element_size(),
                "dtype": str(buffer.dtype),
                # every tensor's (a gather's shard and its output, a reduce-scatter's input and its share)
                "dtypes": sorted({str(t.dtype) for t in bound.arguments.values() if torch.is_tensor(t)}),
                "in_backward": self.in_backward,
                "async": bool(bound.arguments.get("async_op")),
            }
            self.calls.append(record)
            due = time.perf_counter() + self.delay_s
            work = fn(*args, **kwargs)
            if record["async"]:
                return _DelayedWork(work, due, self, record) if self.delay_s > 0 else work
            if self.in_backward:
                self.waits_in_backward.append(record)  # a blocking collective inside backward waits at launch
            _sleep_until(due)
            return work

        return watched

    def waited(self, record) -> None:
        if self.in_backward:
            self.waits_in_backward.append(record)

    def wire_bytes(self, world: int) -> float:
        """Bytes one rank sends for the recorded collectives, as a ring would (by_hand.wire_bytes)."""
        return sum(wire_bytes(c["kind"], c["bytes"], world) for c in self.calls)


def calls_per_step(step, batches) -> dict:
    """{kind: calls per step}: the Python-level collectives `step(batch)` launched on each of `batches`, counted from
    the calls themselves (a rung's own tally would say whatever its code adds). torch's DDP reduces in C++: none."""
    with Collectives() as log:
        for b in batches:
            step(b)
    kinds = {}
    for c in log.calls:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1 / len(batches)
    return kinds


def _sleep_until(due: float) -> None:
    left = due - time.perf_counter()
    if left > 0:
        time.sleep(left)


class _WatchedFuture(torch.futures.Future):
    """A future whose wait() is recorded (inside backward, it is a wait at launch)."""

    def __init__(self, log, record):
        super().__init__()
        self.log, self.record = log, record

    def wait(self):
        self.log.waited(self.record)
        return super().wait()


class _DelayedWork:
    """A collective's work handle on a slow link: done no sooner than `due`."""

    def __init__(self, work, due, log, record):
        self.work, self.due, self.log, self.record, self._future = work, due, log, record, None

    def wait(self, *args):
        self.log.waited(self.record)
        self.work.wait(*args)
        _sleep_until(self.due)
        return True

    def is_completed(self) -> bool:
        return self.work.is_completed() and time.perf_counter() >= self.due

    def get_future(self):
        if self._future is None:
            from .timeline import when_done

            fut = self._future = _WatchedFuture(self.log, self.record)

            def arrived():
                left = self.due - time.perf_counter()
                if left > 0:
                    threading.Timer(left, fut.set_result, (None,)).start()
                else:
                    fut.set_result(None)

            self.work = when_done(self.work, arrived)  # its waiter thread and ours share one wait
        return self._future

    def __getattr__(self, name):
        return getattr(self.work, name)


@contextmanager
def sandbox(timeout_s: float):
    """A fresh gloo group made the default for the block (the rung and torch's DDP use it without knowing; a rung makes
    its agreement group under it). A case that leaves a collective unmatched (a rank that stopped, a rank that skipped
    one) leaves it there; the next case starts clean. A clean case's groups are destroyed on the way out."""
    from torch.distributed.distributed_c10d import _get_default_group, _update_default_pg

    world = _get_default_group()
    pg = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    _update_default_pg(pg)
    box = {"clean": True}
    try:
        yield box
    finally:
        _update_default_pg(world)
        if box["clean"]:
            forget_agreement(pg)
            dist.destroy_process_group(pg)
