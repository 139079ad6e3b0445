"""The course's plots of a run: loss and accuracy per epoch, and what an experiment tracker recorded."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def load_metrics(run_dir) -> dict:
    path = Path(run_dir) / "metrics.json" if Path(run_dir).is_dir() else Path(run_dir)
    return json.loads(path.read_text())


def _pyplot():
    import matplotlib  # deferred on purpose: the backend must be chosen before pyplot is imported

    if not os.environ.get("MPLBACKEND") and "ipykernel" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def finish(fig, save_to=None):
    """Every course figure ends alike: laid out, saved where asked (folders made), returned for the notebook."""
    fig.tight_layout()
    if save_to:
        Path(save_to).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_to, dpi=110)
    return fig


def integer_epochs(ax) -> None:
    """Epochs are whole numbers: no 1.5 on the axis."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def step_curve(m: dict, window: int = 20) -> tuple[list, list]:
    """The training loss of every optimizer step metrics.json records (rank 0's share under DDP; only the steps this
    launch ran, after a resume), smoothed over `window` steps, at x = its place in epochs (step i of n in epoch e:
    e - 1 + i / n). ([], []) for a record without per-step losses."""
    xs, ys = [], []
    for e in m["epochs"]:
        losses = e.get("step_losses") or []
        n = e.get("optimizer_steps") or len(losses)
        first = n - len(losses)  # steps before a resume are not in this launch's list
        for i, loss in enumerate(losses):
            xs.append(e["epoch"] - 1 + (first + i + 1) / n)
            ys.append(loss)
    smooth = [sum(ys[max(0, i - window + 1) : i + 1]) / len(ys[max(0, i - window + 1) : i + 1]) for i in range(len(ys))]
    return xs, smooth


def plot_metrics(runs: dict, save_to=None, chance: float | None = 0.25):
    """Loss and accuracy for one or more runs ({label: metrics.json path or dict}); returns the figure. The training
    loss is drawn per optimizer step (step_curve) where the record has it, per epoch otherwise; the held-out loss
    and accuracy once per epoch, at the epoch's end.

    The accuracy axis starts at chance (25% for AG News' four classes), not at whatever the runs reached,
    so a 0.5-point wiggle does not look like a cliff; the title names the data."""
    plt = _pyplot()
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.6))
    titles = set()
    for label, m in runs.items():
        m = m if isinstance(m, dict) else load_metrics(m)
        titles.add(m["data"].get("title", m["data"]["source"]))
        ep = [e["epoch"] for e in m["epochs"]]
        xs, ys = step_curve(m)
        if xs:
            (line,) = ax_loss.plot(xs, ys, "-", lw=1.0, label=f"{label} train (per step, mean of the last 20)")
        else:
            (line,) = ax_loss.plot(ep, [e["train_loss"] for e in m["epochs"]], "o-", label=f"{label} train")
        ax_loss.plot(ep, [e["val_loss"] for e in m["epochs"]], "s--", color=line.get_color(), label=f"{label} val")
        ax_acc.plot(ep, [100 * e["val_accuracy"] for e in m["epochs"]], "o-", label=label)
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy", title="loss", xlim=(0, None))
    ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", title="validation accuracy", ylim=(100 * (chance or 0), 100))
    if chance:
        ax_acc.axhline(100 * chance, color="grey", lw=0.8, ls=":", label="chance")
    for ax in (ax_loss, ax_acc):
        integer_epochs(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"data: {', '.join(sorted(titles))}", fontsize=10)
    fig.tight_layout()
    if save_to:
        Path(save_to).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_to, dpi=110)
    return fig


def read_tensorboard(run_dir) -> dict:
    """{tag: [(step, value), ...]} from the TensorBoard event files a run wrote (what TensorBoard would plot)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # optional (the track extra)

    acc = EventAccumulator(str(Path(run_dir) / "tensorboard"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def predicted_vs_measured(
    xs, predicted, measured, *, labels=None, hline=None, vline=None, xlabel="", title="", save_to=None, ylim=None
):
    """Chapter 05's speedup plots: a prediction (dashed) against the measurement, on a log x axis.
    hline / vline: (value, label) of a reference line (the ideal N x, 1 process, a break-even rate)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(xs, predicted, "s--", label="predicted before the run")
    ax.plot(xs, measured, "o-", label="measured")
    if hline:
        ax.axhline(hline[0], color="k", lw=0.8, ls=":", label=hline[1])
    if vline:
        ax.axvline(vline[0], color="tab:red", lw=0.8, ls="--", label=vline[1])
    ax.set(xscale="log", xlabel=xlabel, ylabel="speedup over 1 process", title=title)
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_xticks(xs, labels or [str(x) for x in xs])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())  # no '6x10^1' over '64'
    ax.legend(fontsize=7)
    fig.tight_layout()
    if save_to:
        fig.savefig(save_to, dpi=110)
    return fig
