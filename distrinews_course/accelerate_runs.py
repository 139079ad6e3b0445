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
from fractions import Fraction
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


BLOCKS = ("for ", "while ", "if ", "elif ", "else:", "with ", "try:", "except", "finally:")


def _blocks(lines: list[str], k: int) -> list[str]:
    """The block headers line k sits under, innermost first: each earlier, less indented line opening a block."""
    out, indent = [], len(lines[k]) - len(lines[k].lstrip())
    for line in reversed(lines[:k]):
        code, depth = line.split("  # ")[0].rstrip(), len(line) - len(line.lstrip())
        if code.lstrip().startswith(BLOCKS) and depth < indent:
            out.append(code.strip())
            indent = depth
    return out


def _header(code: str) -> str:
    """A block header as a short name: a header whose brackets open onto the next lines ends '(...):'."""
    return code if code.count("(") == code.count(")") else code.split("(")[0] + "(...):"


def step_diff(ddp="scripts/train_ddp.py", accelerate="scripts/train_accelerate.py") -> tuple[str, int, int]:
    """train_ddp.py's training step against train_accelerate.py's, line by line: '- ' only in train_ddp.py, '+ '
    only in train_accelerate.py, '  ' in both under the same blocks, '~ ' the same text under other blocks (so it
    runs at other times), with train_ddp.py's innermost block named. Returns (the text, lines removed, added)."""
    a, b = _region(ddp, *STEP_DDP), _region(accelerate, *STEP_ACCELERATE)
    matcher = difflib.SequenceMatcher(None, [x.strip() for x in a], [x.strip() for x in b], autojunk=False)
    out, removed, added = [], 0, 0
    for tag, a1, a2, b1, b2 in matcher.get_opcodes():
        if tag == "equal":
            for i, j in zip(range(a1, a2), range(b1, b2)):
                there, here = _blocks(a, i), _blocks(b, j)
                moved = there[:-1] != here[:-1]  # each region's own loop aside
                ddp_block = f"  # train_ddp.py: under `{_header(there[0])}`" if moved and there else ""
                out.append(("~ " if moved else "  ") + b[j] + ddp_block)
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
    return (
        f"one optimizer step: {removed} lines of train_ddp.py became {added} of train_accelerate.py; {moved} of the "
        f"{removed} ({', '.join(calls)}) went into the course's Run, not into Accelerate."
    )


def _makeup(held: list[tuple[int, int]]) -> str:
    """[(epoch, micro-batch), ...] as words: 'epoch 1's 4 + epoch 2's 1, 2'."""
    by_epoch: dict[int, list[int]] = {}
    for epoch, k in held:
        by_epoch.setdefault(epoch, []).append(k)
    return " + ".join(f"epoch {e}'s {', '.join(map(str, ks))}" for e, ks in by_epoch.items())


