"""The experiment trackers a run can report to with --report_to: TensorBoard, W&B (offline by default) or Trackio.
Each is an optional package; training/tracking.py imports this module only when one is chosen."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError


class Reporter:
    """One experiment tracker, the same three calls whatever the backend (each an optional package)."""

    def __init__(self, kind: str, out_dir: Path, config: dict, name: str):
        self.kind = kind
        try:
            if kind == "tensorboard":
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))
                self.writer.add_text("config", "\n".join(f"{k}: {v}" for k, v in config.items()))
            elif kind == "wandb":
                os.environ.setdefault("WANDB_MODE", "offline")  # a course run never needs an account
                os.environ.setdefault("WANDB_SILENT", "true")
                import wandb

                self.run = wandb.init(project="distrinews", name=name, dir=str(out_dir), config=config)
            elif kind == "trackio":
                os.environ.setdefault("TRACKIO_DIR", str(out_dir / "trackio"))
                import trackio

                self.run = trackio.init(project="distrinews", name=name, config=config)
        except ImportError as err:
            raise UserError(
                f"--report_to {kind} needs the {err.name} package: pip install {err.name} "
                f"(or pip install -e '.[track]'), or use --report_to tensorboard / none."
            ) from None

    def log(self, values: dict, step: int) -> None:
        if self.kind == "tensorboard":
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)
        else:  # wandb's and trackio's runs log alike
            self.run.log(values, step=step)

    def finish(self) -> None:
        if self.kind == "tensorboard":
            self.writer.close()
        elif self.kind == "wandb":
            self.run.finish()
        else:
            import trackio

            trackio.finish()
