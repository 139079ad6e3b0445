"""Chapters 01 and 02's pictures: the training script's parts in the order they run (02 marks what DDP adds and
changes), and where the trained classifier goes wrong (a confusion matrix)."""

from __future__ import annotations

from .plots import _pyplot

# (what the script calls, what it is for, how chapter 02's DDP script treats it: same, changed or new)
PARTS = [
    ("torchrun_env, init_process_group", "who am I? join the process group", "new"),
    ("config.setup", "flags and a preset", "changed"),
    ("resolve_device, resolve_amp", "the device, the precision", "changed"),
    ("plan.decide, plan.prepare", "data and model, decided once", "changed"),
    ("sampler + DataLoader", "which examples, in which order", "changed"),
    ("optimizer, scheduler, scaler", "AdamW, warm-up and decay, fp16 scaling", "same"),
    ("Snapshotter.resume", "continue a crashed run", "same"),
    ("DDP(model)", "broadcast rank 0's weights, hook backward", "new"),
    ("the loop", "forward, loss, backward, clip, step", "changed"),
    ("evaluate", "loss and accuracy on held-out texts", "same"),
    ("max_param_difference", "do all ranks hold the same weights?", "new"),
    ("save_checkpoint", "one file, for serving", "changed"),
]
COLOURS = {"same": "#d0ebff", "changed": "#ffd8a8", "new": "#ffa8a8"}
LEGEND = {
    "same": "the same line in train_ddp.py",
    "changed": "changed for DDP (a sampler, rank 0 decides or saves, no_sync)",
    "new": "new in train_ddp.py",
}


def script_map(ddp: bool = False):
    """The training script's parts, top to bottom in the order they run. ddp=False: train_single.py's parts (01);
    ddp=True: train_ddp.py's, coloured by what chapter 02 changes or adds."""
    from matplotlib.patches import FancyBboxPatch, Patch

    plt = _pyplot()
    parts = [p for p in PARTS if ddp or p[2] != "new"]
    fig, ax = plt.subplots(figsize=(9, 0.42 * len(parts) + 0.8))
    for row, (call, what, change) in enumerate(parts):
        colour = COLOURS[change] if ddp else COLOURS["same"]
        height = 0.62
        ax.add_patch(
            FancyBboxPatch((0, row - height / 2), 3.8, height, boxstyle="round,pad=0.04", fc=colour, ec="k", lw=0.7)
        )
        ax.text(0.12, row, call, va="center", fontsize=8.5, family="monospace")
        ax.text(4.1, row, what, va="center", fontsize=8.5)
        if row:
            ax.annotate(
                "",
                xy=(1.9, row - height / 2 - 0.02),
                xytext=(1.9, row - 0.68),
                arrowprops=dict(arrowstyle="->", lw=0.8),
            )
    ax.set(xlim=(-0.1, 8.2), ylim=(len(parts) - 0.4, -0.6))
    ax.axis("off")
    name = "scripts/train_ddp.py against train_single.py" if ddp else "scripts/train_single.py"
    ax.set_title(f"{name}: its parts, in the order they run", fontsize=10)
    if ddp:
        ax.legend(
            handles=[Patch(fc=COLOURS[k], ec="k", lw=0.7, label=v) for k, v in LEGEND.items()],
            fontsize=8,
            loc="lower right",
        )
    fig.tight_layout()
    return fig


def confusion_figure(counts, names, title: str = ""):
    """counts[true][predicted] as a heat map, each row in % of that class's texts, with the counts written in."""
    plt = _pyplot()
    share = [[c / max(1, sum(row)) for c in row] for row in counts]
    fig, ax = plt.subplots(figsize=(4.8, 4.0))
    ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    for i, row in enumerate(counts):
        for j, c in enumerate(row):
            ax.text(
                j,
                i,
                f"{c}\n{100 * share[i][j]:.0f}%",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if share[i][j] > 0.6 else "black",
            )
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set(xlabel="predicted class", ylabel="true class", title=title or "where the classifier goes wrong")
    fig.tight_layout()
    return fig
