"""Chapter 09's two runs, read and judged: did train_accelerate.py (under accelerate launch) run the processes it
was asked for, train exactly what train_ddp.py trained, and track it as train_ddp.py's tracker did?

    pair = TrainingPair(OUT / "ddp", OUT / "accelerate")
    print(pair.table()); [check(*c) for c in pair.claims(eval_n=401)]
    fig = pair.tracking_figure()

Every claim is (holds?, the sentence it checks) for distrinews_course.notebook.check. The weights are compared bit
for bit: both scripts shard with DistributedSampler, so every rank sums the same gradients in the same order.
"""

from __future__ import annotations

import ast
import difflib
import functools
import re
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


RUN_HELPERS = ("train_batches", "record")  # the accelerate_run.Run methods train_accelerate.py's step calls


def _calls(code: str) -> list[str]:
    """The names a line of code calls (`self.` dropped), in order: 'epochs.to_device(x)' -> ['epochs.to_device']."""
    code = code.split("  # ")[0]
    return [c.removeprefix("self.") for c in re.findall(r"([A-Za-z_][\w.]*)\(", code)]


def _helper_calls(run_py) -> set[str]:
    """Every name that Run.train_batches and Run.record call, read from accelerate_run.py's source."""
    tree = ast.parse(Path(run_py).read_text())
    run = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Run")
    found = set()
    for fn in run.body:
        if isinstance(fn, ast.FunctionDef) and fn.name in RUN_HELPERS:
            for node in ast.walk(fn):
                if isinstance(node, ast.Call):
                    found.add(ast.unparse(node.func).removeprefix("self."))
    return found


def step_summary(text: str, removed: int, added: int, run_py="distrinews_lib/accelerate_run.py") -> str:
    """step_diff's count, split honestly: the removed statements of train_ddp.py whose every call
    accelerate_run.Run's train_batches/record now make moved into the course's helper, not into Accelerate; the
    rest became the added lines around Accelerate's calls. A statement spans lines while its brackets are open."""
    helper, moved, calls, depth, statement = _helper_calls(run_py), 0, [], 0, []
    for line in (x[2:] for x in text.splitlines() if x.startswith("- ")):
        statement.append(line)
        code = line.split("  # ")[0]
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
        if depth > 0:
            continue
        names = _calls(" ".join(statement))
        if names and set(names) <= helper:
            moved += len(statement)
            calls += [n for n in names if n not in calls and "." in n]
        statement, depth = [], 0
    run_lines = sum(x.startswith("+ ") and any(c.startswith("run.") for c in _calls(x)) for x in text.splitlines())
    return (
        f"one optimizer step: {removed} lines of train_ddp.py became {added} of train_accelerate.py.\n"
        f"{moved} of the {removed} moved into the course's accelerate_run.Run, not into Accelerate: "
        f"{', '.join(calls)}\n(Run.train_batches and Run.record make these calls, {run_lines} lines here). "
        f"The other {removed - moved} became the {added - run_lines} lines around Accelerate's calls."
    )


@dataclass
class ShortGroup:
    """One epoch of `micro_batches` micro-batches at `grad_accum`, on a one-weight model whose every micro-batch
    has gradient 1: the gradient each optimizer step used, by train_ddp.py's rule and by a real Accelerator, and
    what Accelerate left in .grad at the epoch's end (waiting for the next epoch's micro-batches)."""

    micro_batches: int
    grad_accum: int
    groups: list[int]  # train_ddp.py's groups (epochs.accumulate), the last maybe shorter
    ddp_steps: list[float]  # the gradient of each optimizer step, train_ddp.py's rule: loss / len(group)
    accelerate_steps: list[float]  # the same, with accelerator.accumulate and accelerator.backward
    left: float  # the gradient Accelerate left in .grad at the end of the epoch

    def table(self) -> str:
        ddp = ", ".join(f"{g:.2f}" for g in self.ddp_steps)
        acc = ", ".join(f"{g:.2f}" for g in self.accelerate_steps)
        plural = "s" * (len(self.accelerate_steps) != 1)
        return (
            f"{self.micro_batches} micro-batches, grad_accum {self.grad_accum}, gradient 1 each:\n"
            f"  train_ddp.py's rule: groups {self.groups} -> {len(self.ddp_steps)} optimizer steps, gradients {ddp}\n"
            f"  Accelerate:          {len(self.accelerate_steps)} optimizer step{plural}, gradient{plural} {acc}; "
            f"{self.left:.2f} left in .grad for the next epoch"
        )

    def claims(self) -> list[tuple]:
        """train_ddp.py steps on the short group too, each step a mean (gradient 1); Accelerate steps only on full
        groups and leaves the short group's gradient, divided by grad_accum, waiting. Tolerance: float32's 1/3."""
        short = self.micro_batches % self.grad_accum  # 0: no short group, nothing to show
        return [
            (
                short > 0
                and len(self.ddp_steps) == len(self.groups) == -(-self.micro_batches // self.grad_accum)
                and all(abs(g - 1.0) < 1e-6 for g in self.ddp_steps),
                f"train_ddp.py steps on the short last group of {short} too, dividing by its length",
            ),
            (
                short > 0
                and len(self.accelerate_steps) == self.micro_batches // self.grad_accum
                and abs(self.left - short / self.grad_accum) < 1e-6,
                f"... Accelerate does not: it divides by grad_accum ({short}/{self.grad_accum} = {self.left:.2f} of a "
                "gradient) and holds it for the next epoch's step",
            ),
        ]


def short_last_group(micro_batches: int = 4, grad_accum: int = 3) -> ShortGroup:
    """Run one epoch both ways in this process (under a second): train_ddp.py's grouping (epochs.accumulate) and its
    division by len(group), and a real Accelerator with train_accelerate.py's calls on an unprepared loader."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from distrinews_lib.training import epochs

    def one_weight():
        model = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.zeros_(model.weight)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        used = []
        optimizer.register_step_post_hook(lambda *_: used.append(float(model.weight.grad)))
        return model, optimizer, used

    x = torch.ones(1, 1)  # d(model(x))/dw = 1 for every micro-batch
    model, optimizer, ddp_used = one_weight()
    groups = [len(g) for g in epochs.accumulate(list(range(micro_batches)), grad_accum)]
    for group in groups:
        for _ in range(group):
            (model(x).sum() / group).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model, optimizer, acc_used = one_weight()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=grad_accum)
    try:
        prepared, prepared_opt = accelerator.prepare(model, optimizer)
        for _ in range(micro_batches):
            with accelerator.accumulate(prepared):
                accelerator.backward(prepared(x).sum())
                prepared_opt.step()
                prepared_opt.zero_grad(set_to_none=True)
        left = float(model.weight.grad) if model.weight.grad is not None else 0.0
    finally:
        AcceleratorState._reset_state(True)  # the notebook's process is not an Accelerate run afterwards
        GradientState._reset_state()
    return ShortGroup(micro_batches, grad_accum, groups, ddp_used, acc_used, left)


def deepspeed_notice(result) -> str | None:
    """One line for the learner when the Accelerate log holds DeepSpeed's CPU warning (DeepSpeed installed for
    chapter 06, no GPU here): accelerator.unwrap_model imports DeepSpeed to look for its engine. Harmless."""
    said = sum(DEEPSPEED_ON_CPU in line for line in result.lines)
    if not said:
        return None
    return f"(the Accelerate log also holds DeepSpeed's CPU warning, {said}x: harmless, see the folded note)"


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
