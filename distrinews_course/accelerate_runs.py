"""Chapter 09's two runs, read and judged: did train_accelerate.py (under accelerate launch) run the processes it
was asked for, train exactly what train_ddp.py trained, and track it as train_ddp.py's tracker did?

    pair = TrainingPair(OUT / "ddp", OUT / "accelerate")
    print(pair.table()); [check(*c) for c in pair.claims(eval_n=401)]
    fig = pair.tracking_figure()

Every claim is (holds?, the sentence it checks) for distrinews_course.notebook.check. The weights are compared bit
for bit: both scripts shard with DistributedSampler, so every rank sums the same gradients in the same order.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .attempt import written_number
from .plots import _pyplot, load_metrics, read_tensorboard

DEEPSPEED_ON_CPU = "Setting accelerator to CPU"  # DeepSpeed's import-time warning where it finds no GPU


def key_lines(line: str) -> bool:
    """The lines of a training launch the chapter shows: the set-up, each epoch, the ranks' agreement."""
    return line.startswith(("preset", "epoch", "parameters identical"))


def _region(path, start: str, end: str) -> list[str]:
    """The lines of `path` from the first holding `start` to the next holding `end`, de-indented together."""
    lines = Path(path).read_text().splitlines()
    i = next((k for k, line in enumerate(lines) if start in line), None)
    j = next((k for k, line in enumerate(lines) if i is not None and k > i and end in line), None)
    if i is None or j is None:
        raise ValueError(f"{path}: no lines from {start!r} to {end!r}; was the script edited?")
    body = lines[i : j + 1]
    cut = min(len(x) - len(x.lstrip()) for x in body if x.strip())
    return [x[cut:] for x in body]


STEP_DDP = ("for micro_batches in epochs.accumulate", "snap.step(")  # train_ddp.py's loop over one epoch's steps
STEP_ACCELERATE = ("for batch in run.train_batches", "run.record(")  # train_accelerate.py's


def step_diff(ddp="scripts/train_ddp.py", accelerate="scripts/train_accelerate.py") -> tuple[str, int, int]:
    """train_ddp.py's training step against train_accelerate.py's, line by line (indentation ignored): '- ' only
    in train_ddp.py, '+ ' only in train_accelerate.py, '  ' in both. Returns (the text, lines removed, added)."""
    a, b = _region(ddp, *STEP_DDP), _region(accelerate, *STEP_ACCELERATE)
    matcher = difflib.SequenceMatcher(None, [x.strip() for x in a], [x.strip() for x in b], autojunk=False)
    out, removed, added = [], 0, 0
    for tag, a1, a2, b1, b2 in matcher.get_opcodes():
        if tag == "equal":
            out += ["  " + x for x in b[b1:b2]]
            continue
        out += ["- " + x for x in a[a1:a2]] + ["+ " + x for x in b[b1:b2]]
        removed, added = removed + a2 - a1, added + b2 - b1
    return "\n".join(out), removed, added


def deepspeed_notice(result) -> str | None:
    """One line for the learner when the Accelerate log holds DeepSpeed's CPU warning (DeepSpeed installed for
    chapter 06, no GPU here): accelerator.unwrap_model imports DeepSpeed to look for its engine. Harmless."""
    said = sum(DEEPSPEED_ON_CPU in line for line in result.lines)
    if not said:
        return None
    return (
        f"(the Accelerate log also holds DeepSpeed's '[WARNING] ... {DEEPSPEED_ON_CPU}', {said}x: "
        "accelerator.unwrap_model imports DeepSpeed, installed for chapter 06, to look for a DeepSpeed engine; "
        "without a GPU DeepSpeed says so. Nothing here uses DeepSpeed.)"
    )


def launch_claims(result, nproc: int) -> list[tuple]:
    """accelerate launch really started `nproc` ranks (launch.accelerate_launch counts each rank's marker), and
    the script saw a world of that size. Exact."""
    return [
        (result.ranks == nproc, f"accelerate launch really ran {nproc} processes"),
        (f"world size {nproc}" in result.output, "... and the script saw a world of that size"),
    ]


