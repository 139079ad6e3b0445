"""Per-run metrics, written by rank 0 after every epoch: metrics.csv (one row per epoch), metrics.json
(config, data, DDP, series, aggregates) and, with --report_to, TensorBoard, W&B (offline by default) or
Trackio (training/reporters.py).
"""

from __future__ import annotations

import csv
import io
import time
from dataclasses import asdict
from pathlib import Path

from ..files import atomic_write_json, atomic_write_text
from ..machine import git_commit, machine_info, versions

CSV_FIELDS = [
    "epoch",
    "train_loss",
    "val_loss",
    "val_accuracy",
    "val_perplexity",
    "epoch_time_s",
    "samples_per_s",
    "tokens_per_s",
    "lr",
    "resumed",
]


class RunTracker:
    """Collects one run's metrics; `enabled=False` on ranks other than 0 makes every call a no-op."""

    def __init__(
        self,
        out_dir,
        config: dict,
        *,
        data: dict,
        ddp: dict,
        model: dict,
        enabled: bool = True,
        report_to: str = "none",
    ):
        self.out_dir = Path(out_dir)
        self.enabled = enabled
        self.rows: list[dict] = []
        self.started = time.time()
        self.record = {
            "config": config,
            "data": data,
            "ddp": ddp,
            "model": model,
            "versions": versions(),
            "machine": machine_info(),
            "git_commit": git_commit(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "epochs": [],
            "aggregates": {},
        }
        if enabled:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self.reporter = None
        if enabled and report_to != "none":
            from .reporters import Reporter  # TensorBoard, W&B or Trackio: options, read only when chosen

            self.reporter = Reporter(report_to, self.out_dir, config, self.out_dir.name)

    @classmethod
    def for_run(cls, cfg, plan, run, *, world_size: int, backend: str | None, enabled: bool) -> "RunTracker":
        s = run.splits
        return cls(
            cfg.output,
            {**cfg.to_dict(), "data_resolved": plan.data_source, "model_resolved": plan.model_name},
            data={
                "source": s.source,
                "title": s.title,
                "detail": s.detail,
                "is_synthetic": s.is_synthetic,
                "fingerprint": s.fingerprint(),
                "train_size": len(s.train_texts),
                "test_size": len(s.test_texts),
                "full_sizes": s.full_sizes,
            },
            ddp={
                "world_size": world_size,
                "backend": backend,
                "global_batch_size": cfg.batch_size * world_size * cfg.grad_accum,
            },
            model=asdict(run.info),
            enabled=enabled,
            report_to=cfg.report_to,
        )

    @property
    def json_path(self) -> Path:
        return self.out_dir / "metrics.json"

    def log_epoch(self, epoch: int, train, val) -> dict:
        """train: epochs.EpochStats; val: the task's evaluation result, which gives its own columns."""
        row = {
            "epoch": epoch,
            "train_loss": round(train.loss, 6),
            **val.row(),
            "epoch_time_s": round(train.seconds, 4),
            "samples_per_s": round(train.samples_per_s, 3),
            "tokens_per_s": round(train.tokens_per_s, 1),
            "lr": train.lr,
            "resumed": bool(train.resumed),
        }
        steps_before = sum(e["optimizer_steps"] for e in self.record["epochs"])
        self.rows.append(row)
        self.record["epochs"].append(
            {
                **row,
                "train_samples": train.samples,
                "train_tokens": train.tokens,
                "padded_tokens": train.padded_tokens,
                "sum_sq_len": train.sum_sq_len,
                "optimizer_steps": train.optimizer_steps,
                "val_examples": val.n,
                "step_losses": [round(x, 5) for x in train.step_losses or []],  # this rank's, this launch's steps
            }
        )
        self._write()
        if self.reporter is not None:  # x axis: optimizer steps, so a curve continues across epochs
            first = steps_before + train.optimizer_steps - len(train.step_losses or [])
            for i, loss in enumerate(train.step_losses or []):
                self.reporter.log({"train/loss_step": loss}, step=first + i + 1)
            figures = {
                "train/loss": train.loss,
                **val.figures(),
                "train/samples_per_s": train.samples_per_s,
                "train/lr": train.lr,
                "epoch": epoch,
            }
            self.reporter.log(figures, step=steps_before + train.optimizer_steps)
        return row

    def checkpoint_metadata(self, final) -> dict:
        """What the inference checkpoint records about the run that made it; `final`, the task's evaluation result,
        writes its own keys (summary)."""
        cfg, d = self.record["config"], self.record["data"]
        return {
            "data_source": d["source"],
            "data_title": d["title"],
            "data_detail": d["detail"],
            "is_synthetic": d["is_synthetic"],
            "preset": cfg["preset"],
            "model": self.record["model"]["resolved"],
            "model_requested": self.record["model"]["name"],
            "world_size": self.record["ddp"]["world_size"],
            "backend": self.record["ddp"]["backend"],
            **final.summary(),
            "epochs": cfg["epochs"],
            "seed": cfg["seed"],
            "max_length": cfg["max_length"],
            "task": cfg["task"],
            "versions": self.record["versions"],
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    def state_dict(self) -> dict:
        return {"rows": list(self.rows), "epochs": list(self.record["epochs"])}

    def load_state_dict(self, state: dict) -> None:
        self.rows = list(state["rows"])
        self.record["epochs"] = list(state["epochs"])

    def finish(self, **extra) -> dict:
        eps = self.record["epochs"]
        if eps:
            self.record["aggregates"] = {
                "final_val_accuracy": eps[-1]["val_accuracy"],
                "best_val_accuracy": max(
                    (e["val_accuracy"] for e in eps if e["val_accuracy"] is not None), default=None
                ),
                "final_val_perplexity": eps[-1].get("val_perplexity"),
                "final_train_loss": eps[-1]["train_loss"],
                "total_train_time_s": round(sum(e["epoch_time_s"] for e in eps), 3),
                "mean_samples_per_s": round(sum(e["samples_per_s"] for e in eps) / len(eps), 3),
                # epoch 1 includes warm-up (allocator, first kernels); later epochs are the steady state
                "steady_samples_per_s": round(sum(e["samples_per_s"] for e in eps[1:]) / max(1, len(eps) - 1), 3)
                if len(eps) > 1
                else eps[0]["samples_per_s"],
                "padding_fraction": round(
                    1 - sum(e["train_tokens"] for e in eps) / max(1, sum(e["padded_tokens"] for e in eps)), 4
                ),
            }
        self.record["aggregates"].update(extra)
        self.record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.record["wall_time_s"] = round(time.time() - self.started, 3)
        self._write()
        if self.reporter is not None:
            self.reporter.finish()
            self.reporter = None
        return self.record

    def _write(self) -> None:
        if not self.enabled:
            return
        table = io.StringIO(newline="")
        w = csv.DictWriter(table, fieldnames=CSV_FIELDS)
        w.writeheader()
        w.writerows(self.rows)
        atomic_write_text(self.out_dir / "metrics.csv", table.getvalue())
        atomic_write_json(self.json_path, self.record)
