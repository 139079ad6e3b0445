"""An experiment's config.json (configs/experiments/, scripts/run_experiment.py): every option as its run resolved it,
what the run plan decided, and what the data held. Written by rank 0 of an experiment's run, and loaded only there."""

from __future__ import annotations

from pathlib import Path

from .files import atomic_write_json
from .process_group.ranks import get_world_size
from .training.task import PreparedRun, tokenizer_name


def write_resolved_config(plan, run: PreparedRun) -> Path:
    """<output>/config.json: every option as this run resolved it, what the plan (plan.RunPlan) decided, and what the
    data held."""
    cfg, s = plan.cfg, run.splits
    record = {
        "experiment": cfg.experiment,
        "options": cfg.to_dict(),
        "resolved": {
            "dataset": plan.dataset,
            "data_source": plan.data_source,
            "model": plan.model_name,
            "model_resolved": run.info.resolved,
            "num_parameters": run.info.num_parameters,
            "tokenizer": plan.tokenizer,
            "tokenizer_name": tokenizer_name(run.tokenizer),
            "hub_reachable": plan.hub,
            "world_size": get_world_size(),
            "global_batch_size": cfg.batch_size * get_world_size() * cfg.grad_accum,
            "checkpoint": cfg.checkpoint,
            "metrics_json": str(Path(cfg.output) / "metrics.json"),
            "metrics_csv": str(Path(cfg.output) / "metrics.csv"),
        },
        "data": {
            "title": s.title,
            "detail": s.detail,
            "label_names": s.label_names,
            "fingerprint": s.fingerprint(),
            "train_size": len(s.train_texts),
            "test_size": len(s.test_texts),
            "class_counts": {"train": s.class_counts("train"), "test": s.class_counts("test")},
        },
        "decided_by": plan.decided_by,
    }
    return atomic_write_json(Path(cfg.output) / "config.json", record)
