"""Chapter 06's figures: one rank's memory through a step (the calculator's picture), the activations against the
tokens of a step, the calculator against the measured peaks, and what a rank holds under each kind of sharding.
Each function draws one figure from numbers it is given and returns it; sizes are MiB."""

from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .plots import _pyplot

# one colour per part of a rank's memory, the same in every figure of the chapter
COLOURS = {
    "weights": "#4c72b0",
    "optimizer state": "#8172b2",
    "DDP buckets": "#64b5cd",
    "gathered unit": "#a1c9f4",
    "runtime": "#bbbbbb",
    "activations": "#dd8452",
    "gradients": "#55a868",
    "AdamW temporaries": "#c44e52",
}
HELD = ("weights", "optimizer state", "DDP buckets", "gathered unit", "runtime")


def _step_curves(parts_mb: dict, points: int = 41) -> tuple[list, dict]:
    """The calculator's model of a step over time: forward (0 to 1) saves activations; backward (1 to 2) frees
    them as it makes the gradients; the optimizer step (2 to 2.4) adds AdamW's temporaries. What is held never
    changes."""
    xs = [2 * i / (points - 1) for i in range(points)] + [2.0, 2.4]
    curves = {k: [parts_mb.get(k, 0.0)] * len(xs) for k in HELD}
    a, g, t = (parts_mb[k] for k in ("activations", "gradients", "AdamW temporaries"))
    curves["activations"] = [a * (x if x <= 1 else 2 - x) for x in xs[:points]] + [0.0, 0.0]
    curves["gradients"] = [g * max(0.0, x - 1) for x in xs[:points]] + [g, g]
    curves["AdamW temporaries"] = [0.0] * points + [t, t]
    return xs, curves


def step_timeline(estimates: dict, title: str = ""):
    """One panel per estimate ({label: memory.Estimate}): a rank's memory through forward, backward and the
    optimizer step, stacked by part, with the peak the calculator gives marked."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(estimates), figsize=(5 * len(estimates), 3.4), sharey=True, squeeze=False)
    for ax, (label, e) in zip(axes[0], estimates.items()):
        xs, curves = _step_curves(e.parts_mb)
        shown = {k: v for k, v in curves.items() if max(v) > 0}
        ax.stackplot(xs, *shown.values(), labels=list(shown), colors=[COLOURS[k] for k in shown], alpha=0.9)
        ax.axhline(e.peak_mb, color="k", lw=0.8, ls="--")
        ax.text(0.02, e.peak_mb, f" peak {e.peak_mb:,.0f} MiB", va="bottom", fontsize=8)
        ax.set_xticks([0.5, 1.5, 2.2], ["forward", "backward", "optimizer\nstep"])
        for x in (1, 2):
            ax.axvline(x, color="grey", lw=0.6, ls=":")
        ax.set(title=label, xlim=(0, 2.4), ylim=(0, 1.15 * max(x.peak_mb for x in estimates.values())))
    axes[0][0].set_ylabel("one rank's memory (MiB)")
    handles, labels = axes[0][-1].get_legend_handles_labels()
    axes[0][-1].legend(handles[::-1], labels[::-1], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def activations_figure(rows: list[dict], formula):
    """The bytes autograd saved against the tokens of a step, one marker per sequence length, and the formula's
    line at sequence length 64 (`formula(tokens)` in MiB)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    plain = [x for x in rows if x["formula"] is not None]
    for seq, marker in zip(sorted({x["seq"] for x in plain}), "osv^D"):
        pts = sorted((x["tokens"], x["saved"]) for x in plain if x["seq"] == seq)
        ax.plot([t for t, _ in pts], [m for _, m in pts], marker, label=f"measured, seq {seq}")
    top = max(x["tokens"] for x in plain)
    tokens = list(range(64, top + 1, 64))
    ax.plot(tokens, [formula(t) for t in tokens], "-", lw=1, color="grey", label="formula, seq 64")
    ax.set(xlabel="tokens per step (batch x seq)", ylabel="activations saved (MiB)", title="tiny model, fp32")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def calculator_figure(rows: list[dict]):
    """Each run's measured peak (a bar, coloured by what the row can test) and the calculator's (a black tick)."""
    plt = _pyplot()
    colour = {"checked": "tab:blue", "= calibration": "#9ecae1", "section 6": "#9ecae1", "not modelled": "#cccccc"}
    fig, ax = plt.subplots(figsize=(9, 0.28 * len(rows) + 1.2))
    names = [f"{x['name']} x{x['world']}" for x in rows]
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, [x["measured"] for x in rows], color=[colour[x["kind"]] for x in rows], height=0.7)
    for y, x in zip(ys, rows):
        if x["pred"] is not None:
            ax.plot([x["pred"]] * 2, [y - 0.4, y + 0.4], color="k", lw=2)
    ax.set_yticks(ys, names, fontsize=8)
    ax.set(xlabel="peak above the process's start (MiB)", title="the calculator (black) against the measured peaks")
    handles = [
        Patch(color=c, label=f"measured: {kind}")
        for kind, c in (("checked", "tab:blue"), ("at the calibration's peak", "#9ecae1"), ("not modelled", "#cccccc"))
    ]
    handles.append(Line2D([], [], color="k", lw=2, label="calculator"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def held_figure(rows: list[dict], world: int):
    """What the fullest rank holds on its tensors under each variant (weights, gradients, optimizer state, stacked)
    beside its measured peak (a diamond)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(rows) + 1.3))
    ys = list(range(len(rows)))[::-1]
    left = [0.0] * len(rows)
    for key, part in (("params", "weights"), ("grads", "gradients"), ("optim", "optimizer state")):
        widths = [x[key] for x in rows]
        ax.barh(ys, widths, left=left, color=COLOURS[part], height=0.7, label=f"held: {part}")
        left = [a + b for a, b in zip(left, widths)]
    ax.plot([x["peak"] for x in rows], ys, "kD", ms=5, label="measured peak")
    ax.set_yticks(ys, [x["name"] for x in rows], fontsize=8)
    ax.set(xlabel="MiB on the fullest rank", title=f"what one of {world} ranks holds, and its peak (tiny model)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def parts_figure(parts: list, peak: float, title: str):
    """A measured peak beside its parts stacked ([(what, MiB), ...], each measured or computed apart)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 2.8))
    left = 0.0
    for (what, mb), c in zip(parts, ("#4c72b0", "#64b5cd", "#c44e52", "#bbbbbb", "#dd8452")):
        ax.barh([1], [mb], left=left, color=c, height=0.6, label=what.split(":")[0].split(" (")[0])
        left += mb
    ax.barh([0], [peak], color="#555555", height=0.6)
    ax.set_yticks([1, 0], ["the parts", "measured peak"], fontsize=8)
    ax.set(xlabel="MiB on one of 2 ranks", title=title)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=len(parts))
    fig.tight_layout()
    return fig
