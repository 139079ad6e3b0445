"""The one training loop shared by the single-process and the DDP script, and exact evaluation.

What the loop knows about DDP is deliberately small: it calls `model.no_sync()` on the micro-steps
that should not all-reduce, and it sums its counters over ranks once per epoch.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import asdict, dataclass

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


def resolve_amp(mode: str, device: torch.device) -> AmpSettings:
    """auto: fp16 on GPUs without bf16 (T4, V100), bf16 where supported (A100, H100), off on CPU."""
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
        if on_cuda and not torch.cuda.is_bf16_supported():
            raise UserError(f"--amp bf16: {torch.cuda.get_device_name(device)} has no bf16 support. Use --amp fp16 or auto.")
        return AmpSettings("bf16", torch.bfloat16, False, f"bf16 autocast on {device.type} (asked for)")
    # auto
    if not on_cuda:
        return AmpSettings("off", None, False, "AMP off: on a CPU fp32 is the safe default")
    if torch.cuda.is_bf16_supported():
        return AmpSettings("bf16", torch.bfloat16, False, f"bf16: {torch.cuda.get_device_name(device)} supports it, no GradScaler needed")
    return AmpSettings("fp16", torch.float16, True, f"fp16 + GradScaler: {torch.cuda.get_device_name(device)} has no bf16 (e.g. T4)")


def make_grad_scaler(amp: AmpSettings, device: torch.device):
    return torch.amp.GradScaler(device.type, enabled=amp.use_scaler)


# --------------------------------------------------------------------------- optimizer and schedule

def fused_adamw_available(device_type: str) -> bool:
    """torch has a fused AdamW kernel for CUDA, and for the CPU since 2.4 (benchmarks/train_*.json: ~1.3x samples/s, tiny model)."""
    if device_type == "cuda":
        return True
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    return device_type == "cpu" and (major, minor) >= (2, 4)


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float = 0.01, fused: str | bool = "auto"):
    """AdamW without weight decay on biases and LayerNorm weights; the fused kernel where torch has one."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    available = fused_adamw_available(next(model.parameters()).device.type)
    use_fused = available if fused == "auto" else bool(fused) and available
    return torch.optim.AdamW(groups, lr=lr, fused=use_fused) if use_fused else torch.optim.AdamW(groups, lr=lr)


def make_scheduler(optimizer, total_steps: int, warmup_ratio: float = 0.06):
    """Linear warm-up, then linear decay to zero (the usual schedule for fine-tuning BERT-like models)."""
    warmup = max(1, int(total_steps * warmup_ratio))

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def optimizer_steps_per_epoch(batches_per_epoch: int, grad_accum: int) -> int:
    return math.ceil(batches_per_epoch / grad_accum)


# --------------------------------------------------------------------------- one epoch

@dataclass
class EpochStats:
    loss: float             # mean training loss over every sample of every rank
    samples: int            # over all ranks
    tokens: int             # real (non-pad) tokens, over all ranks
    padded_tokens: int      # tokens including padding, over all ranks
    optimizer_steps: int
    seconds: float
    samples_per_s: float
    tokens_per_s: float
    lr: float

    def as_dict(self):
        return asdict(self)


def _to_device(batch, device, non_blocking):
    return {k: v.to(device, non_blocking=non_blocking) for k, v in batch.items()}


def forward_logits(model, batch):
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def _progress(loader, enabled: bool, desc: str):
    if not enabled:
        return loader, None
    from tqdm.auto import tqdm

    tty = sys.stdout.isatty()
    # Piped into a notebook cell by the launcher, redraw less often so the cell stays readable.
    bar = tqdm(loader, desc=desc, leave=True, dynamic_ncols=tty, ncols=None if tty else 90,
               mininterval=0.5 if tty else 2.0, file=sys.stdout)
    return bar, bar


