"""Chapter 03's checker: what a rung of scripts/by_hand/ (the reference, or a learner's version of it) does in the
cases where a wrong answer shows, each compared with torch's DistributedDataParallel on the same 2 gloo ranks.

The rank side runs inside scripts/by_hand/race.py (--probes). Each case ("probe") runs in a process group of its
own (a sandbox, made the default group for the case), so that collectives the ranks did not join alike (a rank
that stopped, a second backward) stay there and the next case starts clean. The notebook side
(check_exercise) launches the race on the learner's file and prints one line: the first mistake found, named.

| mistake                                   | case that shows it                                                 |
|-------------------------------------------|--------------------------------------------------------------------|
| missing divide                            | the gradient the optimizer sees is N x DDP's (step 1, tiny model)  |
| no overlap: waiting at launch             | a link slowed to `delay` per collective: waits inside backward     |
| launch in readiness order                 | two heads, each rank completes their gradients in its own order    |
| a second backward before the step         | two backward passes per step: DDP's accumulated result, or a clear |
|                                           | error on every rank                                                |
| dtype not preserved                       | float64 and bfloat16 models: a collective or the update in another |
| an unused parameter                       | a head unused on rank 1 (and on every rank): a clear error on      |
|                                           | every rank, or DDP's find_unused_parameters result                 |
| the bucket rule not the one stated        | the buckets against torch's DDP's own assignment of the same sizes |
| ZeRO-3: weights not freed / not gathered  | checked by the rung where it uses and frees a block                |
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import threading
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from distrinews_lib.errors import UserError

from . import ROOT

# ------------------------------------------------------------------------------------------- watching collectives

# torch.distributed's collectives a rung (or FSDP2) calls from Python: name -> (kind, argument holding the full buffer)
WATCHED = {
    "all_reduce": ("all_reduce", "tensor"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "all_gather_single": ("all_gather", "output_tensor"),
}


class Collectives:
    """While active, every Python-level collective on the default group is recorded (kind, bytes of the whole
    buffer, dtype, launched inside backward or not, blocking or async). With delay_s > 0 each behaves as on a slow
    link: its work completes no sooner than delay_s after its launch (wait(), its future, a blocking call). A wait
    for one inside backward (`in_backward`, set by the caller around loss.backward()) is recorded too.
    torch's DDP reduces in C++, so it is neither watched nor slowed."""

    def __init__(self, delay_s: float = 0.0):
        self.delay_s, self.calls, self.waits_in_backward, self.in_backward = delay_s, [], [], False
        self._saved, self.active = {}, False

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
            if group is not None and group is _control_group():
                return fn(*args, **kwargs)  # the rungs' agreements and the checker's own: not the training's traffic
            for t in bound.arguments.values():  # a freed tensor here would crash gloo (a segfault), not raise
                if torch.is_tensor(t) and t.untyped_storage().nbytes() < t.numel() * t.element_size():
                    raise UserError(
                        f"a collective ({kind}) was given a tensor whose memory is freed: give it "
                        "back (resize its storage) before a collective writes into it"
                    )
            record = {
                "kind": kind,
                "bytes": buffer.numel() * buffer.element_size(),
                "dtype": str(buffer.dtype),
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
        from .by_hand import wire_bytes

        return sum(wire_bytes(c["kind"], c["bytes"], world) for c in self.calls)


def _control_group():
    from . import by_hand

    return by_hand._CONTROL


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
            from .by_hand import when_done

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


# ------------------------------------------------------------------------------------------------------ sandboxes


@contextmanager
def sandbox(timeout_s: float):
    """Fresh gloo groups for the block: the default group (the rung and torch's DDP use it without knowing) and the
    rungs' control group. A case that leaves a collective unmatched in either (a rank that stopped, a rank that
    skipped one) leaves it there; the next case starts clean. A clean case's groups are destroyed on the way out."""
    from torch.distributed.distributed_c10d import _get_default_group, _update_default_pg

    from . import by_hand

    world, control_before = _get_default_group(), by_hand._CONTROL
    pg = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    ctl = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    _update_default_pg(pg)
    by_hand._CONTROL = ctl
    box = {"clean": True}
    try:
        yield box
    finally:
        _update_default_pg(world)
        by_hand._CONTROL = control_before
        if box["clean"]:
            dist.destroy_process_group(ctl)
            dist.destroy_process_group(pg)


def outcome(err: BaseException | None, files=()) -> dict | None:
    """What a rank's run ended with: None (it finished), or the exception in one line, and whether it is a clear
    error: a UserError, or an exception raised by a `raise` statement of the rung's own code (files)."""
    if err is None:
        return None
    frames = traceback.extract_tb(err.__traceback__)
    last = frames[-1] if frames else None
    where = f" ({Path(last.filename).name}:{last.lineno}: {last.line.strip()})" if last and last.line else ""
    own = bool(last) and last.filename in files and (last.line or "").strip().startswith("raise")
    text = " ".join(str(err).split())
    collective = any(s in text.lower() for s in ("gloo", "connection", "timed out", "timeout", "peer"))
    return {
        "type": type(err).__name__,
        "message": text[:300],
        "where": where,
        "clear": (isinstance(err, UserError) or own) and not collective and not isinstance(err, NotImplementedError),
        "not_written": isinstance(err, NotImplementedError),
    }


def everyone(obj, group) -> list:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=group)
    return out


