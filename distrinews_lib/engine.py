"""What the training scripts' loop leans on but is not the lesson: devices and precision, the optimizer
and schedule, accumulation groups, the epoch's counters, and evaluation that is exact under DDP.

The loop itself (forward, backward, clipping, the optimizer step) is written out in scripts/train_single.py
and scripts/train_ddp.py, where a learner can read it.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import distributed as D
from .checkpoint import unwrap
from .errors import UserError

AMP_MODES = ("auto", "fp16", "bf16", "off")


# --------------------------------------------------------------------------- devices and precision

def pick_device(requested: str = "auto") -> torch.device:
    """cuda:0 when there is a GPU (or when asked), else cpu."""
    if requested in ("auto", None):
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {requested}: no CUDA GPU is visible here. Use --device cpu or auto.")
    return torch.device(requested)


@dataclass
class AmpSettings:
    mode: str                 # what was resolved: "fp16", "bf16" or "off"
    dtype: torch.dtype | None
    use_scaler: bool          # fp16 needs a GradScaler: its gradients underflow without loss scaling
    reason: str

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    def autocast(self, device: torch.device):
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.dtype)


def native_bf16(device: torch.device) -> bool:
    """bf16 in hardware: compute capability 8.0+ (A100, L4, H100). is_bf16_supported() also says yes on a
    T4 (7.5), where bf16 is emulated and slow (pytorch PR #148322), so the capability decides."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def resolve_amp(mode: str, device: torch.device) -> AmpSettings:
    """auto: bf16 on GPUs with native bf16 (A100, H100), fp16 + GradScaler below (T4, V100), off on CPU."""
    if mode not in AMP_MODES:
        raise UserError(f"unknown --amp '{mode}'. Choices: {', '.join(AMP_MODES)}.")
    on_cuda = device.type == "cuda"
    if mode == "off":
        return AmpSettings("off", None, False, "AMP off (asked for)")
    if mode == "fp16":
        if not on_cuda:
            raise UserError("--amp fp16 needs a CUDA GPU (fp16 autocast with a GradScaler); this run is on the CPU. "
                            "Use --amp off (or bf16, which CPUs can autocast), or run on a GPU.")
        return AmpSettings("fp16", torch.float16, True, "fp16 autocast with GradScaler (asked for)")
    if mode == "bf16":
        if on_cuda and not native_bf16(device):
            name, cap = torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)
            raise UserError(f"--amp bf16: {name} (compute capability {cap[0]}.{cap[1]}) has no bf16 in hardware; torch "
                            "would emulate it, slower than fp32. Use --amp fp16 (or auto, which picks fp16 with a "
                            "GradScaler here).")
        return AmpSettings("bf16", torch.bfloat16, False, f"bf16 autocast on {device.type} (asked for)")
    if not on_cuda:
        return AmpSettings("off", None, False, "AMP off: on a CPU fp32 is the safe default")
    name = torch.cuda.get_device_name(device)
    if native_bf16(device):
        return AmpSettings("bf16", torch.bfloat16, False, f"bf16: {name} has it in hardware, no GradScaler needed")
    return AmpSettings("fp16", torch.float16, True, f"fp16 + GradScaler: {name} has no native bf16 (e.g. T4)")


def make_grad_scaler(amp: AmpSettings, device: torch.device):
    return torch.amp.GradScaler(device.type, enabled=amp.use_scaler)


# --------------------------------------------------------------------------- optimizer and schedule