def train_one_epoch(model, loader, optimizer, scheduler, *, device, amp: AmpSettings, scaler=None, grad_accum: int = 1,
                    max_grad_norm: float | None = 1.0, use_no_sync: bool = True, progress: bool = True,
                    desc: str = "train", max_steps: int | None = None, non_blocking: bool = False,
                    skip_batches: int = 0, on_step=None) -> EpochStats:
    """Train for one pass over `loader` (this rank's shard). Works for a bare model and for DDP.

    Gradient accumulation: with DDP, the micro-steps before the last one run inside `model.no_sync()`,
    so gradients are all-reduced once per optimizer step instead of once per micro-batch.
    skip_batches: batches already trained on before a resume (same order, skipped without compute).
    on_step(batches_done): called after every optimizer step (snapshots hook in here).
    """
    model.train()
    scaler = scaler or make_grad_scaler(amp, device)
    n_batches = len(loader) if max_steps is None else min(len(loader), max_steps * grad_accum)
    loss_sum = torch.zeros((), dtype=torch.float64)
    samples = tokens = padded = steps = 0
    iterator, bar = _progress(loader, progress and D.is_main(), desc)
    optimizer.zero_grad(set_to_none=True)
    start = time.perf_counter()
    for i, batch in enumerate(iterator):
        if i >= n_batches:
            break
        if i < skip_batches:
            continue
        group_start = (i // grad_accum) * grad_accum
        group_size = min(grad_accum, n_batches - group_start)  # the last group of an epoch may be short
        last_micro = i == group_start + group_size - 1
        batch = _to_device(batch, device, non_blocking)
        sync_ctx = model.no_sync() if (use_no_sync and not last_micro and hasattr(model, "no_sync")) else contextlib.nullcontext()
        with sync_ctx:
            with amp.autocast(device):
                logits = forward_logits(model, batch)
            loss = F.cross_entropy(logits.float(), batch["labels"])
            scaler.scale(loss / group_size).backward()
        if last_micro:
            if max_grad_norm:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if scheduler is not None:
                scheduler.step()
            steps += 1
            if on_step is not None:
                on_step(i + 1)
        bs = batch["labels"].shape[0]
        loss_sum += loss.detach().double().cpu() * bs
        samples += bs
        tokens += int(batch["attention_mask"].sum())
        padded += batch["attention_mask"].numel()
        if bar is not None and i % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    if bar is not None:
        bar.close()
    # One small all-reduce per epoch: counters and the loss over every rank.
    totals = D.all_reduce_sum(torch.tensor([float(loss_sum), samples, tokens, padded], dtype=torch.float64, device=_comm_device(device)))
    seconds = float(D.all_reduce_sum(torch.tensor([seconds], dtype=torch.float64, device=_comm_device(device)))[0]) / D.get_world_size()
    loss_total, samples, tokens, padded = totals.tolist()
    lr = optimizer.param_groups[0]["lr"]
    return EpochStats(loss_total / max(samples, 1), int(samples), int(tokens), int(padded), steps, seconds,
                      samples / seconds if seconds else 0.0, tokens / seconds if seconds else 0.0, lr)


def _comm_device(device: torch.device) -> torch.device:
    """nccl collectives need CUDA tensors; gloo takes CPU ones."""
    if D.is_initialized() and dist.get_backend() == "nccl":
        return device
    return torch.device("cpu")


# --------------------------------------------------------------------------- exact evaluation

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
def evaluate(model, loader, *, device, amp: AmpSettings | None = None, gather: bool = True) -> EvalResult:
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
        batch = _to_device(batch, device, False)
        with (amp.autocast(device) if amp else contextlib.nullcontext()):
            logits = forward_logits(bare, batch)
        losses.append(F.cross_entropy(logits.float(), batch["labels"], reduction="none").double().cpu())
        preds.append(logits.argmax(-1).cpu())
        labels.append(batch["labels"].cpu())
        idx.append(batch["index"].cpu())
    bare.train(was_training)
    cat = lambda xs, dtype: torch.cat(xs) if xs else torch.zeros(0, dtype=dtype)
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