# ------------------------------------------------------------------------------------------------- the mistakes

MISTAKES = {
    "missing_divide": "missing divide: the gradients your optimizer stepped with are {ratio:.2f}x torch DDP's "
    "average: they are summed over the {world} ranks, not averaged (divide by the world size)",
    "divided_twice": "divided twice: the gradients your optimizer stepped with are {ratio:.2f}x torch DDP's average "
    "(divide by the world size once)",
    "no_overlap": "no overlap: with a link that takes {delay_ms:.0f} ms per collective, your code waited for "
    "{waits} of them inside backward (backward took {slow_ms:.0f} ms instead of {fast_ms:.0f} ms): "
    "launch with async_op=True and wait only before the optimizer step",
    "readiness_order": "launched in readiness order, not a fixed one: on a model whose gradients become ready in a "
    "different order on each rank, your ranks paired different tensors ({detail}); launch in "
    "the same fixed order on every rank, as torch's DDP does",
    "second_backward": "a second backward before the step: {detail}; accumulate both backward passes as torch's DDP "
    "does, or stop every rank with a clear error",
    "dtype": "dtype not preserved: {detail}; make every buffer (and the shard) with the parameters' dtype",
    "unused_parameter": "an unused parameter ({case}): {detail}; every rank must stop with the same clear message "
    "(by_hand.stop_unless_every_rank_has), or handle it as find_unused_parameters does",
    "bucket_rule": "the bucket rule is not the one stated: {detail} (walk the parameters in reverse and close a "
    "bucket once it holds at least the cap, as torch's DDP does)",
    "differs": "{detail}",
    "crashed": "your code raised {detail}",
    "stopped": "your code stopped: {detail}",
    "not_written": "still to write: {detail} raises NotImplementedError",
}


def mistake(key: str, **facts) -> dict:
    return {"ok": False, "mistake": key, "message": MISTAKES[key].format(**facts)}


PASS = {"ok": True, "mistake": None, "message": ""}


def probes_for(rung: str) -> list:
    """The cases each rung is checked on (a rung that cannot make a mistake is not checked for it)."""
    names = ["accumulate", "dtype", "order", "unused_rank1", "unused_all"]
    if rung in ("overlapped", "bucketed", "zero2"):
        names.insert(0, "overlap")
    if rung in ("bucketed", "zero2"):
        names.insert(0, "bucket_rule")
    return names


# -------------------------------------------------------------------------------------------------- the cases

_AGREE = None  # the checker's own group (Cases makes it): the ranks compare their cases' ends there


def control():
    """Where the ranks agree on how a case ended: the checker's own group, which a learner's code never touches
    (the rungs' control group may be left unmatched by a wrong one), else the rungs' control group."""
    from .by_hand import control_group

    return _AGREE or control_group()


def across(x: float, op=None) -> float:
    """x reduced over the ranks (MAX by default) on the control group."""
    t = torch.tensor([float(x)], dtype=torch.float64)
    dist.all_reduce(t, op=op or dist.ReduceOp.MAX, group=control())
    return float(t)