def fused_adamw_available(device_type: str) -> bool:
    """torch has a fused AdamW kernel for CUDA, and for the CPU since 2.4 (benchmarks/train_*.json: ~1.3x samples/s, tiny model)."""
    if device_type == "cuda":
        return True
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    return device_type == "cpu" and (major, minor) >= (2, 4)


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float = 0.01, fused: bool | None = None):
    """AdamW without weight decay on biases and LayerNorm weights; the fused kernel where torch has one
    (fused=None), or as asked."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    available = fused_adamw_available(next(model.parameters()).device.type)
    use_fused = available if fused is None else bool(fused) and available
    return torch.optim.AdamW(groups, lr=lr, fused=use_fused) if use_fused else torch.optim.AdamW(groups, lr=lr)


def make_scheduler(optimizer, total_steps: int, warmup_ratio: float = 0.06):
    """Linear warm-up, then linear decay to zero (the usual schedule for fine-tuning BERT-like models)."""
    warmup = max(1, int(total_steps * warmup_ratio))

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def steps_per_epoch(batches_per_epoch: int, grad_accum: int, limit: int | None = None) -> int:
    """Optimizer steps in one epoch: one per group of grad_accum micro-batches (the last group may be short)."""
    steps = math.ceil(batches_per_epoch / grad_accum)
    return min(steps, limit) if limit else steps


# --------------------------------------------------------------------------- the epoch's batches

def to_device(batch: dict, device: torch.device, non_blocking: bool = False) -> dict:
    return {k: v.to(device, non_blocking=non_blocking) for k, v in batch.items()}


def _progress(iterable, total: int, enabled: bool, desc: str):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    tty = sys.stdout.isatty()
    # Piped into a notebook cell by the launcher, redraw less often so the cell stays readable.
    return tqdm(iterable, total=total, desc=desc, leave=True, dynamic_ncols=tty, ncols=None if tty else 90,
                mininterval=0.5 if tty else 2.0, file=sys.stdout)


def accumulate(loader, grad_accum: int, *, skip: int = 0, limit: int | None = None, progress: bool = False,
               desc: str = "train"):
    """Yield the micro-batches of each optimizer step: lists of `grad_accum` batches (the last may be shorter).

    skip: batches already trained on before a resume (a multiple of grad_accum: snapshots are taken
    between optimizer steps). limit: stop after this many optimizer steps (benchmarks).
    The progress bar (rank 0 only) counts optimizer steps.
    """
    if skip % grad_accum:
        raise UserError(f"cannot resume {skip} batches into an epoch with --grad_accum {grad_accum}: that is inside "
                        "an accumulation group. Resume with the --grad_accum the snapshot was taken with.")
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

    yield from _progress(groups(), total - skip // grad_accum, progress and D.is_main(), desc)


# --------------------------------------------------------------------------- the epoch's counters

@dataclass
class EpochStats:
    loss: float             # mean training loss over every sample of every rank
    samples: int            # over all ranks
    tokens: int             # real (non-pad) tokens, over all ranks
    padded_tokens: int      # tokens including padding, over all ranks
    sum_sq_len: int         # Σ (text length)², over all ranks: attention's FLOPs grow with it
    optimizer_steps: int
    seconds: float
    samples_per_s: float
    tokens_per_s: float
    lr: float
    resumed: bool = False   # part of this epoch ran before a restart (its counters were restored)
    step_losses: list = None  # this rank's mean loss of each optimizer step (for the experiment tracker's curve)


class NonFiniteLoss(UserError):
    """The training loss or gradient norm became NaN or infinite."""


class EpochMeter:
    """The epoch's counters, kept so that the loop never waits for the GPU.

    add(loss, cpu_batch) after each micro-batch: the loss is summed on the device (no sync) and samples
    and tokens are counted on the batch's CPU copy. step(grad_norm) after each optimizer step. finish()
    reads everything back once and sums it over ranks. A NaN/inf loss (or, without a GradScaler, a
    non-finite gradient norm) is remembered with its step and raised by check_finite() or finish().
    """

    def __init__(self, device: torch.device, amp: AmpSettings, epoch: int, state: dict | None = None):
        self.device, self.epoch = device, epoch
        self.grad_overflow_is_normal = amp.use_scaler  # fp16: GradScaler skips such steps by design
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.first_bad_step = torch.full((), -1, dtype=torch.long, device=device)
        self.samples = self.tokens = self.padded = self.sum_sq = self.steps = self.batches = 0
        self.seconds_before = 0.0  # time spent on this epoch before a resume
        self.step_losses = []      # device scalars, read once at the end of the epoch
        self._step_loss, self._step_n = torch.zeros((), device=device), 0
        self.resumed = state is not None
        if state:
            self.loss_sum += state["loss_sum"]
            for k in ("samples", "tokens", "padded", "sum_sq", "steps", "batches"):
                setattr(self, k, int(state[k]))
            self.seconds_before = float(state["seconds"])
        self.start = time.perf_counter()

    def add(self, loss: torch.Tensor, cpu_batch: dict) -> None:
        mask = cpu_batch["attention_mask"]
        lengths = mask.sum(1)
        n = int(mask.shape[0])
        loss = loss.detach()
        self.loss_sum += loss.double() * n
        self._step_loss += loss * n
        self._step_n += n
        self._flag(~torch.isfinite(loss))
        self.samples += n
        self.tokens += int(lengths.sum())
        self.padded += mask.numel()
        self.sum_sq += int((lengths * lengths).sum())
        self.batches += 1

    def step(self, grad_norm: torch.Tensor | None = None) -> None:
        self.steps += 1
        self.step_losses.append(self._step_loss / max(self._step_n, 1))
        self._step_loss, self._step_n = torch.zeros((), device=self.device), 0
        if grad_norm is not None and not self.grad_overflow_is_normal:
            self._flag(~torch.isfinite(grad_norm.detach()))

    def _flag(self, bad: torch.Tensor) -> None:
        # Remember the first optimizer step (1-based) whose loss or gradient was not finite, on the device.
        self.first_bad_step = torch.where(bad & (self.first_bad_step < 0), self.steps + 1, self.first_bad_step)

    @property
    def seconds(self) -> float:
        return self.seconds_before + time.perf_counter() - self.start

    def check_finite(self) -> None:
        """Raise NonFiniteLoss on every rank if any rank saw a NaN/inf (one small all-reduce, one sync)."""
        bad = self.first_bad_step.clone().to(_comm_device(self.device))
        bad = torch.where(bad < 0, torch.iinfo(torch.long).max, bad)
        if D.is_initialized() and D.get_world_size() > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MIN)
        if int(bad) != torch.iinfo(torch.long).max:
            raise NonFiniteLoss(
                f"the training loss (or gradient) became NaN or infinite at optimizer step {int(bad)} of epoch "
                f"{self.epoch}; training stopped and nothing was saved. Lower the learning rate (--lr), or turn mixed "
                "precision off (--amp off) if it is on.")

    def state_dict(self) -> dict:
        """This rank's partial counters, for a snapshot taken mid-epoch."""
        return {"loss_sum": float(self.loss_sum), "samples": self.samples, "tokens": self.tokens, "padded": self.padded,
                "sum_sq": self.sum_sq, "steps": self.steps, "batches": self.batches, "seconds": self.seconds}

    def finish(self, lr: float) -> EpochStats:
        """The epoch's totals over every rank (one small all-reduce)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.check_finite()
        seconds = self.seconds
        comm = _comm_device(self.device)
        totals = D.all_reduce_sum(torch.tensor([float(self.loss_sum), self.samples, self.tokens, self.padded, self.sum_sq,
                                                seconds / D.get_world_size()], dtype=torch.float64, device=comm))
        loss_sum, samples, tokens, padded, sum_sq, seconds = totals.tolist()
        step_losses = torch.stack(self.step_losses).tolist() if self.step_losses else []
        return EpochStats(loss_sum / max(samples, 1), int(samples), int(tokens), int(padded), int(sum_sq), self.steps,
                          seconds, samples / seconds if seconds else 0.0, tokens / seconds if seconds else 0.0, lr,
                          self.resumed, step_losses)


def epoch_line(epoch: int, epochs: int, train: EpochStats, val, mfu: float | None = None) -> str:
    metric = (f"val perplexity {val.perplexity:.1f} ({val.n} blocks)" if hasattr(val, "perplexity")
              else f"val acc {100 * val.accuracy:.2f}% ({val.n} texts)")
    return (f"epoch {epoch}/{epochs} | train loss {train.loss:.4f} | val loss {val.loss:.4f} | "
            f"{metric} | {train.seconds:.1f}s | "
            f"{train.samples_per_s:.0f} samples/s" + (f" | MFU {100 * mfu:.1f}%" if mfu is not None else "")
            + (" | resumed mid-epoch" if train.resumed else ""))


def _comm_device(device: torch.device) -> torch.device:
    """nccl collectives need CUDA tensors; gloo takes CPU ones."""
    if D.is_initialized() and dist.get_backend() == "nccl":
        return device
    return torch.device("cpu")


# --------------------------------------------------------------------------- exact evaluation

def forward_logits(model, batch):
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


@dataclass
class EvalResult:
    loss: float
    accuracy: float
    n: int                  # distinct examples evaluated (the sampler's padding dropped)
    indices: torch.Tensor   # dataset index of each prediction, sorted
    predictions: torch.Tensor
    labels: torch.Tensor


def _all_gather_varlen(t: torch.Tensor, device, gather: bool = True) -> torch.Tensor:
    """all_gather for 1-D tensors whose length differs per rank."""
    if not gather or not D.is_initialized() or D.get_world_size() == 1:
        return t
    t = t.to(device)
    n = torch.tensor([t.numel()], device=device)
    sizes = [torch.zeros_like(n) for _ in range(D.get_world_size())]
    dist.all_gather(sizes, n)
    width = int(max(s.item() for s in sizes))
    padded = torch.zeros(width, dtype=t.dtype, device=device)
    padded[: t.numel()] = t
    out = [torch.zeros_like(padded) for _ in sizes]
    dist.all_gather(out, padded)
    return torch.cat([o[: int(s.item())] for o, s in zip(out, sizes)]).cpu()


@torch.no_grad()
def evaluate(model, loader, *, device, amp: AmpSettings | None = None, gather: bool = True, task: str = "classify"):
    """The validation figures of a classifier (evaluate_classifier) or, for --task clm/mlm, a language
    model's token-weighted loss and perplexity (lm.evaluate_lm); both exact under DDP."""
    if task != "classify":
        from .lm import evaluate_lm

        return evaluate_lm(model, loader, device=device, task=task, amp=amp)
    return evaluate_classifier(model, loader, device=device, amp=amp, gather=gather)