def weights(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def judge_gap_prediction(predicted, gap: float, name: str = "PREDICTED_GAP") -> bool | None:
    """A learner's guess of the largest weight difference, written before the runs: right when it says 0 and the
    gap is 0, or says more than 0 and the gap is more than 0. One line; None when nothing was written."""
    predicted = written_number(name, predicted, "0.0 or 1e-7", f"the largest difference was {gap:g}")
    if predicted is None:
        return None
    right = (gap == 0.0) == (predicted == 0.0)
    print(
        f"you predicted {predicted:g}; measured {gap:g}: "
        + ("right" if right else "not this time: read the markdown above the launch")
    )
    return right


@dataclass
class TrainingPair:
    """train_ddp.py's run and train_accelerate.py's, each in its own --output folder (metrics.json, model.pt,
    tensorboard/ or Accelerate's distrinews/ event files)."""

    ddp_dir: Path
    acc_dir: Path
    metrics: dict = field(init=False)

    def __post_init__(self):
        self.ddp_dir, self.acc_dir = Path(self.ddp_dir), Path(self.acc_dir)
        self.metrics = {"ddp": load_metrics(self.ddp_dir), "accelerate": load_metrics(self.acc_dir)}

    @property
    def gap(self) -> float:
        """The largest difference between any weight of the two trained models."""
        a, b = weights(self.ddp_dir / "model.pt"), weights(self.acc_dir / "model.pt")
        return max(float((a[k] - b[k]).abs().max()) for k in a)

    def table(self) -> str:
        lines = [f"{'epoch':>5} {'DDP train loss':>15} {'Accelerate':>11} {'DDP val acc':>12} {'Accelerate':>11}"]
        for a, b in zip(self.metrics["ddp"]["epochs"], self.metrics["accelerate"]["epochs"]):
            lines.append(
                f"{a['epoch']:>5} {a['train_loss']:>15.5f} {b['train_loss']:>11.5f} "
                f"{100 * a['val_accuracy']:>11.2f}% {100 * b['val_accuracy']:>10.2f}%"
            )
        return "\n".join(lines + [f"largest weight difference between the two trained models: {self.gap}"])

    def claims(self, eval_n: int) -> list[tuple]:
        """The run learned (above 40% on four classes, chance 25%: the tiny model reaches 45-50% in two epochs of
        1,280 texts), and the two runs agree exactly: weights bit for bit, every epoch's training loss, and each
        of the eval_n held-out texts counted once by both (an odd count: a padded share must not be counted)."""
        a, b = self.metrics["ddp"]["epochs"], self.metrics["accelerate"]["epochs"]
        return [
            (a[-1]["val_accuracy"] > 0.4, f"the runs learned ({100 * a[-1]['val_accuracy']:.0f}%, chance 25%)"),
            (
                self.gap == 0.0,
                "Accelerate trained exactly the weights of train_ddp.py, bit for bit: the same examples on every "
                "rank, the same DDP all-reduce underneath, the same optimizer",
            ),
            (
                len(a) == len(b) and all(x["train_loss"] == y["train_loss"] for x, y in zip(a, b)),
                "... and the same training loss in every epoch",
            ),
            (
                all(x["val_examples"] == y["val_examples"] == eval_n for x, y in zip(a, b)),
                f"... and both evaluated each of the {eval_n} held-out texts exactly once",
            ),
        ]

    @functools.cached_property
    def events(self) -> tuple[dict, dict]:
        """({tag: [(step, value)]} from train_ddp.py's tracker, {tag: [values]} from Accelerate's own tracker, which
        writes under <project_dir>/<project name>/, one value per epoch)."""
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(self.acc_dir / "distrinews"))
        acc.Reload()
        return read_tensorboard(self.ddp_dir), {t: [e.value for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}

    def tracking_claims(self) -> list[tuple]:
        """What each tracker wrote, against metrics.json and each other: exact (the same floats, rounded to 6
        places where TensorBoard stored a float32 of metrics.json's float64)."""
        ddp, acc = self.events
        m = self.metrics["ddp"]["epochs"]
        steps = sum(e["optimizer_steps"] for e in m)
        return [
            (len(ddp["train/loss_step"]) == steps, f"the event file holds the loss of all {steps} optimizer steps"),
            (
                [round(v, 6) for _, v in ddp["val/accuracy"]] == [round(e["val_accuracy"], 6) for e in m],
                "its accuracy points are metrics.json's, epoch by epoch",
            ),
            (
                acc.get("val/accuracy") == [v for _, v in ddp["val/accuracy"]]
                and acc.get("train/loss") == [v for _, v in ddp["train/loss"]],
                "Accelerate's own tracker logged the same accuracy and training loss, epoch by epoch",
            ),
        ]

    def tracking_figure(self):
        """What the trackers recorded: train_ddp.py's loss at every optimizer step and Accelerate's at every epoch's
        end; the validation accuracy of each."""
        ddp, acc = self.events
        m = self.metrics["ddp"]
        ends = [s for s, _ in ddp["val/accuracy"]]  # the optimizer step each epoch ended at
        plt = _pyplot()
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
        ax1.plot(*zip(*ddp["train/loss_step"]), lw=1, label="train_ddp.py: every step")
        ax1.plot(ends, acc["train/loss"], "s", ms=7, mfc="none", label="Accelerate's tracker: epoch mean")
        ax1.set(xlabel="optimizer step", ylabel="training loss (rank 0)", title="from the TensorBoard event files")
        ax2.plot(ends, [100 * v for _, v in ddp["val/accuracy"]], "o-", label="train_ddp.py")
        ax2.plot(ends, [100 * v for v in acc["val/accuracy"]], "s", ms=9, mfc="none", label="Accelerate")
        ax2.set(xlabel="optimizer step", ylabel="validation accuracy (%)", ylim=(20, 100), title=m["data"]["title"])
        ax2.axhline(25, color="grey", ls=":", lw=0.8)
        for ax in (ax1, ax2):
            ax.legend(fontsize=8)
        fig.tight_layout()
        return fig
