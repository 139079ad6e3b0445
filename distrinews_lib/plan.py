"""The run plan: every run-wide decision made ONCE, on rank 0, then shared with every rank.

Left to themselves, ranks can disagree (one reaches the hub and another not, nodes see different snapshots or
GPUs) and train on different data, or hang. decide() picks the task, config, dataset and source, model and
tokenizer, and the snapshot to resume from; prepare() loads that on every rank (the task tokenizes it, local rank 0
first) and checks that every rank holds the same data; any rank's failure stops every rank with one message.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .data import sources
from .data.texts import TextOptions
from .errors import UserError
from .hub import env_says_offline, hub_reachable
from .models.build import FROM_SCRATCH, LOCAL_PRESETS, resolve_model_name, resolve_tokenizer
from .process_group.collectives import agree, same_on_all_ranks
from .process_group.ranks import get_rank, get_world_size, print0
from .tasks import choose_task
from .training.classify import CLASSIFY
from .training.config import RunConfig, from_scratch_lr, preset_lr, read_preset
from .training.task import PreparedRun, Task

if TYPE_CHECKING:  # the plan names it; a run that does not resume never loads resume.py
    from .training.resume import ResumeChoice


@dataclass(frozen=True)
class RunPlan:
    cfg: RunConfig  # rank 0's configuration (its preset, its flags)
    data_source: str  # hub, embedded, synthetic, or a folder
    model_name: str  # tiny, minilm, a hub id or a folder
    hub: bool  # whether rank 0 could reach the Hugging Face hub
    resume: ResumeChoice | None  # the snapshot every rank resumes from, or None
    decided_by: str  # host that decided, for the log
    dataset: str = "ag_news"  # a known dataset, hub:OWNER/NAME, folder:PATH or csv:PATH (sources.resolve_dataset)
    tokenizer: str = "hf"  # hf (the model's own) or hash
    task: Task = CLASSIFY  # what the run learns (--task): its data, model head and evaluation

    def describe(self) -> str:
        resume = f"resume {self.resume.path}" if self.resume else "fresh start"
        dataset = "" if self.dataset == "ag_news" else f"dataset {self.dataset} | "
        tokenizer = " | tokenizer hash" if self.tokenizer == "hash" else ""
        return (
            f"plan (decided on {self.decided_by}): {dataset}data {self.data_source} | model {self.model_name}"
            f"{tokenizer} | preset {self.cfg.preset} | {resume}"
        )


def decide(cfg: RunConfig, log=print) -> RunPlan:
    """Rank 0 only (or a single process): look at this machine and decide for the whole run."""
    if cfg.processes is not None and cfg.processes != get_world_size():
        raise UserError(
            f"experiment {cfg.experiment or ''} asks for {cfg.processes} process(es) (processes: in its YAML) "
            f"but this launch has {get_world_size()}. Run it with: python scripts/run_experiment.py "
            f"{cfg.experiment or 'NAME'} (it launches the right number), or drop processes: from the YAML."
        )
    dataset = sources.resolve_dataset(cfg.dataset)
    local_model = cfg.model in LOCAL_PRESETS or Path(cfg.model).expanduser().is_dir()
    wants_hub = (cfg.data in ("auto", "hub") and not dataset.startswith(("folder:", "csv:"))) or not local_model
    hub = hub_reachable() if wants_hub and not env_says_offline() else False  # probed once, ≤ 3 s; never offline
    source = sources.resolve_source(cfg.data, dataset, hub)
    model_name = resolve_model_name(cfg.model, hub)
    cfg = fit_lr_to_model(cfg, model_name, log)
    return RunPlan(
        cfg=cfg,
        data_source=source,
        model_name=model_name,
        hub=hub,
        resume=resume_choice(cfg, log),
        decided_by=socket.gethostname(),
        dataset=dataset,
        tokenizer=resolve_tokenizer(cfg.tokenizer, model_name),
        task=choose_task(cfg.task),
    )


def resume_choice(cfg: RunConfig, log=print) -> ResumeChoice | None:
    """The snapshot to resume from (--resume auto or PATH), or None; only a run given --resume reads snapshots."""
    if not cfg.resume or cfg.resume == "off":
        return None
    from .training.resume import choose

    return choose(cfg.output, cfg.resume, log)


def fit_lr_to_model(cfg: RunConfig, model_name: str, log=print) -> RunConfig:
    """--model auto fell back to a model from random weights (offline): it trains at cpu_smoke's batch and a
    from-scratch rate, not at the pretrained fine-tuning rate the GPU presets carry, unless --lr was typed. The
    batch too: large_gpu's 256 leaves the tiny model 62 steps in 2 epochs of the embedded sample, and 60-73%
    accuracy where batch 32 reaches 86% (README, large_gpu); a typed --batch_size is kept and the rate scaled to it."""
    pretrained_rate = cfg.lr in (RunConfig.lr, preset_lr(cfg.preset))  # not a rate of the user's own YAML
    if cfg.model != "auto" or model_name not in FROM_SCRATCH or "lr" in cfg.given or not pretrained_rate:
        return cfg
    batch = cfg.batch_size if "batch_size" in cfg.given else read_preset("cpu_smoke")[1]["batch_size"]
    lr = from_scratch_lr(batch)
    log(
        f"model auto -> {model_name} (random weights): lr {lr:g}, not the preset's {cfg.lr:g}, which fine-tunes a "
        "pretrained model and leaves this one near chance (--lr sets another)"
        + (f"; batch {batch}, not the preset's {cfg.batch_size}" if batch != cfg.batch_size else "")
    )
    return replace(cfg, lr=lr, batch_size=batch)


def prepare(plan: RunPlan, log=print0) -> PreparedRun:
    """Load the plan's texts on every rank and check that they agree; the task builds its model and datasets from
    them. Collective."""
    cfg = plan.cfg
    log(plan.describe())
    splits = agree(
        sources.load_dataset_splits,
        plan.dataset,
        plan.data_source,
        cfg.num_samples,
        cfg.eval_samples,
        seed=cfg.seed,
        opts=TextOptions.from_config(cfg),
    )
    same_on_all_ranks(
        splits.fingerprint(),
        "the training data",
        hint="every rank must read the same files: check --data, --dataset and $DISTRINEWS_DATA_DIR on every node",
    )
    run = plan.task.prepare(plan, splits, log)
    if cfg.experiment and get_rank() == 0:
        from .experiment_record import write_resolved_config  # an experiment's record: only its runs load it

        write_resolved_config(plan, run)
    return run