def compare(weights, reference, names) -> tuple:
    """(first difference {step, param, diff} or None, largest difference) between two runs' per-step weights,
    over every rank (the control group)."""
    first, worst = None, 0.0
    for step, (mine, ref) in enumerate(zip(weights, reference), 1):
        for name, a, b in zip(names, mine, ref):
            d = float((a.double() - b.double()).abs().max()) if a.shape == b.shape else float("inf")
            worst = max(worst, d)
            if d > 0 and first is None:
                first = {"step": step, "param": name, "diff": d}
    firsts = everyone(first, control())
    return next((f for f in firsts if f), None), across(worst)


class Cases:
    """Runs a contender on a case inside a sandbox and says how each rank ended. make(name, kind, **kw) builds a
    runner (race.py's Runner); files: the contenders' source files, whose own `raise` is a clear error."""

    def __init__(self, make, batch_size: int, timeout_s: float, seed: int, files=()):
        global _AGREE
        self.make, self.batch_size, self.timeout_s, self.seed, self.files = make, batch_size, timeout_s, seed, files
        self.refs = {}
        # A rank may wait out a sandbox's default group, then its control group, before it gets here
        _AGREE = _AGREE or dist.new_group(backend="gloo", timeout=timedelta(seconds=3 * timeout_s + 10))

    def batches(self, kind, steps):
        from .by_hand import batches

        return batches(kind, dist.get_rank(), dist.get_world_size(), steps, self.batch_size)

    def run(self, name, kind, batches, micro=1, log=None, **kw) -> dict:
        """Contender `name` built on model `kind` and trained on `batches` (micro backward passes per step) in a
        sandbox, its collectives watched (a freed tensor handed to one is an error, not a crash): how each rank
        ended, its weights after each step, the runner."""
        log = log or Collectives()
        with sandbox(self.timeout_s) as box, log if not log.active else _Nothing():
            err, weights, runner = None, [], None
            try:
                runner = self.make(name, kind, **kw)
                runner.timeline.start()  # its gradients' ready ticks: how often each hook fired
                torch.manual_seed(self.seed + dist.get_rank())  # dropout: the same masks for every contender
                for b in batches:
                    runner.step(b, micro=micro, log=log)
                    weights.append(runner.weights())
            except Exception as e:  # noqa: BLE001  (a learner's code may raise anything: it is the verdict)
                err = e
            outcomes = everyone(outcome(err, self.files), control())
            box["clean"] = not any(outcomes)
        return {"outcomes": outcomes, "weights": weights, "runner": runner}

    def reference(self, key, kind, batches, micro=1, **kw) -> dict:
        """torch's DDP on the same case (once per case, shared by every contender)."""
        if key not in self.refs:
            self.refs[key] = self.run("ddp", kind, batches, micro, **kw)
            if any(self.refs[key]["outcomes"]):
                raise RuntimeError(f"torch's DDP failed on case {key}: {self.refs[key]['outcomes']}")
        return self.refs[key]


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def short(text: str, n: int) -> str:
    """text cut to about n characters at a word's end."""
    return text if len(text) <= n else text[:n].rsplit(" ", 1)[0] + " ..."


def ended(outcomes) -> str:
    """How the ranks ended, in a few words per rank."""
    return "; ".join(
        f"rank {r}: " + ("finished" if o is None else f"{o['type']}: {short(o['message'], 90)}{o['where']}")
        for r, o in enumerate(outcomes)
    )


def crashed(outcomes) -> dict:
    """The first rank's end, in one line: a clear error (the rung's own message says what is wrong) as it is; any
    other exception with the line that raised it."""
    o = next(o for o in outcomes if o)
    if o["not_written"]:
        return mistake("not_written", detail=o["where"].strip(" ()") or "a function")
    if o["clear"]:
        return mistake("stopped", detail=short(o["message"], 240))
    return mistake("crashed", detail=f"{o['type']}: {short(o['message'], 200)}{o['where']}")


def names_of(runner) -> list:
    return [n for n, _ in runner.model.named_parameters()]


