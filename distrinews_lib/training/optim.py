"""The optimizer of the scripts' loop and its schedule: AdamW (fused where torch has it, no weight decay on biases and
norms), then linear warm-up and linear decay over the run's optimizer steps."""

from __future__ import annotations

import torch


def fused_adamw_available(device_type: str) -> bool:
    """torch has a fused AdamW kernel for CUDA, and for the CPU since 2.4.

    On the CPU it gives ~1.3x samples/s with the tiny model (benchmarks/train_*.json).
    """
    if device_type == "cuda":
        return True
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    return device_type == "cpu" and (major, minor) >= (2, 4)


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float = 0.01, fused: bool | None = None):
    """AdamW without weight decay on biases and LayerNorm weights; fused where torch has it (fused=None)."""
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
