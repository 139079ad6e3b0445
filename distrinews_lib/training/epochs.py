"""An epoch of the scripts' loop, what it goes through and what it counts: the micro-batches of each optimizer step
(accumulate), moved to the device, and the epoch's meter (loss, samples, tokens, time; a NaN stops the run with its
step, found where the meter is read: at a snapshot and at the epoch's end), summed over the ranks once at the end.
The loop itself is written out in the scripts."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from ..errors import UserError
from ..process_group.collectives import all_reduce_sum, comm_device
from ..process_group.ranks import get_world_size, is_initialized, is_main
from .flops import mfu_percent
from .precision import AmpSettings


def steps_per_epoch(batches_per_epoch: int, grad_accum: int, limit: int | None = None) -> int:
    """Optimizer steps in one epoch: one per group of grad_accum micro-batches (the last group may be short)."""
    steps = math.ceil(batches_per_epoch / grad_accum)
    return min(steps, limit) if limit else steps


HOST_ONLY = ("index",)  # the rows' numbers: only evaluation reads them, on the host; a step need not copy them


def to_device(batch: dict, device: torch.device, non_blocking: bool = False) -> dict:
    return {k: v.to(device, non_blocking=non_blocking) for k, v in batch.items() if k not in HOST_ONLY}


def _progress(iterable, total: int, enabled: bool, desc: str):
    if not enabled:
        return iterable
    tty = sys.stdout.isatty()
    # Piped into a notebook cell by the launcher, redraw less often so the cell stays readable.
    return tqdm(
        iterable,
        total=total,
        desc=desc,
        leave=True,
        dynamic_ncols=tty,
        ncols=None if tty else 90,
        mininterval=0.5 if tty else 2.0,
        file=sys.stdout,
    )


def accumulate(
    loader, grad_accum: int, *, skip: int = 0, limit: int | None = None, progress: bool = False, desc: str = "train"
):
    """Yield the micro-batches of each optimizer step, `grad_accum` at a time (the last may be shorter).
    skip: batches trained on before a resume; limit: optimizer steps (benchmarks)."""
    if skip % grad_accum:
        raise UserError(
            f"cannot resume {skip} batches into an epoch with --grad_accum {grad_accum}: that is inside "
            "an accumulation group. Resume with the --grad_accum the snapshot was taken with."
        )
    total = steps_per_epoch(len(loader), grad_accum, limit)

    def groups():
        group, done = [], 0
        for i, batch in enumerate(loader):
            if i < skip:
                continue  # the same order as before the resume: these were trained on already
            group.append(batch)
            if len(group) == grad_accum:
                yield group
                group, done = [], done + 1
                if limit and done >= limit:
                    return
        if group:
            yield group

    yield from _progress(groups(), total - skip // grad_accum, progress and is_main(), desc)


@dataclass
class EpochStats:
    loss: float  # mean training loss over every sample of every rank
    samples: int  # over all ranks
    tokens: int  # real (non-pad) tokens, over all ranks
    padded_tokens: int  # tokens including padding, over all ranks
    sum_sq_len: int  # Σ (text length)², over all ranks: attention's FLOPs grow with it
    optimizer_steps: int
    seconds: float
    samples_per_s: float
    tokens_per_s: float
    lr: float
    resumed: bool = False  # part of this epoch ran before a restart (its counters were restored)
    step_losses: list = None  # this rank's mean loss of each optimizer step (for the experiment tracker's curve)


class NonFiniteLoss(UserError):
    """The training loss or gradient norm became NaN or infinite."""


class _DeviceLog:
    """Scalars written on the device as the loop runs, into buffers allocated CHUNK at a time: appending is one copy
    kernel, never a host sync; values() reads them back once."""

    def __init__(self, device: torch.device, chunk: int):
        self.device, self.chunk, self.full, self.n = device, chunk, [], 0
        self.buffer = None

    def append(self, value: torch.Tensor) -> None:
        i = self.n % self.chunk
        if i == 0:
            if self.buffer is not None:
                self.full.append(self.buffer)
            self.buffer = torch.empty(self.chunk, dtype=torch.float32, device=self.device)
        self.buffer[i].copy_(value)  # float32 holds a float32, bf16 or fp16 loss exactly
        self.n += 1

    def values(self) -> list:
        if not self.n:
            return []
        return torch.cat([*self.full, self.buffer])[: self.n].tolist()


class EpochMeter:
    """The epoch's counters, kept so that the loop never waits for the GPU and launches as little as it can: each
    micro-batch's loss and each step's gradient norm are copied into a preallocated device buffer (one copy kernel
    each, no host sync); samples and tokens are counted on the CPU copy of the batch. Everything is read back once,
    in finish() (and at a snapshot): the sums, each step's mean loss, and the first step whose loss or gradient
    norm was NaN or infinite (exact, however late it is read)."""

    CHUNK = 1024  # buffer entries allocated at a time

    def __init__(self, device: torch.device, amp: AmpSettings, epoch: int, state: dict | None = None):
        self.device, self.epoch = device, epoch
        self.grad_overflow_is_normal = amp.use_scaler  # fp16: GradScaler skips such steps by design
        self.loss_sum_before = 0.0  # float64 sum of loss x samples before a resume
        self.samples = self.tokens = self.padded = self.sum_sq = self.steps = self.batches = 0
        self.seconds_before = 0.0  # time spent on this epoch before a resume
        self._losses, self._norms = _DeviceLog(device, self.CHUNK), _DeviceLog(device, self.CHUNK)
        self._sizes, self._loss_step, self._norm_step = [], [], []  # per logged value: samples, its 1-based step
        self.resumed = state is not None
        if state:
            self.loss_sum_before = float(state["loss_sum"])
            for k in self.PER_RANK + self.SUMMED[1:]:
                setattr(self, k, int(state[k]))
            self.seconds_before = float(state["seconds"])
        self.start = time.perf_counter()

    SUMMED = ("loss_sum", "samples", "tokens", "padded", "sum_sq")  # over the ranks: the epoch's totals
    PER_RANK = ("steps", "batches")  # every rank takes every step

    def add(self, loss: torch.Tensor, cpu_batch: dict) -> None:
        mask = cpu_batch["attention_mask"]
        lengths = mask.sum(1)
        n = int(mask.shape[0])
        self._losses.append(loss.detach())  # a copy: the loss may live in a CUDA graph's output, reused next step
        self._sizes.append(n)
        self._loss_step.append(self.steps + 1)
        self.samples += n
        self.tokens += int(lengths.sum())
        self.padded += mask.numel()
        self.sum_sq += int((lengths * lengths).sum())
        self.batches += 1

    def step(self, grad_norm: torch.Tensor | None = None) -> None:
        self.steps += 1
        if grad_norm is not None and not self.grad_overflow_is_normal:
            self._norms.append(grad_norm.detach())
            self._norm_step.append(self.steps)

    def _read(self) -> tuple[list, list]:
        """This epoch's logged losses and gradient norms, on the host (one device-to-host copy each)."""
        return self._losses.values(), self._norms.values()

    def _first_bad_step(self, losses: list, norms: list) -> int | None:
        bad = [s for v, s in zip(losses, self._loss_step) if not math.isfinite(v)]
        bad += [s for v, s in zip(norms, self._norm_step) if not math.isfinite(v)]
        return min(bad) if bad else None

    @property
    def loss_sum(self) -> float:
        """Σ loss x samples in float64, added in the loop's order (a resumed epoch's sum continues the same way)."""
        total = self.loss_sum_before
        for value, n in zip(self._read()[0], self._sizes):
            total += value * n
        return total

    @property
    def seconds(self) -> float:
        return self.seconds_before + time.perf_counter() - self.start

    def check_finite(self) -> None:
        """Raise NonFiniteLoss on every rank if any rank saw a NaN/inf (one small all-reduce, one sync)."""
        first = self._first_bad_step(*self._read())
        never = torch.iinfo(torch.long).max
        bad = torch.tensor(never if first is None else first, dtype=torch.long, device=comm_device(self.device))
        if is_initialized() and get_world_size() > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MIN)
        if int(bad) != never:
            raise NonFiniteLoss(
                f"the training loss (or gradient) became NaN or infinite at optimizer step {int(bad)} of epoch "
                f"{self.epoch}; training stopped and nothing was saved. Lower the learning rate (--lr), or turn mixed "
                "precision off (--amp off) if it is on."
            )

    def state_dict(self) -> dict:
        """This rank's partial counters, for a snapshot taken mid-epoch."""
        state = {k: getattr(self, k) for k in self.SUMMED + self.PER_RANK}
        return {**state, "seconds": self.seconds}

    def step_losses(self) -> list:
        """This rank's mean loss of each optimizer step of this run, as the loop used to sum it on the device: in
        float32, loss x samples added micro-batch by micro-batch, then divided by the step's samples."""
        sums: dict = {}
        for value, n, step in zip(self._read()[0], self._sizes, self._loss_step):
            acc, count = sums.get(step, (np.float32(0.0), 0))
            sums[step] = (np.float32(acc + np.float32(value) * np.float32(n)), count + n)
        return [float(np.float32(acc / np.float32(max(count, 1)))) for acc, count in sums.values()]

    def finish(self, lr: float) -> EpochStats:
        """The epoch's totals over every rank (one small all-reduce)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.check_finite()
        seconds = self.seconds
        comm = comm_device(self.device)
        totals = all_reduce_sum(
            torch.tensor(
                [
                    float(self.loss_sum),
                    self.samples,
                    self.tokens,
                    self.padded,
                    self.sum_sq,
                    seconds / get_world_size(),
                ],
                dtype=torch.float64,
                device=comm,
            )
        )
        loss_sum, samples, tokens, padded, sum_sq, seconds = totals.tolist()
        step_losses = self.step_losses()
        return EpochStats(
            loss=loss_sum / max(samples, 1),
            samples=int(samples),
            tokens=int(tokens),
            padded_tokens=int(padded),
            sum_sq_len=int(sum_sq),
            optimizer_steps=self.steps,
            seconds=seconds,
            samples_per_s=samples / seconds if seconds else 0.0,
            tokens_per_s=tokens / seconds if seconds else 0.0,
            lr=lr,
            resumed=self.resumed,
            step_losses=step_losses,
        )


def epoch_line(epoch: int, epochs: int, train: EpochStats, val, mfu: float | None = None) -> str:
    """One line per epoch; `val` is the task's evaluation result (evaluation.ClassifierEval, lm.task.LMEval), which
    says its own metric."""
    return (
        f"epoch {epoch}/{epochs} | train loss {train.loss:.4f} | val loss {val.loss:.4f} | "
        f"{val.metric_line()} | {train.seconds:.1f}s | "
        f"{train.samples_per_s:.0f} samples/s"
        + (f" | MFU {mfu_percent(mfu)}" if mfu is not None else "")
        + (" | resumed mid-epoch" if train.resumed else "")
    )
