"""The bare loop: the least a training step can be, as a yardstick for ours. Same model (a copy of the one the
script builds), the very batches our loader makes (same sampler, seed, length groups and padding), all moved to
the device before the clock starts; then forward under autocast, backward, fused AdamW, zero_grad, and nothing
else: no loader, no meter, no clipping, no schedule. What ours costs beyond it is the price of what it does
beyond it (issue 41: 0.66x of it on an H200 at batch 32)."""

from __future__ import annotations

import contextlib
import copy
import time

import torch

from distrinews_lib.data import batching
from distrinews_lib.training import epochs, optim, precision

from . import throughput, timing


def our_batches(prepared, cfg, device, n: int) -> list:
    """The first n batches train_single.py trains on with this cfg (epoch 1), as CPU tensors."""
    sampler = batching.ShuffleSampler(prepared.train_ds, seed=cfg.seed)
    sampler.set_epoch(1)
    opts = batching.loader_options(cfg, prepared.tokenizer.pad_token_id, device)
    loader = batching.make_loader(
        prepared.train_ds, cfg.batch_size, sampler, seed=cfg.seed, group_by_length=cfg.group_by_length, **opts
    )
    if len(loader) < n:
        raise ValueError(f"the bare loop needs {n} batches; the training set makes {len(loader)}")
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            return out
    return out


def bare_step(model, optimizer, amp, device, scaler=None):
    """One step of the bare loop, on a batch already on the device."""

    def step(batch):
        with amp.autocast(device):
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        loss = out.loss
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:  # fp16 (a T4): the loss needs scaling there as in any loop
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return step


def run_bare(
    template,
    cpu_batches: list,
    cfg,
    device,
    *,
    warmup: int,
    steps: int,
    shape=None,
    compile_mode: str | None = None,
    gate=None,
    window=None,
) -> dict:
    """Time steps warmup+1 .. warmup+steps of the bare loop over cpu_batches (at least warmup+steps of them).
    compile_mode: torch.compile the model ("default", "reduce-overhead"). window: a step_ops window to run it under
    (counting ops or profiling; it hooks the optimizer's steps as for ours). Returns throughput.window's figures
    plus the host's seconds to ISSUE the timed steps (before the closing sync): with nothing to wait for, the host
    runs ahead of the GPU, so where issue time ~ wall time, launching kernels is what bounds the step."""
    amp = precision.resolve_amp(cfg.amp, device)
    model = copy.deepcopy(template).to(device).train()
    fused = optim.fused_adamw_available(device.type)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, **({"fused": True} if fused else {}))
    scaler = torch.amp.GradScaler(device.type) if amp.use_scaler else None
    if compile_mode:
        model = torch.compile(model, mode=compile_mode)
    batches = [
        {k: v.to(device) if device.type == "cuda" else v.clone() for k, v in b.items() if k not in epochs.HOST_ONLY}
        for b in cpu_batches[: warmup + steps]
    ]
    if len(batches) < warmup + steps:
        raise ValueError(f"the bare loop was given {len(batches)} batches for {warmup} + {steps} steps")
    step = bare_step(model, optimizer, amp, device, scaler)
    if window is not None:
        window.seed_fn = lambda moved=batches: [t for b in moved for t in b.values()]
    with window if window is not None else contextlib.nullcontext():
        for b in batches[:warmup]:
            step(b)
        quiet = gate.wait() if gate is not None else None
        timing.sync(device)
        t0, c0, b0 = time.perf_counter(), time.process_time(), timing.cpu_busy_seconds()
        for b in batches[warmup:]:
            step(b)
        issued = time.perf_counter() - t0
        timing.sync(device)
        t1, c1, b1 = time.perf_counter(), time.process_time(), timing.cpu_busy_seconds()
    records = [(b["attention_mask"].sum(1).tolist(), int(b["attention_mask"].shape[1])) for b in cpu_batches]
    res = throughput.window(steps, t1 - t0, c1 - c0, records[warmup : warmup + steps], busy=(b0, b1), shape=shape)
    res.update(
        issue_seconds_per_step=issued / steps,
        seconds_per_step=(t1 - t0) / steps,
        amp=amp.mode,
        fused_adamw=fused,
        compile_mode=compile_mode,
        waited_for_quiet=quiet,
        threads=torch.get_num_threads(),
    )
    del model, optimizer, batches
    return res