def probe(case: str, name: str, rung: str, cases: Cases) -> dict:
    """One case for contender `name` (a version of rung `rung`): PASS (with a summary) or the mistake it shows."""
    if case == "bucket_rule":
        return probe_bucket_rule(name, cases)
    if case == "overlap":
        return probe_overlap(name, cases)
    if case == "accumulate":
        b = cases.batches("tiny", 2)
        ref = cases.reference("accumulate", "tiny", b, micro=2)
        got = cases.run(name, "tiny", b, micro=2)
        if all(o and o["clear"] for o in got["outcomes"]):
            return {
                **PASS,
                "summary": f"two backward passes per step: refused on every rank "
                f"({short(got['outcomes'][0]['message'], 80)})",
            }
        if any(got["outcomes"]):
            return mistake("second_backward", detail=f"not a clear error on every rank ({ended(got['outcomes'])})")
        first, worst = compare(got["weights"], ref["weights"], names_of(ref["runner"]))
        if worst > 1e-6:
            return mistake(
                "second_backward",
                detail=f"the weights end {worst:.3g} off torch DDP's, which accumulates both passes, silently",
            )
        return {
            **PASS,
            "summary": f"two backward passes per step: accumulated as torch's DDP does (max difference {worst:.3g})",
        }
    if case == "dtype":
        notes = []
        for dtype, tol in ((torch.float64, 0.0), (torch.bfloat16, 0.0)):
            b = cases.batches("tiny", 2)
            ref = cases.reference(f"dtype {dtype}", "tiny", b, dtype=dtype)
            with Collectives() as log:
                got = cases.run(name, "tiny", b, log=log, dtype=dtype)
            if any(got["outcomes"]):
                return crashed(got["outcomes"])
            kind = str(dtype).replace("torch.", "")
            other = [c for c in log.calls if c["dtype"] != str(dtype)]
            if other:
                return mistake(
                    "dtype",
                    detail=f"{kind} parameters, but a {other[0]['kind']} ran in "
                    f"{other[0]['dtype'].replace('torch.', '')}",
                )
            opt = [p.dtype for g in got["runner"].opt.param_groups for p in g["params"]]
            if any(d != dtype for d in opt):
                return mistake(
                    "dtype",
                    detail=f"{kind} parameters, but the optimizer updates "
                    f"{str(next(d for d in opt if d != dtype)).replace('torch.', '')} ones",
                )
            first, worst = compare(got["weights"], ref["weights"], names_of(ref["runner"]))
            if worst > tol:
                return mistake("dtype", detail=f"{kind} parameters end {worst:.3g} off torch DDP's in {kind}")
            notes.append(f"{kind} {worst:.3g}")
        return {**PASS, "summary": "float64 and bfloat16 models: max difference " + ", ".join(notes)}
    if case == "order":
        b = cases.batches("twoheads", 2)
        ref = cases.reference("order", "twoheads", b)
        got = cases.run(name, "twoheads", b)
        if any(got["outcomes"]):
            return crashed(got["outcomes"])
        _, worst = compare(got["weights"], ref["weights"], names_of(ref["runner"]))
        if worst > 1e-6:
            mine = torch.cat([w.reshape(-1).double() for w in got["weights"][-1]])
            zero = mine.clone()
            dist.broadcast(zero, src=0, group=control())
            apart = across(float((mine - zero).abs().max()))
            return mistake(
                "readiness_order",
                detail=f"weights {worst:.3g} off torch DDP's after {len(b)} steps, and the ranks {apart:.3g} apart",
            )
        return {**PASS, "summary": f"gradients ready in a different order on each rank: max difference {worst:.3g}"}
    if case in ("unused_rank1", "unused_all"):
        unused = case.split("_")[1]
        b = cases.batches("twoheads", 2)
        ref = cases.reference(case, "twoheads", b, unused=unused, find_unused=True)
        got = cases.run(name, "twoheads", b, unused=unused)
        where = "a head unused on rank 1" if unused == "rank1" else "a head unused on every rank"
        if all(o and o["clear"] for o in got["outcomes"]):
            return {
                **PASS,
                "summary": f"{where}: a clear error on every rank ({short(got['outcomes'][0]['message'], 70)})",
            }
        if any(got["outcomes"]):
            return mistake("unused_parameter", case=where, detail=ended(got["outcomes"]))
        first, worst = compare(got["weights"], ref["weights"], names_of(ref["runner"]))
        if worst > 1e-6:
            return mistake(
                "unused_parameter",
                case=where,
                detail=f"no error, and the weights end {worst:.3g} off torch DDP's with find_unused_parameters=True",
            )
        return {**PASS, "summary": f"{where}: as torch DDP with find_unused_parameters (max difference {worst:.3g})"}
    raise ValueError(f"unknown case {case!r}")