@torch.no_grad()
def evaluate_classifier(model, loader, *, device, amp: AmpSettings | None = None, gather: bool = True) -> EvalResult:
    """Loss and accuracy over the whole evaluation set, identical on every rank.

    Each rank predicts its shard; predictions are gathered with their dataset indices and the
    duplicates that DistributedSampler adds to even out the shards are dropped, so the result
    equals a single-process evaluation of the same weights. gather=False evaluates this rank's
    loader alone (no collectives), e.g. a reference evaluation on rank 0 only.
    """
    bare = unwrap(model)  # no DDP forward: evaluation needs no gradient sync (and no buffer broadcast)
    was_training = bare.training
    bare.eval()
    idx, preds, labels, losses = [], [], [], []
    for batch in loader:
        batch = to_device(batch, device)
        with (amp.autocast(device) if amp else contextlib.nullcontext()):
            logits = forward_logits(bare, batch)
        losses.append(F.cross_entropy(logits.float(), batch["labels"], reduction="none").double())
        preds.append(logits.argmax(-1))
        labels.append(batch["labels"])
        idx.append(batch["index"])
    bare.train(was_training)
    cat = lambda xs, dtype: torch.cat(xs).cpu() if xs else torch.zeros(0, dtype=dtype)  # noqa: E731
    comm = _comm_device(device)
    idx = _all_gather_varlen(cat(idx, torch.long), comm, gather)
    preds = _all_gather_varlen(cat(preds, torch.long), comm, gather)
    labels = _all_gather_varlen(cat(labels, torch.long), comm, gather)
    losses = _all_gather_varlen(cat(losses, torch.float64), comm, gather)
    order = torch.argsort(idx, stable=True)
    idx, preds, labels, losses = idx[order], preds[order], labels[order], losses[order]
    keep = torch.ones_like(idx, dtype=torch.bool)
    keep[1:] = idx[1:] != idx[:-1]  # first copy of each index
    idx, preds, labels, losses = idx[keep], preds[keep], labels[keep], losses[keep]
    n = int(idx.numel())
    acc = float((preds == labels).double().mean()) if n else float("nan")
    return EvalResult(float(losses.mean()) if n else float("nan"), acc, n, idx, preds, labels)
