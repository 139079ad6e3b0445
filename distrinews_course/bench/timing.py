"""Timing on a shared machine: a step timer that skips warm-up, how busy the other processes kept the
CPU, waiting for a quiet moment, and the statistics the benchmarks quote."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

import torch

from distrinews_lib.training.flops import mfu_percent


def sync(device) -> None:
    """Wait for queued GPU work so a wall-clock reading means what it says (no-op on CPU)."""
    if device is not None and getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)


@dataclass
class StepTimer:
    """Times a window of steps after a warm-up: call `step()` after every step with what it processed.

    The clock starts at the end of warm-up step `warmup` (first kernels, allocator, lazy init excluded)
    and counts the next steps. CPU time of this process is recorded too: cpu_s / wall_s well below the
    number of threads means the cores were shared with someone else during the window.
    """

    warmup: int
    device: object = None
    steps: int = 0
    samples: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    flops: float = 0.0
    _t0: float | None = None
    _c0: float | None = None
    _t1: float | None = None
    _c1: float | None = None
    _seen: int = 0

    def step(self, samples: int = 0, tokens: int = 0, padded_tokens: int = 0, flops: float = 0.0) -> None:
        """Call after each step. Steps 1..warmup are not counted; the clock starts when step `warmup` ends.
        With warmup=0, call start_now() before the first step."""
        sync(self.device)
        self._seen += 1
        if self._seen <= self.warmup:
            if self._seen == self.warmup:
                self._t0, self._c0 = time.perf_counter(), time.process_time()
            return
        if self._t0 is None:
            raise RuntimeError("StepTimer(warmup=0): call start_now() before the first step")
        self.steps += 1
        self.samples += samples
        self.tokens += tokens
        self.padded_tokens += padded_tokens
        self.flops += flops
        self._t1, self._c1 = time.perf_counter(), time.process_time()

    def start_now(self) -> None:
        """Start the clock explicitly (for warmup=0 timing of a block run by someone else)."""
        sync(self.device)
        self._t0, self._c0 = time.perf_counter(), time.process_time()

    def stop_now(self) -> None:
        sync(self.device)
        self._t1, self._c1 = time.perf_counter(), time.process_time()

    @property
    def seconds(self) -> float:
        return (self._t1 - self._t0) if self._t0 is not None and self._t1 is not None else 0.0

    def result(self) -> dict:
        s = self.seconds
        return {
            "steps": self.steps,
            "samples": self.samples,
            "tokens": self.tokens,
            "padded_tokens": self.padded_tokens,
            "seconds": round(s, 6),
            "samples_per_s": self.samples / s if s > 0 else 0.0,
            "tokens_per_s": self.tokens / s if s > 0 else 0.0,
            "padding_fraction": 1 - self.tokens / self.padded_tokens if self.padded_tokens else None,
            "model_tflops": self.flops / s / 1e12 if s > 0 and self.flops else None,
            "cpu_s": round(self._c1 - self._c0, 6) if self._c0 is not None and self._c1 is not None else None,
        }


def _cpu_ticks() -> list[int] | None:
    """The whole machine's CPU time counters since boot, in clock ticks (Linux /proc/stat's first line), or None."""
    try:
        fields = open("/proc/stat").readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    return [int(x) for x in fields[1:9]]


def cpu_busy_seconds() -> float | None:
    """CPU-seconds the whole machine has been busy since boot (all cores; Linux /proc/stat), or None.

    Busy = user + nice + system + irq + softirq + steal (steal: a hypervisor gave our vCPU to someone else)."""
    ticks = _cpu_ticks()
    if ticks is None:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = ticks
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def kernel_seconds() -> float | None:
    """CPU-seconds the whole machine has spent in the kernel since boot (system + irq + softirq: among them the
    network stack's work for every byte sent, and a tc filter's), or None without /proc/stat."""
    ticks = _cpu_ticks()
    if ticks is None:
        return None
    system, irq, softirq = ticks[2], ticks[5], ticks[6]
    return (system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """A live process's CPU-seconds so far, all its threads (Linux /proc/PID/stat: utime + stime); 0 where unread."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def foreign_cores(
    busy_before: float | None, busy_after: float | None, own_cpu_s: float, seconds: float
) -> float | None:
    """Average number of cores that *other* processes kept busy during a window of `seconds`."""
    if busy_before is None or busy_after is None or seconds <= 0:
        return None
    return max(0.0, (busy_after - busy_before - own_cpu_s) / seconds)


