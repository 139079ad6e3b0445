"""bench_train's two kinds of contender, each timed over a window of optimizer steps: the course's own scripts,
run unchanged and in-process by harness (StepProbe records each step's CPU clock and waits for a quiet CPU before
the window), and transformers.Trainer fed the very data and model the script builds."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import tempfile
import time
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from distrinews_lib.data import batching, tokenization
from distrinews_lib.errors import UserError
from distrinews_lib.training import config, optim, precision

from .. import ROOT
from . import harness, throughput, timing

REPO = ROOT  # the checkout whose scripts are measured
SINGLE, DDP_SCRIPT = REPO / "scripts" / "train_single.py", REPO / "scripts" / "train_ddp.py"


class StepProbe:
    """A global optimizer-step hook registered BEFORE harness.run's own, so it runs first at every step:
    it records this process's CPU clock after each step, and at step `warmup` calls `wait()` (wait for a
    quiet CPU, and under DDP a barrier) before the harness starts its clock."""

    def __init__(self, warmup: int, wait=None):
        self.warmup, self.wait, self.cpu, self.quiet = warmup, wait, [], None

    def __call__(self, *_):
        if len(self.cpu) + 1 == self.warmup and self.wait is not None:
            self.quiet = self.wait()
        self.cpu.append(time.process_time())

    def __enter__(self):
        self.handle = register_optimizer_step_post_hook(self)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def step_cpu_seconds(self, steps: int) -> list:
        """CPU seconds of each timed step (steps warmup+1 .. warmup+steps)."""
        marks = self.cpu[self.warmup - 1 : self.warmup + steps]
        return [b - a for a, b in zip(marks, marks[1:])]


def run_script(script: Path, argv: list, *, warmup: int, steps: int, device, wait=None, comm: bool = False):
    """(harness Window, StepProbe, captured output) of one run of a course script, its own output kept quiet."""
    buf = io.StringIO()
    try:
        with StepProbe(warmup, wait) as probe, contextlib.redirect_stdout(buf):
            window = harness.run(script, argv, warmup=warmup, steps=steps, device=device, comm=comm)
    except SystemExit as stop:  # the script's main_guard already printed the user's mistake on stderr
        raise UserError(
            f"{script.name} {' '.join(argv)} stopped (exit code {stop.code}). Its output:\n{buf.getvalue()[-2000:]}"
        ) from None
    return window, probe, buf.getvalue()


def run_ours(argv, *, warmup, steps, device, shape, peak, gate) -> dict:
    window, probe, _ = run_script(SINGLE, argv, warmup=warmup, steps=steps, device=device, wait=gate.wait)
    res = window.result(shape, peak)
    res["waited_for_quiet"] = probe.quiet
    res["threads"] = torch.get_num_threads()
    return res


class RecordingCollator:
    """Wraps the collator Trainer uses and remembers each batch's real lengths and padded width."""

    def __init__(self, inner):
        self.inner, self.records = inner, []

    def __call__(self, features):
        batch = self.inner(features)
        self.records.append((batch["attention_mask"].sum(1).tolist(), int(batch["attention_mask"].shape[1])))
        return batch


class RowsDataset(torch.utils.data.Dataset):
    """The rows as a plain torch Dataset of dicts, for where `datasets` is not installed: Trainer reads it the same
    way (its length grouping measures len(row["input_ids"]); DataCollatorWithPadding pads it)."""

    def __init__(self, columns: dict):
        self.columns, self.n = columns, len(next(iter(columns.values())))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.columns.items()}


def hf_dataset(dataset: tokenization.TokenizedDataset):
    """What a user has after `Dataset.from_dict(...).map(tokenizer, batched=True)`: input_ids, attention_mask, label
    (a datasets.Dataset, as Trainer's users have; RowsDataset where `datasets` is missing)."""
    columns = {
        "input_ids": dataset.input_ids,
        "attention_mask": [[1] * len(x) for x in dataset.input_ids],
        "label": list(dataset.labels),
    }
    try:
        from datasets import Dataset
    except ImportError:
        return RowsDataset(columns)
    return Dataset.from_dict(columns)


def trainer_available() -> str | None:
    """None when transformers.Trainer can run here, else why not."""
    try:
        import accelerate  # noqa: F401
        from transformers import Trainer  # noqa: F401
    except ImportError as err:
        return f"transformers.Trainer needs accelerate ({err}); pip install accelerate"
    return None


def trainer_options(cfg: config.RunConfig, device, same_options: bool, compile_: bool) -> dict:
    """TrainingArguments beyond the common ones. same_options: what our loop does, in Trainer's words.

    transformers 5 spells length grouping train_sampling_strategy="group_by_length" (4.x: group_by_length=True)
    and takes a warm-up ratio as a float warmup_steps (4.x: warmup_ratio)."""
    from transformers import TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    out = {}
    if same_options:
        if cfg.group_by_length:
            out.update(
                {"train_sampling_strategy": "group_by_length"}
                if "train_sampling_strategy" in fields
                else {"group_by_length": True}
            )
        fused = optim.fused_adamw_available(device.type) if cfg.fused_adam is None else cfg.fused_adam
        out["optim"] = "adamw_torch_fused" if fused else "adamw_torch"
        out["weight_decay"] = cfg.weight_decay
        out["max_grad_norm"] = cfg.max_grad_norm
        out.update(
            {"warmup_ratio": cfg.warmup_ratio} if "warmup_ratio" in fields else {"warmup_steps": cfg.warmup_ratio}
        )
        out["dataloader_pin_memory"] = batching.loader_options(cfg, 0, device)["pin_memory"]
    if compile_:
        out["torch_compile"] = True
    return out


def run_trainer(
    template,
    hf_train,
    tokenizer,
    cfg: config.RunConfig,
    device,
    *,
    same_options: bool,
    compile_: bool,
    warmup: int,
    steps: int,
    shape,
    peak,
    gate,
) -> dict:
    from transformers import DataCollatorWithPadding, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    amp = precision.resolve_amp(cfg.amp, device)
    pad = batching.loader_options(cfg, 0, device)["pad_to_multiple_of"] if same_options else None
    collator = RecordingCollator(DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad))
    marks, quiet = {}, [None]

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == warmup:
                quiet[0] = gate.wait()
            if state.global_step in (warmup, warmup + steps):
                timing.sync(device)
                marks[state.global_step] = (time.perf_counter(), time.process_time(), timing.cpu_busy_seconds())

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model = copy.deepcopy(template)
    extra = trainer_options(cfg, device, same_options, compile_)
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        targs = TrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=cfg.batch_size,
            max_steps=warmup + steps,
            learning_rate=cfg.lr,
            use_cpu=device.type == "cpu",
            bf16=amp.mode == "bf16",
            fp16=amp.mode == "fp16",
            report_to="none",
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            seed=cfg.seed,
            **extra,
        )
        trainer = Trainer(model=model, args=targs, train_dataset=hf_train, data_collator=collator, callbacks=[Clock()])
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    (t0, c0, b0), (t1, c1, b1) = marks[warmup], marks[warmup + steps]
    res = throughput.window(
        steps, t1 - t0, c1 - c0, collator.records[warmup : warmup + steps], busy=(b0, b1), shape=shape, peak=peak
    )
    res.update(
        waited_for_quiet=quiet[0],
        threads=torch.get_num_threads(),
        amp=amp.mode,
        optimizer=str(targs.optim),
        options={k: str(v) for k, v in extra.items()},
        pad_to_multiple_of=pad,
    )
    del trainer, model
    return res
