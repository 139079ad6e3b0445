"""Chapter 05's cost model of DDP, built from what this machine measures.

    rows = time_collectives(sizes)              # on every rank of a process group: all_reduce over message sizes
    fit = fit_alpha_beta(rows)                  # t(S) = alpha + S / bandwidth
    with StepClock() as clock: ...              # around a training run: each optimizer step's parts, on this rank
    parts = breakdown(every_ranks_events, first_step, steps)
    predict_ddp_step(single_parts, n, comm_s)   # a DDP step from a 1-process step and the fit

Bytes on the wire are counted, not assumed: /proc/self/io's `wchar` grows by every byte a process writes,
sockets included, so the change around a collective is what this rank sent (gloo talks TCP).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from .proc_self import bytes_written, other_threads_cpu_s
from .ring import wire_bytes

# --------------------------------------------------------------------------- collectives, measured


def ring_bytes_per_rank(nbytes: float, n: int) -> float:
    """What each rank sends in a ring all-reduce of `nbytes`: a reduce-scatter ((n-1)/n), then an all-gather (same)."""
    return wire_bytes("all_reduce", nbytes, n)


def ring_schedule(n: int) -> list[list[tuple[int, int, int, str]]]:
    """A ring all-reduce of N chunks over N ranks, step by step: 2(N-1) steps, in each of which every rank sends ONE
    chunk (S/N bytes) to the next rank, as (sender, receiver, chunk, phase). In the reduce-scatter (the first N-1
    steps) rank r sends chunk r - s and the receiver adds it to its own, so that rank r ends owning the sum of chunk
    r + 1; in the all-gather (N-1 more) it passes the summed chunks on, which the receiver keeps."""
    if n < 2:
        raise ValueError(f"a ring needs at least 2 ranks, not {n}")
    reduce = [[(r, (r + 1) % n, (r - s) % n, "reduce-scatter") for r in range(n)] for s in range(n - 1)]
    gather = [[(r, (r + 1) % n, (r + 1 - s) % n, "all-gather") for r in range(n)] for s in range(n - 1)]
    return reduce + gather


def _timed(op, reps: int) -> tuple[list[float], float | None]:
    """Seconds of each of `reps` calls of `op` (the slowest rank's, each time) and the bytes this rank wrote a call."""
    return _timed_interleaved({0: op}, {0: reps})[0]


def interleaved_order(reps: dict) -> list:
    """The order in which to time the repetitions of several messages ({key: reps}): round r times one call of every
    key that still needs a repetition, so a burst of other programs lands on several sizes, never on all of one
    size's repetitions (the spread guard then sees it), e.g. {a: 2, b: 1} -> [a, b, a]."""
    left, order = dict(reps), []
    while any(left.values()):
        for key in left:
            if left[key]:
                order.append(key)
                left[key] -= 1
    return order


def _timed_interleaved(ops: dict, reps: dict) -> dict:
    """{key: (seconds of each repetition, the slowest rank's; the bytes this rank wrote a call)} of each op in `ops`
    ({key: callable}), their repetitions interleaved (interleaved_order). Every rank runs the same order."""
    for op in ops.values():
        op()  # connect and warm up
    times, written = {k: [] for k in ops}, {k: [] for k in ops}
    for key in interleaved_order(reps):
        dist.barrier()
        w0, t0 = bytes_written(), time.perf_counter()
        ops[key]()
        t1, w1 = time.perf_counter(), bytes_written()
        times[key].append(t1 - t0)
        if w0 is not None and w1 is not None:
            written[key].append(w1 - w0)
    out = {}
    for key in ops:
        slowest = torch.tensor(times[key], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a collective is over when its last rank is done
        out[key] = slowest.tolist(), (statistics.median(written[key]) if written[key] else None)
    return out


def reps_for(nbytes: int) -> int:
    """More repetitions of small messages (cheap, noisy); at least 5 of the largest (cheap next to a training run), so
    that their median outlasts one burst of other programs and their spread says how much the run moved."""
    return max(5, min(20, (1 << 26) // max(nbytes, 1)))


def _row(op: str, nbytes: int, times: list[float], sent: float | None) -> dict:
    return {"op": op, "bytes": nbytes, "seconds": statistics.median(times), "times": times, "sent": sent}


def time_collectives(sizes, halves_at: int | None = None) -> list[dict]:
    """On every rank: time all_reduce of each size (bytes of fp32; the sizes' repetitions interleaved, round by round,
    so that one burst of load spreads over sizes), and, at `halves_at` bytes, the ring's two halves
    (reduce_scatter and all_gather). Returns rows {op, bytes, seconds, times, sent}: the median of the repetitions'
    times, each repetition's time, and the bytes this rank wrote per call."""
    n = dist.get_world_size()
    xs = {size: torch.ones(max(1, size // 4)) for size in sizes}
    ops = {size: (lambda x=x: dist.all_reduce(x)) for size, x in xs.items()}
    timed = _timed_interleaved(ops, {size: reps_for(size) for size in sizes})  # sizes' repetitions interleaved
    rows = [_row("all_reduce", xs[size].numel() * 4, *timed[size]) for size in sizes]
    if halves_at:
        x = torch.ones(halves_at // 4 // n * n)
        part = torch.empty(x.numel() // n)
        for op, fn in (
            ("reduce_scatter", lambda: dist.reduce_scatter_tensor(part, x)),
            ("all_gather", lambda: dist.all_gather_into_tensor(x, part)),
        ):
            rows.append(_row(op, x.numel() * 4, *_timed(fn, reps_for(halves_at))))
    return rows


@dataclass
class Fit:
    alpha_s: float  # latency: the time of an empty all-reduce
    beta_s_per_byte: float

    @property
    def bandwidth(self) -> float:
        """Bytes of message per second, once latency no longer matters."""
        return 1 / self.beta_s_per_byte

    def seconds(self, nbytes: float, messages: int = 1) -> float:
        """The time of all-reducing `nbytes` split into `messages` all-reduces, one after another."""
        return messages * self.alpha_s + nbytes * self.beta_s_per_byte


def fit_alpha_beta(rows) -> Fit:
    """Least squares of t = alpha + beta S on the relative error, so that 4 KB weighs as much as 256 MB."""
    pts = [(r["bytes"], r["seconds"]) for r in rows if r.get("op", "all_reduce") == "all_reduce"]
    # minimise sum(((alpha + beta S) - t) / t)^2: the normal equations of a weighted linear fit
    w = [1 / t**2 for _, t in pts]
    sw, sx, sy = sum(w), sum(wi * s for wi, (s, _) in zip(w, pts)), sum(wi * t for wi, (_, t) in zip(w, pts))
    sxx, sxy = sum(wi * s * s for wi, (s, _) in zip(w, pts)), sum(wi * s * t for wi, (s, t) in zip(w, pts))
    det = sw * sxx - sx * sx
    beta = (sw * sxy - sx * sy) / det
    alpha = (sy - beta * sx) / sw
    return Fit(max(alpha, 0.0), beta)


# --------------------------------------------------------------------------- one rank's step, timed by hooks

PARTS = ("data", "forward", "backward", "comm", "clip", "optimizer")


class StepClock:
    """Timestamps of each training step's events on this rank, from global hooks (the script runs unchanged):

    fwd_start / fwd_end  the outermost module's forward (with gradients on: evaluation is not timed)
    bwd_end              the autograd graph is done (a callback queued when the loss's gradient is computed)
    bwd_return           backward() is about to return: after DDP has waited for its all-reduces
    opt_start / opt_end  the optimizer step
    cpu_fwd_start / cpu_bwd_end  the CPU time of this process's other threads (gloo's) at fwd_start and bwd_end
    """

    def __init__(self):
        self.events: list = []
        self.written: list = []  # bytes this process had written at the end of each optimizer step
        self._depth = 0
        self._handles: list = []

    def _mark(self, name):
        self.events.append((name, time.perf_counter()))

    def _pre(self, module, args):
        if self._depth == 0 and torch.is_grad_enabled():
            self._mark("fwd_start")
            self.events.append(("cpu_fwd_start", other_threads_cpu_s()))
        self._depth += 1

    def _post(self, module, args, output):
        self._depth -= 1
        if self._depth == 0 and torch.is_grad_enabled():
            self._mark("fwd_end")
            loss = getattr(output, "loss", None)
            if isinstance(loss, torch.Tensor) and loss.requires_grad:
                loss.register_hook(self._on_loss_grad)  # the first thing backward computes

    def _on_loss_grad(self, grad):
        engine = torch.autograd.Variable._execution_engine
        # Callbacks run in the order queued, after the graph: ours first, then DDP's (it queues its own later,
        # during backward), which waits for the all-reduces; the one we queue from ours runs after DDP's.
        engine.queue_callback(
            lambda: (
                self._mark("bwd_end"),
                self._helpers_cpu(),
                engine.queue_callback(lambda: self._mark("bwd_return")),
            )
        )

    def _helpers_cpu(self):
        self.events.append(("cpu_bwd_end", other_threads_cpu_s()))

    def __enter__(self):
        self._handles = [
            register_module_forward_pre_hook(self._pre),
            register_module_forward_hook(self._post),
            register_optimizer_step_pre_hook(lambda *_: self._mark("opt_start")),
            register_optimizer_step_post_hook(self._step_done),
        ]
        return self

    def _step_done(self, *_):
        self._mark("opt_end")
        self.written.append(bytes_written())

    def written_per_step(self, first_step: int, steps: int) -> float | None:
        """Bytes written per optimizer step over steps first_step+1 .. first_step+steps: on a DDP rank, its
        all-reduces' traffic (the script writes nothing else while it trains)."""
        w = self.written[first_step - 1 : first_step + steps] if first_step >= 1 else []
        if len(w) < steps + 1 or None in (w[0], w[-1]):
            return None
        return (w[-1] - w[0]) / steps

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []


def steps_of(events) -> list[dict]:
    """Split one rank's events into steps: {event: time}, a step ending at its optimizer step's end.
    A step that did not see each event exactly once (accumulation, a skipped forward) is marked incomplete."""
    steps, current, prev_end = [], {}, None
    for name, t in events:
        if name == "opt_end":
            current["opt_end"] = t
            current["prev_end"] = prev_end
            current["complete"] = prev_end is not None and all(
                k in current for k in ("fwd_start", "fwd_end", "bwd_end", "bwd_return", "opt_start")
            )
            steps.append(current)
            current, prev_end = {}, t
        elif name in current:
            current["duplicate"] = True
        else:
            current[name] = t
    for s in steps:
        s["complete"] = s["complete"] and not s.pop("duplicate", False)
    return steps


def step_times(events, first_step: int, steps: int) -> list[float]:
    """One rank's optimizer steps first_step+1 .. first_step+steps, each in seconds (from the previous step's end)."""
    return [s["opt_end"] - s["prev_end"] for s in steps_of(events)[first_step : first_step + steps]]


def breakdown(ranks_events, first_step: int, steps: int) -> list[dict]:
    """Mean seconds per step of each part on each rank, over optimizer steps first_step+1 .. first_step+steps
    (the harness's timed window: after `first_step` warm-up steps). The parts tile the step:
    data (end of the last optimizer step to the forward: zero_grad, the loader, the copy), forward, backward
    (compute), comm (backward done to backward returning: DDP waiting for its all-reduces), split into `waiting`
    (until the slowest rank had finished its backward too) and `transfer` (the rest), clip (clipping and
    bookkeeping up to the optimizer step) and optimizer; beside them, not part of the tiling, helpers_cpu (the CPU
    time this rank's other threads, gloo's, used while its forward and backward ran)."""
    per_rank = [steps_of(ev)[first_step : first_step + steps] for ev in ranks_events]
    if any(len(s) < steps for s in per_rank) or not all(st["complete"] for s in per_rank for st in s):
        raise ValueError("the step clock did not see every event of every timed step (accumulation is not supported)")
    out = []
    for r, rank_steps in enumerate(per_rank):
        acc = {p: 0.0 for p in (*PARTS, "waiting", "transfer", "helpers_cpu", "step")}
        for k, st in enumerate(rank_steps):
            last_bwd = max(other[k]["bwd_end"] for other in per_rank)  # the all-reduce's last bucket can start then
            parts = {
                "data": st["fwd_start"] - st["prev_end"],
                "forward": st["fwd_end"] - st["fwd_start"],
                "backward": st["bwd_end"] - st["fwd_end"],
                "comm": st["bwd_return"] - st["bwd_end"],
                "clip": st["opt_start"] - st["bwd_return"],
                "optimizer": st["opt_end"] - st["opt_start"],
                "step": st["opt_end"] - st["prev_end"],
            }
            parts["waiting"] = min(max(0.0, last_bwd - st["bwd_end"]), parts["comm"])
            parts["transfer"] = parts["comm"] - parts["waiting"]
            # gloo's threads' CPU while this rank's forward and backward ran: on a core of the model's
            cpu = (st.get("cpu_fwd_start"), st.get("cpu_bwd_end"))
            parts["helpers_cpu"] = cpu[1] - cpu[0] if None not in cpu else 0.0
            for p, v in parts.items():
                acc[p] += v
        out.append({p: v / steps for p, v in acc.items()})
    return out


# --------------------------------------------------------------------------- predictions


def others_cores(run: dict) -> float | None:
    """Cores other programs kept busy during one run of scripts/bench_runs.py, from its ranks' records: the
    machine's busy CPU over the longest rank's window, less the CPU every rank of ours used (a rank that
    finished early sat idle for the rest of it). None where /proc/stat is missing."""
    ranks = run["ranks"]
    longest = max(ranks, key=lambda r: r["seconds"])
    if longest.get("foreign_cores") is None:
        return None
    ours = sum(r["cpu_s"] for r in ranks if r is not longest)
    return max(0.0, longest["foreign_cores"] - ours / longest["seconds"])


def spread(run: dict) -> float:
    """How far apart the ranks of one run were: the slowest rank's time over the fastest's, minus one. For the
    `pair` runs (the same work on every rank at once) it is how differently this machine's cores ran."""
    times = [r["seconds"] / r["steps"] for r in run["ranks"]]
    return max(times) / min(times) - 1


def predict_ddp_step(single: dict, n: int, comm_s: float) -> dict:
    """A DDP step of n ranks (each b examples) from a 1-process step of n*b examples: the per-example work
    (data, forward, backward) splits n ways; every rank repeats the per-step work (clipping and the optimizer
    over all parameters); the all-reduce adds its time (on one core per process it competes with compute, so
    it is counted whole)."""
    per_example = single["data"] + single["forward"] + single["backward"]
    repeated = single["clip"] + single["optimizer"]
    step = per_example / n + repeated + comm_s
    return {
        "per_example": per_example / n,
        "repeated": repeated,
        "comm": comm_s,
        "step": step,
        "speedup": (per_example + repeated) / step,
    }


def best_bucket_mb(fit: Fit, grad_bytes: float, backward_s: float, last_tensor_bytes: float, caps_mb) -> dict:
    """Exposed communication per step for each bucket cap, in a simple model: buckets fill evenly during
    backward; each all-reduce costs alpha + beta*bytes, one at a time; a bucket cannot start before it is
    full, nor before the previous one is done; whatever runs past the end of backward is exposed. A tensor
    is never split, so the last tensor the backward produces (here the embedding, the model's first layer)
    is always a bucket of its own at the very end."""
    out = {}
    for cap in caps_mb:
        cap_b = cap * 2**20
        rest = max(grad_bytes - last_tensor_bytes, 0.0)
        sizes = [cap_b] * int(rest // cap_b) + ([rest % cap_b] if rest % cap_b else [])
        ready, free = 0.0, 0.0
        for s in sizes:
            ready += backward_s * s / grad_bytes
            free = max(free, ready) + fit.seconds(s)
        free = max(free, backward_s) + fit.seconds(last_tensor_bytes)
        out[cap] = free - backward_s
    return out


# --------------------------------------------------------------------------- chapter 05's exercise 1


def grade_allreduce_ms(fn, fits: dict, sizes: list[int]) -> str | None:
    """The learner's allreduce_ms(nbytes, n, alpha_ms, gb_per_s) against the fitted model at every n of `fits`
    ({n: Fit}) and every size: None if it matches, else one line naming the mistake. gb_per_s is what each rank's link
    carries, so the fit's bandwidth of message is 2(n-1)/n times smaller: at n = 2 the factor is 1, which is why n = 4
    is checked too."""
    for n, f in sorted(fits.items()):
        gb_s = ring_bytes_per_rank(1, n) * f.bandwidth / 1e9
        for nbytes in sizes:
            try:
                yours = fn(nbytes, n, 1000 * f.alpha_s, gb_s)
            except Exception as err:  # noqa: BLE001  (a learner's bug: named, not a traceback)
                return f"exercise 1: allreduce_ms raised {type(err).__name__}: {err}"
            want = 1000 * f.seconds(nbytes)
            if yours is None:  # a branch without a return: a mistake, never a pass
                return (
                    f"exercise 1: allreduce_ms({nbytes} bytes, n={n}) returned None: every input needs its time in ms "
                    "(a path through the function without a return?)"
                )
            if abs(yours - want) <= 0.01 * want + 1e-6:
                continue
            alpha_ms, bytes_ms = 1000 * f.alpha_s, 1000 * (f.seconds(nbytes) - f.alpha_s)
            close = lambda a, b: abs(a - b) <= 0.02 * abs(b) + 1e-6  # noqa: E731
            if close(yours, alpha_ms + bytes_ms / ring_bytes_per_rank(1, n)):
                why = "the ring factor 2(n-1)/n is missing (at n = 2 it is 1, so it only shows at n = 4)"
            elif close(yours, bytes_ms):
                why = "alpha is missing: every all-reduce pays it once, whatever its size"
            elif close(yours, n * alpha_ms + bytes_ms):
                why = "alpha is paid once per all-reduce, not once per rank"
            elif any(close(yours / want, k) for k in (1e3, 1e-3, 2**30 / 1e9, 1e9 / 2**30)):
                why = "the units: gb_per_s is 1e9 bytes per second, and the answer is in milliseconds"
            else:
                why = "take it apart: the latency term against the fit's alpha, the bytes term against the rest"
            return (
                f"exercise 1: allreduce_ms({nbytes} bytes, n={n}) = {yours:.3f} ms, the fit says {want:.3f} ms: {why}"
            )
    return None