@dataclass
class ShortGroup:
    """`epochs` epochs of `micro_batches` micro-batches at `grad_accum`, run in this process: train_ddp.py's groups
    (its real epochs.accumulate) and a real Accelerator with train_accelerate.py's calls on an unprepared loader.
    Each micro-batch owns one weight of the model (a one-hot input, gradient 1), so the gradient an optimizer step
    used says which micro-batches it held, and at what share."""

    micro_batches: int
    grad_accum: int
    epochs: int
    groups: list[list[int]]  # each epoch's group lengths by train_ddp.py's epochs.accumulate
    accelerate_steps: list[list[tuple[int, int, float]]]  # each Accelerate step: (epoch, micro-batch, share) held
    left: list[tuple[int, int, float]]  # what Accelerate left in .grad after the last epoch

    def _expected(self) -> tuple[list[list[tuple[int, int]]], list[tuple[int, int]]]:
        """Accelerate's rule (_do_sync): one count over all epochs, a step at every multiple of grad_accum."""
        flat = [(e, k) for e in range(1, self.epochs + 1) for k in range(1, self.micro_batches + 1)]
        cut = len(flat) - len(flat) % self.grad_accum
        return [flat[i : i + self.grad_accum] for i in range(0, cut, self.grad_accum)], flat[cut:]

    def table(self) -> str:
        def share(step) -> str:  # the shares the gradient showed, as fractions: '1/3 each'
            fr = sorted({str(Fraction(x).limit_denominator(64)) for _, _, x in step})
            return (
                f"{fr[0]} each" if len(fr) == 1 else ", ".join(str(Fraction(x).limit_denominator(64)) for *_, x in step)
            )

        lines = [
            f"{self.epochs} epochs of {self.micro_batches} micro-batches, grad_accum {self.grad_accum}:",
            f"  train_ddp.py (epochs.accumulate): groups {self.groups[0]} in each epoch -> "
            f"{sum(map(len, self.groups))} optimizer steps, each group's loss divided by its length",
            f"  Accelerate (one count over the epochs): {len(self.accelerate_steps)} optimizer steps",
        ]
        for i, step in enumerate(self.accelerate_steps, 1):
            lines.append(f"    step {i}: {_makeup([(e, k) for e, k, _ in step])} ({share(step)})")
        if self.left:
            lines.append(
                f"    left in .grad, never stepped: {_makeup([(e, k) for e, k, _ in self.left])} ({share(self.left)})"
            )
        return "\n".join(lines)

    def claims(self) -> list[tuple]:
        """train_ddp.py's grouping (its real epochs.accumulate) ends every epoch with the short group, so no group
        spans two epochs; the real Accelerator steps at every grad_accum-th micro-batch counted over the epochs, each
        share 1/grad_accum, so a step spans the epoch boundary. Tolerance on the shares: float32's 1/3."""
        short = self.micro_batches % self.grad_accum  # 0: no short group, nothing to show
        ddp = [self.grad_accum] * (self.micro_batches // self.grad_accum) + [short] * (short > 0)
        steps, left = self._expected()
        held = [[(e, k) for e, k, _ in step] for step in self.accelerate_steps]
        shares = [x for step in [*self.accelerate_steps, self.left] for _, _, x in step]
        spans = next((s for s in steps if len({e for e, _ in s}) > 1), None)
        return [
            (
                short > 0
                and self.epochs > 1
                and all(g == ddp for g in self.groups)
                and len(self.groups) == self.epochs,
                f"train_ddp.py's epochs.accumulate groups each epoch on its own, ending it with its short group of "
                f"{short}: no group spans two epochs",
            ),
            (
                short > 0
                and spans is not None
                and held == steps
                and [(e, k) for e, k, _ in self.left] == left
                and all(abs(x - 1 / self.grad_accum) < 1e-6 for x in shares),
                f"... Accelerate keeps counting into the next epoch: its step {steps.index(spans) + 1 if spans else 0} "
                f"held {_makeup(spans or [])}, each divided by grad_accum ({self.grad_accum})",
            ),
        ]


def short_last_group(micro_batches: int = 4, grad_accum: int = 3, epochs: int = 2) -> ShortGroup:
    """Run `epochs` epochs both ways in this process (about a second): train_ddp.py's grouping (epochs.accumulate),
    and a real Accelerator with train_accelerate.py's calls (accumulate, backward, step, zero_grad) on a loader it
    did not prepare, as train_accelerate.py's training loader is not."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState

    from distrinews_lib.training import epochs as E

    groups = [[len(g) for g in E.accumulate(list(range(micro_batches)), grad_accum)] for _ in range(epochs)]
    n = epochs * micro_batches
    model = torch.nn.Linear(n, 1, bias=False)  # weight j: micro-batch j's, counted over the epochs
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)

    def held(grad) -> list[tuple[int, int, float]]:
        return [(j // micro_batches + 1, j % micro_batches + 1, float(g)) for j, g in enumerate(grad.flatten()) if g]

    steps = []
    optimizer.register_step_post_hook(lambda *_: steps.append(held(model.weight.grad)))
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=grad_accum)
    try:
        prepared, prepared_opt = accelerator.prepare(model, optimizer)
        for j in range(n):
            x = torch.nn.functional.one_hot(torch.tensor([j]), n).float()  # d(model(x))/dw = 1 at weight j only
            with accelerator.accumulate(prepared):
                accelerator.backward(prepared(x).sum())
                prepared_opt.step()
                prepared_opt.zero_grad(set_to_none=True)
        left = held(model.weight.grad) if model.weight.grad is not None else []
    finally:
        AcceleratorState._reset_state(True)  # the notebook's process is not an Accelerate run afterwards
        GradientState._reset_state()
    return ShortGroup(micro_batches, grad_accum, epochs, groups, steps, left)


def deepspeed_notice(result) -> str | None:
    """One line for the learner when the Accelerate log holds DeepSpeed's CPU warning (DeepSpeed installed for
    chapter 06, no GPU here): accelerator.unwrap_model imports DeepSpeed to look for its engine. Harmless."""
    said = sum(DEEPSPEED_ON_CPU in line for line in result.lines)
    if not said:
        return None
    return f"(the Accelerate log also holds DeepSpeed's CPU warning, {said}x: harmless, see the folded note)"


def launch_pair(out, nproc: int, same: list, timeout: float):
    """Chapter 09's two runs, one after the other, with the same flags `same`: train_ddp.py under torchrun, then
    train_accelerate.py under accelerate launch, each into out/<ddp|accelerate>/ (metrics.json, model.pt, the
    tracker's files, launch.log with the whole output). Shows each run's key lines. Returns (ddp, accelerate)."""
    import shutil

    from .launch import accelerate_launch, torchrun
    from .notebook import keep_log

    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    runs = []
    for name, launcher, script in (
        ("ddp", torchrun, "train_ddp.py"),
        ("accelerate", accelerate_launch, "train_accelerate.py"),
    ):
        args = [*same, "--output", out / name, "--checkpoint", out / name / "model.pt"]
        runs.append(launcher(f"scripts/{script}", nproc, args, timeout=timeout, echo=False))
        keep_log(runs[-1], out / name / "launch.log", show=key_lines)
    notice = deepspeed_notice(runs[-1])
    if notice:
        print(notice)
    return tuple(runs)


def launch_claims(result, nproc: int) -> list[tuple]:
    """The script saw a world of `nproc` (its set-up line). That `nproc` ranks started is not a claim here:
    launch.accelerate_launch counts each rank's marker and raises LaunchError before this runs when they differ."""
    return [(f"world size {nproc}" in result.output, f"the script saw a world of {nproc} processes")]


def same_launch_claim(gap: float, other: str = "torchrun") -> tuple[bool, str]:
    """Exercise 1: train_accelerate.py launched by `other` against accelerate launch. The launcher only starts the
    processes, so the weights must be the same bit for bit (gap 0.0, no tolerance)."""
    if gap == 0.0:
        return True, f"{other} and accelerate launch ran the same script the same way: identical weights"
    return False, f"{other}'s weights differ from accelerate launch's by up to {gap:g}: not the same training"


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
        counts eval_n held-out texts (an odd count: a padded duplicate must not be counted; a count, not ids)."""
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
                f"... and both counted {eval_n} held-out texts: the padding duplicates dropped",
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
        ax1.plot(*zip(*ddp["train/loss_step"]), lw=1, label="train_ddp.py: every step, rank 0")
        ax1.plot(ends, acc["train/loss"], "s", ms=7, mfc="none", label="Accelerate's tracker: epoch mean, all ranks")
        ax1.set(xlabel="optimizer step", ylabel="training loss", title="from the TensorBoard event files")
        ax2.plot(ends, [100 * v for _, v in ddp["val/accuracy"]], "o-", label="train_ddp.py")
        ax2.plot(ends, [100 * v for v in acc["val/accuracy"]], "s", ms=9, mfc="none", label="Accelerate")
        ax2.set(xlabel="optimizer step", ylabel="validation accuracy (%)", ylim=(20, 100), title=m["data"]["title"])
        ax2.axhline(25, color="grey", ls=":", lw=0.8)
        for ax in (ax1, ax2):
            ax.legend(fontsize=8)
        fig.tight_layout()
        return fig
