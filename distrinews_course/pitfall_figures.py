"""Chapter 04's figures, each drawn from what a pitfall's script measured (its JSON), broken beside fixed.

    epoch_orders(r)        pitfall 1: which samples each rank saw, epoch by epoch
    allreduces_per_micro(r)  pitfall 8: the all-reduces each micro-batch's backward made
    who_waits(res, timeout_s)  pitfall 9: where each rank of the broken launch waited, how long, and how it ended
    running_means(r)       pitfall 12: BatchNorm's running means per channel, per rank, and one process's
    lr_curves(r)           pitfall 13: test accuracy against the samples seen

Each but who_waits reads the JSON; who_waits reads the broken launch's output. Each returns the figure (shown in a
notebook, saved with save_to).
"""

from __future__ import annotations

import sys
from pathlib import Path

from .pitfall_symptoms import lr_runs
from .plots import _pyplot

BROKEN, FIXED, ONE = "#c0392b", "#27ae60", "black"


def _done(fig, save_to):
    """Lay the figure out, save it where asked, and show it here in a notebook (before the cell's checks)."""
    fig.tight_layout()
    if save_to:
        Path(save_to).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_to, dpi=110)
    if "ipykernel" in sys.modules:
        _pyplot().show()
    return fig


def epoch_orders(r: dict, save_to=None):
    """Pitfall 1: one row per (rank, epoch), one cell per position in that rank's order, the sample's index written
    in it and its colour. Broken, a rank's rows repeat; fixed, every epoch has its own order."""
    plt = _pyplot()
    world, epochs, n = r["world_size"], r["epochs"], r["n"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.45 * world * epochs + 1.3), sharey=True)
    cmap, top = ("tab20", 19) if n <= 20 else ("viridis", n - 1)  # a colour per sample, where there are few
    for ax, mode in zip(axes, ("broken", "fixed")):
        rows = [order for orders in r[mode]["orders_per_rank"] for order in orders]
        ax.imshow(rows, cmap=cmap, vmin=0, vmax=top, aspect="auto")
        for y, row in enumerate(rows):
            for x, sample in enumerate(row):
                ax.text(x, y, str(sample), ha="center", va="center", fontsize=8)
        ax.set_yticks(range(len(rows)), [f"rank {k} epoch {e}" for k in range(world) for e in range(epochs)])
        for k in range(1, world):
            ax.axhline(k * epochs - 0.5, color="white", lw=3)
        distinct = r[mode]["distinct_orders_per_rank"][0]
        title = "without set_epoch" if mode == "broken" else "with set_epoch(epoch)"
        ax.set(title=f"{title}: {distinct} order(s) per rank", xlabel="position in the rank's epoch")
    fig.suptitle(f"Pitfall 1: the samples ({n}, each its own index) each rank saw, epoch by epoch", fontsize=10)
    return _done(fig, save_to)


def allreduces_per_micro(r: dict, save_to=None):
    """Pitfall 8: for one optimizer step of K micro-batches, the bucket all-reduces each micro-batch's backward made,
    without no_sync and with it; the time of the step in the legend."""
    plt = _pyplot()
    k = r["accum"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    width = 0.38
    for i, (mode, colour) in enumerate((("broken", BROKEN), ("fixed", FIXED))):
        x = r[mode]
        label = (
            f"{'without' if mode == 'broken' else 'with'} no_sync: {x['allreduce_per_step']:.0f} all-reduces, "
            f"{x['ms_per_step']:.1f} ms per step"
        )
        ax.bar(
            [m + 1 + (i - 0.5) * width for m in range(k)],
            x["allreduce_per_micro_batch"],
            width,
            color=colour,
            label=label,
        )
    ax.set(
        xlabel="micro-batch of one optimizer step",
        ylabel="bucket all-reduces in its backward",
        xticks=range(1, k + 1),
        title=f"Pitfall 8: accumulating {k} micro-batches on {r['world_size']} ranks",
    )
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8, loc="upper left")
    return _done(fig, save_to)


def running_means(r: dict, save_to=None):
    """Pitfall 12: BatchNorm's running mean per channel after training, for one process holding the global batch,
    and for every rank without and with the synchronised layer."""
    plt = _pyplot()
    ref = r["reference"]["running_mean"]
    channels = range(len(ref))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), sharey=True)
    for ax, mode, colour in zip(axes, ("broken", "fixed"), (BROKEN, FIXED)):
        ax.plot(channels, ref, "s", color=ONE, ms=9, mfc="none", label="1 process, the global batch")
        for rank, s in enumerate(r[mode]["per_rank"]):
            ax.plot(
                channels, s["running_mean"], "o^v<>"[rank % 5], color=colour, ms=5, label=f"rank {rank} ({s['type']})"
            )
        ax.set(xlabel="channel", title=f"{mode}: off the global batch's by up to {r[mode]['mean_diff_to_global']:.2g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("running mean after training")
    fig.suptitle(f"Pitfall 12: {r['batch_per_rank']} samples per rank, {r['steps']} steps", fontsize=10)
    return _done(fig, save_to)


def lr_curves(r: dict, save_to=None):
    """Pitfall 13: test accuracy after every step against the training samples seen, for one process, DDP with the
    same learning rate, and DDP with the scaled one; chance (4 classes) dotted."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for (name, curve), style in zip(lr_runs(r), ["k-", "r--", "g-"]):
        ax.plot([c[0] for c in curve], [c[2] for c in curve], style, label=name)
    ax.axhline(0.25, color="grey", lw=0.8, ls=":", label="chance (4 classes)")
    ax.set(
        xlabel="training samples seen",
        ylabel="test accuracy",
        ylim=(0, 1),
        xlim=(0, r["n_train"] * r["epochs"]),
        title=f"Pitfall 13 on synthetic data (4 classes, {r['n_train']:,} training samples, linear model, SGD)",
    )
    ax.legend(loc="lower right", fontsize=8)
    return _done(fig, save_to)


def who_waits(res, timeout_s: float, save_to=None):
    """Pitfall 9, from the broken launch: each rank's wait in the collective it was in (rank 0 in its lone
    all_reduce, the others in the next one, the script's barrier), as long as the rank measured it (waited_s), and
    how it ended, read from the rank's own error line (pitfall_failures.rank_outcomes); the timeout dashed."""
    from .demo import results
    from .pitfall_failures import rank_outcomes

    waited = {int(x["rank"]): float(x["waited_s"]) for x in results(res.output) if "waited_s" in x}
    ends = rank_outcomes(res)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(waited) + 1.4))
    for rank, w in sorted(waited.items()):
        ax.barh(rank, w, height=0.5, color=BROKEN if rank == 0 else "#e67e22", alpha=0.75)
        where = "in its all_reduce, alone" if rank == 0 else "in the next collective (barrier)"
        ax.text(0.05, rank, where, va="center", fontsize=8, color="white")
        ax.text(w, rank, f"  {ends.get(rank, 'no error line')} after {w:.1f} s", va="center", fontsize=8)
    ax.axvline(timeout_s, color="grey", ls="--", lw=1, label=f"--ddp_timeout {timeout_s:g} s")
    ax.set_yticks(sorted(waited), [f"rank {k}" for k in sorted(waited)])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.6 * max([timeout_s, *waited.values()]))
    ax.set(xlabel="seconds a rank waited (its own clock)", title="Pitfall 9: who waits where, and how it ends")
    ax.legend(fontsize=8, loc="lower right")
    return _done(fig, save_to)
