"""Per-run metrics: metrics.csv (one row per epoch) and metrics.json (config, sizes, DDP, series, aggregates).

Only rank 0 writes; the files are rewritten after every epoch, so a crashed run still leaves its history.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import socket
import subprocess
import time
from pathlib import Path

CSV_FIELDS = ["epoch", "train_loss", "val_loss", "val_accuracy", "epoch_time_s", "samples_per_s", "tokens_per_s", "lr"]


def versions() -> dict:
    import torch
    import transformers

    from . import __version__

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "distrinews_lib": __version__}
    try:
        import datasets

        out["datasets"] = datasets.__version__
    except ImportError:
        pass
    return out


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def machine_info() -> dict:
    import torch

    info = {"hostname": socket.gethostname(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "processor": _cpu_name()}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class RunTracker:
    """Collects one run's metrics; `enabled=False` on ranks other than 0 makes every call a no-op."""

    def __init__(self, out_dir, config: dict, *, data: dict, ddp: dict, model: dict, enabled: bool = True):
        self.out_dir = Path(out_dir)
        self.enabled = enabled
        self.rows: list[dict] = []
        self.started = time.time()
        self.record = {"config": config, "data": data, "ddp": ddp, "model": model, "versions": versions(),
                       "machine": machine_info(), "git_commit": git_commit(),
                       "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "epochs": [], "aggregates": {}}
        if enabled:
            self.out_dir.mkdir(parents=True, exist_ok=True)

    @property
    def csv_path(self) -> Path:
        return self.out_dir / "metrics.csv"

    @property
    def json_path(self) -> Path:
        return self.out_dir / "metrics.json"

    def log_epoch(self, epoch: int, train, val, lr: float | None = None) -> dict:
        row = {"epoch": epoch, "train_loss": round(train.loss, 6), "val_loss": round(val.loss, 6),
               "val_accuracy": round(val.accuracy, 6), "epoch_time_s": round(train.seconds, 4),
               "samples_per_s": round(train.samples_per_s, 3), "tokens_per_s": round(train.tokens_per_s, 1),
               "lr": lr if lr is not None else train.lr}
        self.rows.append(row)
        self.record["epochs"].append({**row, "train_samples": train.samples, "train_tokens": train.tokens,
                                      "padded_tokens": train.padded_tokens, "optimizer_steps": train.optimizer_steps,
                                      "val_examples": val.n})
        self._write()
        return row

    def finish(self, **extra) -> dict:
        eps = self.record["epochs"]
        if eps:
            self.record["aggregates"] = {
                "final_val_accuracy": eps[-1]["val_accuracy"],
                "best_val_accuracy": max(e["val_accuracy"] for e in eps),
                "final_train_loss": eps[-1]["train_loss"],
                "total_train_time_s": round(sum(e["epoch_time_s"] for e in eps), 3),
                "mean_samples_per_s": round(sum(e["samples_per_s"] for e in eps) / len(eps), 3),
                # epoch 1 includes warm-up (allocator, first kernels); later epochs are the steady state
                "steady_samples_per_s": round(sum(e["samples_per_s"] for e in eps[1:]) / max(1, len(eps) - 1), 3)
                if len(eps) > 1 else eps[0]["samples_per_s"],
                "padding_fraction": round(1 - sum(e["train_tokens"] for e in eps) / max(1, sum(e["padded_tokens"] for e in eps)), 4),
            }
        self.record["aggregates"].update(extra)
        self.record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.record["wall_time_s"] = round(time.time() - self.started, 3)
        self._write()
        return self.record

    def _write(self) -> None:
        if not self.enabled:
            return
        tmp = self.csv_path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            w.writeheader()
            w.writerows(self.rows)
        os.replace(tmp, self.csv_path)
        tmp = self.json_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.record, indent=2, default=str))
        os.replace(tmp, self.json_path)


def load_metrics(run_dir) -> dict:
    path = Path(run_dir) / "metrics.json" if Path(run_dir).is_dir() else Path(run_dir)
    return json.loads(path.read_text())


def plot_metrics(runs: dict, save_to=None):
    """Loss and accuracy per epoch for one or more runs ({label: metrics.json path or dict}); returns the figure."""
    import matplotlib

    if not os.environ.get("MPLBACKEND") and "ipykernel" not in __import__("sys").modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, m in runs.items():
        m = m if isinstance(m, dict) else load_metrics(m)
        ep = [e["epoch"] for e in m["epochs"]]
        ax_loss.plot(ep, [e["train_loss"] for e in m["epochs"]], "o-", label=f"{label} train")
        ax_loss.plot(ep, [e["val_loss"] for e in m["epochs"]], "s--", label=f"{label} val")
        ax_acc.plot(ep, [100 * e["val_accuracy"] for e in m["epochs"]], "o-", label=label)
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy", title="loss")
    ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", title="validation accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    if save_to:
        Path(save_to).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_to, dpi=110)
    return fig