def probe_bucket_rule(name: str, cases: Cases) -> dict:
    """The contender's buckets against torch's DDP's own assignment (dist._compute_bucket_assignment_by_size) of
    the same parameters, in reverse order, on the tiny and the wide model at two caps."""
    checked = []
    for kind in ("tiny", "wide"):
        for cap_mb in (1.0, 0.25):
            got = cases.run(name, kind, [], bucket_mb=cap_mb)
            if any(got["outcomes"]):
                return crashed(got["outcomes"])
            dp = got["runner"].dp
            buckets = getattr(dp, "buckets", None)
            if not isinstance(buckets, (list, tuple)) or not all(isinstance(b, (list, tuple)) for b in buckets):
                return mistake(
                    "bucket_rule",
                    detail="no buckets to compare: keep them in self.buckets, a list of "
                    "lists of parameters, as the skeleton says",
                )
            order = list(reversed(dp.params))
            indices, _ = dist._compute_bucket_assignment_by_size(order, [int(cap_mb * 2**20)], [False] * len(order))
            want = [[id(order[i]) for i in b] for b in indices]
            if [[id(p) for p in b] for b in buckets] != want:

                def mib(groups):
                    return ", ".join(f"{sum(p.numel() * p.element_size() for p in g) / 2**20:.2f}" for g in groups)

                return mistake(
                    "bucket_rule",
                    detail=f"{kind} model at {cap_mb:g} MiB: your {len(buckets)} buckets "
                    f"hold {mib(buckets)} MiB; the rule's {len(want)} hold "
                    f"{mib([[order[i] for i in b] for b in indices])} MiB",
                )
            checked.append(f"{kind} {cap_mb:g} MiB: {len(want)}")
    return {**PASS, "summary": "the buckets of torch's DDP's rule (" + "; ".join(checked) + ")"}


DELAY_S = 0.1  # the slow link of the overlap case: every collective takes at least this long


def probe_overlap(name: str, cases: Cases) -> dict:
    """The wide model, one step on the machine's own link, then two with every collective slowed to DELAY_S: a hook
    that waits where it launches makes backward wait for every collective; one that does not, for none."""
    b = cases.batches("wide", 3)
    fast_log, slow_log = Collectives(), Collectives(delay_s=DELAY_S)
    with sandbox(cases.timeout_s * 3) as box:
        err = runner = None
        try:
            runner = cases.make(name, "wide")
            runner.timeline.start()
            with fast_log:
                runner.step(b[0], log=fast_log)
            fast = [e["end"] - e["start"] for e in runner.timeline.events if e["kind"] == "backward"]
            runner.timeline.start()
            with slow_log:
                for batch in b[1:]:
                    runner.step(batch, log=slow_log)
            slow = [e["end"] - e["start"] for e in runner.timeline.events if e["kind"] == "backward"]
        except Exception as e:  # noqa: BLE001
            err = e
        outcomes = everyone(outcome(err, cases.files), control())
        box["clean"] = not any(outcomes)
    if any(outcomes):
        return crashed(outcomes)
    launched = sum(c["in_backward"] for c in slow_log.calls) / 2  # per step
    waits = len(slow_log.waits_in_backward) / 2
    slow_ms, fast_ms = 1000 * max(slow), 1000 * max(fast)
    stretched = launched >= 3 and slow_ms - fast_ms >= 800 * DELAY_S * (launched - 1) and slow_ms >= 2 * fast_ms
    if across(waits) > 0 or across(float(stretched)) > 0:
        return mistake(
            "no_overlap", delay_ms=1000 * DELAY_S, waits=f"{max(waits, 1):.0f}", slow_ms=slow_ms, fast_ms=fast_ms
        )
    return {
        **PASS,
        "summary": f"a {1000 * DELAY_S:.0f} ms link: {launched:.0f} collectives launched inside backward, "
        f"none waited for there (backward {slow_ms:.0f} ms, {fast_ms:.0f} ms without the "
        "delay)",
    }


# -------------------------------------------------------------------------------------------- the notebook side

# What each exercise's file must define, and the functions the learner writes (a stub raises NotImplementedError).
EXERCISES = {"overlapped": "DataParallel", "bucketed": "DataParallel", "zero1": "DataParallel", "zero3": "gather"}
SKELETONS = ROOT / "scripts" / "by_hand" / "skeletons"