def wait_for_quiet(max_foreign_cores: float = 0.3, sample_s: float = 0.5, timeout_s: float = 15.0) -> dict:
    """Wait (up to timeout_s) until the other processes on this machine use at most `max_foreign_cores`.

    Call it while this process is idle: everything /proc/stat counts as busy then is someone else's.
    Returns {'waited_s', 'foreign_cores'} (the last sample)."""
    start = time.perf_counter()
    load = None
    while True:
        b0 = cpu_busy_seconds()
        if b0 is None:
            return {"waited_s": 0.0, "foreign_cores": None}
        c0 = time.process_time()
        time.sleep(sample_s)
        load = foreign_cores(b0, cpu_busy_seconds(), time.process_time() - c0, sample_s)
        waited = time.perf_counter() - start
        if load <= max_foreign_cores or waited >= timeout_s:
            return {"waited_s": round(waited, 2), "foreign_cores": round(load, 3)}


class QuietGate:
    """wait_for_quiet with a total budget, so waiting for a shared CPU can never make a run much longer."""

    def __init__(self, max_foreign_cores: float = 0.3, timeout_each_s: float = 4.0, budget_s: float = 60.0):
        self.max_foreign_cores, self.timeout_each_s, self.budget_s = max_foreign_cores, timeout_each_s, budget_s
        self.spent_s = 0.0

    def wait(self) -> dict | None:
        left = min(self.timeout_each_s, self.budget_s - self.spent_s)
        if left <= 0:
            return None
        out = wait_for_quiet(self.max_foreign_cores, timeout_s=left)
        self.spent_s += out["waited_s"]
        return out


def summary(values) -> dict:
    """median / min / max / n of a list of numbers (the median is what the benchmarks quote)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


# Rounds whose spread is above this cannot check a bound of 15%: a virtual machine's host moved whole runs (its other
# guests share the physical cores, and nothing inside the VM shows it). Chapters 03, 05 and 08 show them with a NOTE.
NOISY_SPREAD = 0.30


def rounds_spread(values) -> float:
    """How far repeated rounds of one measurement disagree: their range, as a share of their median."""
    vals = [float(v) for v in values]
    return (max(vals) - min(vals)) / statistics.median(vals)


def middle_spread(values) -> float:
    """How far the repetitions that set a median disagree: rounds_spread of the middle ones, the fastest and the
    slowest dropped where there are 5 or more. A median of 5 lies between the 2nd and 4th (62% of the time for any
    distribution), so one stray repetition, which cannot move the median, does not decide whether it is checked."""
    vals = sorted(float(v) for v in values)
    return rounds_spread(vals[1:-1] if len(vals) >= 5 else vals)


def checked_margin(bound: float, spread: float, times: float = 1.0) -> float | None:
    """The share a measurement is checked within: `bound`, or `times` the rounds' own spread where wider; None (shown,
    not checked) where the spread is above NOISY_SPREAD."""
    return None if spread > NOISY_SPREAD else max(bound, times * spread)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def format_rate(
    samples_per_s: float, tokens_per_s: float, tflops: float | None = None, mfu_value: float | None = None
) -> str:
    """'1234 samples/s | 56789 tokens/s | 0.12 TFLOP/s | MFU 34.5%' (MFU only where the peak is known)."""
    out = f"{samples_per_s:8.1f} samples/s | {tokens_per_s:9.0f} tokens/s"
    if tflops is not None:
        out += f" | {tflops:.3f} TFLOP/s"
    if mfu_value is not None:
        out += f" | MFU {mfu_percent(mfu_value)}"
    return out
