"""Does a converted checkpoint score as the sharded model did in training? Chapter 07 converts a sharded (DCP)
checkpoint into the one-file format and scores it the way the server answers (serving.inference: its tokenizer, its
padding, its forward), on the held-out texts that scripts/train_sharded.py scored at the end of its run.

    served = score("outputs/.../model.pt", "outputs/.../run2")      # run2/result.json: what training measured
    served.matches, served.table()
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

# Why these margins: the same texts and weights, so the same answers: every argmax is the same (counted exactly).
# The loss is summed in another order and over another padding (the server pads each batch to its longest text,
# training padded every text to --max_length): fp32 rounding, a few units in the 7th digit of a loss near 1.
LOSS_REL_TOL = 1e-5


@dataclass
class Score:
    trained_accuracy: float
    trained_loss: float
    served_accuracy: float
    served_loss: float
    texts: int

    @property
    def matches(self) -> bool:
        same_count = round(self.served_accuracy * self.texts) == round(self.trained_accuracy * self.texts)
        return same_count and abs(self.served_loss - self.trained_loss) <= LOSS_REL_TOL * abs(self.trained_loss)

    def table(self) -> str:
        return (
            f"{'':<34} {'accuracy':>9} {'loss':>10}\n"
            f"{'in training (sharded, 2 ranks)':<34} {100 * self.trained_accuracy:>8.2f}% {self.trained_loss:>10.6f}\n"
            f"{'served from the converted file':<34} {100 * self.served_accuracy:>8.2f}% {self.served_loss:>10.6f}\n"
            f"({self.texts} held-out texts)"
        )


def held_out_texts(args: dict) -> tuple[list, list]:
    """The held-out texts and labels a train_sharded.py run scored, from the arguments it recorded."""
    from distrinews_lib.data import sources

    data = sources.load_dataset_splits(
        "ag_news", sources.data_dir(args["data"]) or "embedded", args["num_samples"], args["eval_samples"], args["seed"]
    )
    return data.test_texts, data.test_labels


def score(checkpoint, run_dir) -> Score:
    import torch

    from distrinews_lib.serving.inference import load_checkpoint, predict_proba

    result = json.loads((Path(run_dir) / "result.json").read_text())
    texts, labels = held_out_texts(result["args"])
    n = result["val_texts"]
    probs = predict_proba(load_checkpoint(checkpoint), texts[:n])
    target = torch.tensor(labels[:n])
    accuracy = float((probs.argmax(-1) == target).float().mean())
    loss = -float(torch.log(probs[torch.arange(n), target].double()).mean())
    assert math.isfinite(loss)
    return Score(result["val_accuracy"], result["val_loss"], accuracy, loss, n)