HINTS = {
    "overlapped": [
        "register_post_accumulate_grad_hook(fn) calls fn(param) once param.grad holds this backward's whole gradient: "
        "register one per parameter in __init__.",
        "dist.all_reduce(tensor, async_op=True) returns a work handle at once; keep every handle, and call .wait() on "
        "them only in sync_gradients, before the optimizer needs the averages.",
        "gloo pairs the n-th all-reduce of every rank. If each hook launched its own gradient, two ranks whose "
        "gradients complete in different orders would pair different tensors: keep a fixed order (reverse parameter "
        "order) and, in each hook, launch every parameter that is next in that order and ready.",
        "A hook that fires for a parameter already marked ready means a second backward before the step: raise a "
        "UserError then (every rank does the same), or accumulate correctly.",
    ],
    "bucketed": [
        "Build the buckets once, in __init__: walk the parameters in reverse, add each to the current bucket, and "
        "start a new bucket once the current one holds at least the cap in bytes (numel x element_size).",
        "Count, per bucket, how many of its gradients are ready; a bucket may leave once the count equals its size "
        "AND every bucket before it has left: the launch order must be the same on every rank.",
        "A bucket's message is one flat tensor: torch.cat of its gradients, reshaped to 1-D, divided by the world "
        "size; launch its all-reduce with async_op=True and keep the buffer with the handle.",
        "In sync_gradients, wait for each bucket in launch order and copy each slice of the flat buffer back into "
        "its parameter's .grad (view_as the parameter), then reset the counters for the next step.",
    ],
    "zero1": [
        "One flat buffer for all parameters, padded so that its length is a multiple of the world size: rank r owns "
        "elements [r * shard, (r + 1) * shard). Make it with the parameters' dtype.",
        "The shard is an nn.Parameter holding a copy of this rank's slice of the flattened weights; the optimizer "
        "is built on it alone, so its AdamW state covers only that slice.",
        "dist.reduce_scatter_tensor(out, flat) sums flat over the ranks and gives each rank only its slice: divide "
        "flat by the world size first; that slice is the shard's .grad.",
        "After optimizer.step(), dist.all_gather_into_tensor(flat, shard) gives every rank every rank's updated "
        "slice, in rank order: copy it back into the parameters.",
    ],
    "zero3": [
        "A block's `full` buffer keeps its shape; only its memory comes and goes: full.untyped_storage().resize_(n) "
        "gives it n bytes (block.nbytes), resize_(0) takes them away.",
        "gather: give the memory back first, then all-gather every rank's shard into full, asynchronously; return "
        "the work (the rung waits for it just before the block computes).",
        "free: the parameters and what autograd saved of them are views into full; resizing its storage to 0 frees "
        "the memory without breaking those views, and the next gather refills them in place.",
    ],
}


def hint(rung: str, n: int = 1) -> None:
    """Print hint n (1, 2, ...) of an exercise, and no other."""
    hints = HINTS.get(rung)
    if not hints:
        raise UserError(f"no hints for {rung!r}: the exercises are {', '.join(HINTS)}")
    if not 1 <= n <= len(hints):
        print(f"{rung} has hints 1 to {len(hints)}.")
        return
    print(f"hint {n} of {len(hints)} ({rung}): {hints[n - 1]}")


def skeleton(rung: str) -> str:
    return (SKELETONS / f"{rung}.py").read_text()


