"""The run plan: every run-wide decision made ONCE, on rank 0, then shared with every rank.

Left to themselves, ranks can disagree: one reaches the Hugging Face hub and another does not, one
node has $DISTRINEWS_DATA_DIR and another not, each node sees different snapshots on its own disk, two
nodes with different GPUs pick different presets. A DDP run built on such disagreement trains on
different data per rank, or hangs. So:

    plan = [plan.decide(cfg) if rank == 0 else None]     # rank 0 decides...
    dist.broadcast_object_list(plan, src=0)              # ...and every rank receives its decisions
    run = plan.prepare(plan[0])                          # every rank loads exactly that

decide() answers: which config (rank 0's preset and flags), which data source, which model, whether the
hub is reachable, and which snapshot to resume from. prepare() loads the data and the model and
tokenizes (local rank 0 first, so the others read its cache instead of racing it), then checks that
every rank holds the same data; any rank's failure stops every rank with one message, never a hang.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from . import LABEL_NAMES, data
from . import distributed as D
from .config import RunConfig
from .hub import hub_reachable
from .model import ModelInfo, build_model, resolve_model_name
from .snapshot import ResumeChoice, choose


@dataclass(frozen=True)
class RunPlan:
    cfg: RunConfig                  # rank 0's configuration (its preset, its flags)
    data_source: str                # hub, embedded, synthetic, or a folder
    model_name: str                 # tiny, minilm, a hub id or a folder
    hub: bool                       # whether rank 0 could reach the Hugging Face hub
    resume: ResumeChoice | None     # the snapshot every rank resumes from, or None
    decided_by: str                 # host that decided, for the log

    def describe(self) -> str:
        resume = f"resume {self.resume.path}" if self.resume else "fresh start"
        return (f"plan (decided on {self.decided_by}): data {self.data_source} | model {self.model_name} | "
                f"preset {self.cfg.preset} | {resume}")


def decide(cfg: RunConfig, log=print) -> RunPlan:
    """Rank 0 only (or a single process): look at this machine and decide for the whole run."""
    local_model = cfg.model in ("tiny", "minilm") or Path(cfg.model).expanduser().is_dir()
    hub = hub_reachable() if cfg.data in ("auto", "hub") or not local_model else False  # probed once, ≤ 3 s
    source = data.resolve_source(cfg.data)
    return RunPlan(cfg=cfg, data_source=source, model_name=resolve_model_name(cfg.model, hub), hub=hub,
                   resume=choose(cfg.output, cfg.resume, log), decided_by=socket.gethostname())


@dataclass
class PreparedRun:
    """What every rank loaded according to the plan."""

    splits: data.TextSplits
    model: object
    tokenizer: object
    info: ModelInfo
    train_ds: data.TokenizedDataset
    val_ds: data.TokenizedDataset


def prepare(plan: RunPlan, log=D.print0) -> PreparedRun:
    """Load the plan's data and model on every rank, tokenize (local rank 0 first), and check agreement.

    Collective under DDP: every rank must call it."""
    cfg = plan.cfg
    log(plan.describe())

    def load():
        splits = data.load_agnews(plan.data_source, cfg.num_samples, cfg.eval_samples, seed=cfg.seed)
        model, tokenizer, info = build_model(plan.model_name, num_labels=len(LABEL_NAMES), seed=cfg.seed, hub=plan.hub)
        return splits, model, tokenizer, info

    splits, model, tokenizer, info = D.agree(load)
    D.same_on_all_ranks(splits.fingerprint(), "the training data",
                        hint="every rank must read the same files: check --data and $DISTRINEWS_DATA_DIR on every node")
    log(splits.describe() + f" | fingerprint {splits.fingerprint()}")
    if splits.is_synthetic:
        log("NOTE: " + data.SYNTHETIC_NOTE)
    log(f"model: {info.resolved} ({info.kind}, {info.num_parameters / 1e6:.1f}M parameters"
        f"{', pretrained' if info.pretrained else ', random init'})")
    train_ds, val_ds = D.agree(D.local_main_first, data.tokenize_splits, splits, tokenizer, cfg.max_length)
    return PreparedRun(splits, model, tokenizer, info, train_ds, val_ds)