def stubs(path) -> list:
    """The functions and methods of a file whose body still only raises NotImplementedError (a docstring aside)."""
    tree = ast.parse(Path(path).read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            if len(body) == 1 and isinstance(body[0], ast.Raise) and body[0].exc is not None:
                exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
                if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
                    out.append(node.name)
    return out


def status(rung: str, path) -> tuple[str, list]:
    """("blank", stubs) when nothing is written yet (every function of the skeleton still a stub), ("partial", the
    stubs left) or ("written", [])."""
    left = stubs(path)
    if not left:
        return "written", []
    total = len(stubs_of_skeleton(rung))
    return ("blank" if len(left) >= total else "partial"), left


def stubs_of_skeleton(rung: str) -> list:
    return stubs(SKELETONS / f"{rung}.py")


def verdict(res: dict, label: str) -> dict:
    """The first mistake the race found for contender `label` (its check on the tiny and tied models, then each
    probe in order), or PASS; with what passed."""
    passed = []
    for model, contenders in res.get("check", {}).items():
        r = contenders.get(label)
        if r is None:
            continue
        if r.get("verdict", PASS)["ok"] is False:
            return {**r["verdict"], "passed": passed}
        passed.append(
            f"{model} model: {res['steps']} steps equal to torch's DDP (max difference {r['max_weight_diff']:.3g})"
        )
    for name, v in res.get("probes", {}).get(label, {}).items():
        if not v["ok"]:
            return {**v, "passed": passed}
        passed.append(f"{name}: {v.get('summary', 'as torch DDP')}")
    return {**PASS, "passed": passed}


def launch_error_line(err) -> str:
    """A failed launch in one line: the scripts' own message, else the last exception line."""
    lines = [l.strip() for l in str(err).splitlines() if l.strip()]
    first = next((l for l in lines if l.startswith("error:")), None)
    if first:
        rest = []
        for l in lines[lines.index(first) + 1 :]:
            if l.startswith(("error:", "[rank")) or not l:
                break
            rest.append(l)
        return " ".join([first[len("error:") :].strip(), *rest])
    exc = [l for l in lines if "Error" in l or "Exception" in l]
    return (exc[-1] if exc else lines[-1] if lines else "the launch failed")[:300]


def check_exercises(
    items,
    out_dir="outputs/by_hand",
    *,
    timeout: float = 300,
    models="tiny,tied",
    probes=True,
    check_steps: int = 3,
    rungs: str = "",
) -> dict:
    """Check several learner files in ONE launch: items are (rung, path, label). Returns {label: verdict}; a file
    still blank or unfinished gets its verdict without being launched."""
    from .by_hand import run_race
    from .launch import LaunchError

    out, launch = {}, []
    for rung, path, label in items:
        try:
            state, left = status(rung, path)
        except SyntaxError as err:  # the learner's file does not parse: say where, in one line
            out[label] = {
                **mistake("crashed", detail=f"SyntaxError: {err.msg} (line {err.lineno}: {(err.text or '').strip()})"),
                "passed": [],
            }
            continue
        if state == "blank":
            out[label] = {
                "ok": None,
                "mistake": "not_attempted",
                "passed": [],
                "message": f"{rung}: not attempted yet (the skeleton's functions still raise "
                "NotImplementedError): write them in the exercise cell, run it, then this cell",
            }
        elif state == "partial":
            out[label] = {**mistake("not_written", detail=", ".join(left)), "passed": []}
        else:
            launch.append((rung, path, label))
    if not launch:
        return out
    args = ["--rungs", rungs, "--models", models, "--check_only", "--timeout_s", 20, "--check_steps", check_steps]
    for rung, path, label in launch:
        args += ["--exercise", f"{rung}:{path}:{label}"]
    if probes:
        args += ["--probes", "all"]
    json_path = Path(out_dir) / f"check_{launch[0][2]}.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        res = run_race(args, json_path, timeout=timeout)
    except LaunchError as err:
        line = launch_error_line(err)
        for rung, path, label in launch:
            out[label] = {**mistake("crashed", detail=line), "passed": []}
        return out
    for rung, path, label in launch:
        out[label] = verdict(res, label)
    out["_race"] = res
    return out


def check_exercise(
    rung: str, path, out_dir="outputs/by_hand", *, strict: bool = False, timeout: float = 300, probes: bool = True
) -> dict:
    """Run the learner's `rung` (the file at `path`) through the race's check and every probe, against torch's DDP;
    print what passed and, in one line, the first mistake. strict=True (solutions, tests): raise AssertionError
    with that line instead of returning a failed verdict."""
    v = check_exercises([(rung, path, rung)], out_dir, timeout=timeout, probes=probes)[rung]
    for line in v.get("passed", []):
        print(f"✓ {line}")
    if v["ok"] is None:
        print(v["message"])
        if strict:
            raise AssertionError(f"{rung}: not attempted")
    elif not v["ok"]:
        print(f"✗ {v['message']}")
        if strict:
            raise AssertionError(v["message"])
    else:
        print(f"checked: your {rung} trains as torch's DDP does, in every case above")
    return v


def save_json(path, obj) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=1, default=str))
