"""Chapter 11's figures, each drawn from the run's own figures.

    perplexity_per_epoch(ppl, nproc, data_title)   validation perplexity, epoch 0 being the untrained model
    text_surprise(pairs)                           per held-out text, how many times likelier the trained model finds it
    masks(first, again, vocab)                     which positions the masked LM predicts, per epoch and rank
    lm_idea(words, n_blocks, nproc)                the idea before the code: the one-token shift, and the validation
                                                   blocks dealt over the ranks with the sampler's repeat counted once

Each returns the figure (shown in a notebook, saved with save_to).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from .plots import _pyplot, integer_epochs


def _done(fig, save_to):
    """Lay the figure out, save it where asked, and show it here in a notebook (before the cell's checks)."""
    fig.tight_layout()
    if save_to:
        Path(save_to).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_to, dpi=110)
    if "ipykernel" in sys.modules:
        _pyplot().show()
    return fig


def perplexity_per_epoch(ppl: list, nproc: int, data_title: str, vocab: int | None = None, save_to=None):
    """Validation perplexity per epoch on a log axis (epoch 0: before training), with the vocabulary's size, the
    perplexity of a model that knows nothing, dotted."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    ax.plot(range(len(ppl)), ppl, "o-", label=f"validation perplexity, {nproc} processes")
    if vocab:
        ax.axhline(vocab, color="grey", ls=":", lw=1, label=f"the vocabulary: {vocab} tokens, a flat guess")
    for e, p in enumerate(ppl):
        ax.annotate(f"{p:.0f}", (e, p), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set(
        yscale="log",
        xlabel="epoch (0: before training)",
        ylabel="validation perplexity (log)",
        title=f"tiny causal LM trained with DDP | {data_title}, text only",
    )
    integer_epochs(ax)
    ax.legend(fontsize=8)
    return _done(fig, save_to)


def text_surprise(pairs: list, save_to=None):
    """For each real held-out text, its perplexity under the untrained model over the trained model's: how many times
    less surprised training left the model, texts sorted, on a log axis, with 1x (no change) and the median."""
    plt = _pyplot()
    ratios = sorted(before / after for before, after in pairs)
    median = statistics.median(ratios)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar(range(len(ratios)), ratios, color="#2e86c1")
    ax.axhline(1, color="black", lw=1, label="1x: no better than before training")
    ax.axhline(median, color="#c0392b", ls="--", lw=1, label=f"the median text: {median:.0f}x")
    ax.set(
        yscale="log",
        xlabel=f"real held-out text (of {len(ratios)}), sorted",
        ylabel="untrained / trained perplexity",
        title="How much likelier the trained model finds real text",
    )
    ax.legend(fontsize=8, loc="upper left")
    return _done(fig, save_to)


def masks(first: dict, again: dict, save_to=None):
    """The first block of each rank's first batch, per epoch: the positions the masked LM must predict, dark. The
    row 'again' is a fresh sampler and collator at the first epoch, as a resumed run builds them."""
    plt = _pyplot()
    from distrinews_lib.lm import data as lm

    rows, names = [], []
    for (epoch, rank), batch in sorted(first.items()):
        rows.append((batch["labels"][0] != lm.IGNORE).int().tolist())
        names.append(f"epoch {epoch}, rank {rank}")
        if (epoch, rank) == min(first):
            rows.append((again["labels"][0] != lm.IGNORE).int().tolist())
            names.append(f"epoch {epoch}, rank {rank}, again")
    fig, ax = plt.subplots(figsize=(8, 0.42 * len(rows) + 1.2))
    ax.imshow(rows, cmap="Greys", vmin=0, vmax=1.4, aspect="auto")
    ax.set_yticks(range(len(rows)), names)
    ax.set_xticks(range(0, len(rows[0]), 4))
    ax.set(
        xlabel="position in the block", title="Masked LM: the positions to predict (dark), first block of each batch"
    )
    return _done(fig, save_to)


def validation_deal(n_blocks: int, nproc: int) -> dict:
    """{rank: the validation block indices it evaluates}, from torch's own DistributedSampler as train_ddp.py builds it
    (shuffle=False): each rank takes every nproc-th index, the list padded from its start to a multiple of nproc."""
    from torch.utils.data import DistributedSampler

    return {
        r: list(DistributedSampler(range(n_blocks), num_replicas=nproc, rank=r, shuffle=False)) for r in range(nproc)
    }


def lm_idea(words: list, n_blocks: int, nproc: int, save_to=None):
    """Chapter 11's idea in one picture. Left: a causal LM's targets are its inputs shifted by one, so position t is
    scored on token t+1 and the last position on nothing. Right: DistributedSampler deals the validation blocks over
    the ranks (validation_deal); where n_blocks does not divide by nproc it repeats blocks from the start, hatched,
    and the gathered evaluation counts each block index once."""
    plt = _pyplot()
    deal = validation_deal(n_blocks, nproc)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 3.3), gridspec_kw={"width_ratios": [1.25, 1]})
    n = len(words)
    for i, word in enumerate(words):
        ax.text(i, 1, word, ha="center", va="center", fontsize=8, bbox=dict(boxstyle="round", fc="#d0ebff"))
        target = words[i + 1] if i + 1 < n else "(none)"
        ax.text(i, 0, target, ha="center", va="center", fontsize=8, bbox=dict(boxstyle="round", fc="#ffd8a8"))
        if i + 1 < n:
            ax.annotate("", xy=(i, 0.2), xytext=(i, 0.8), arrowprops=dict(arrowstyle="->", lw=1))
            ax.plot([i + 1, i], [0.82, 0.18], ":", color="grey", lw=0.8)
    ax.text(-0.7, 1, "input,\nposition t", ha="right", va="center", fontsize=8)
    ax.text(-0.7, 0, "target:\ntoken t+1", ha="right", va="center", fontsize=8)
    ax.set(xlim=(-2.2, n - 0.4), ylim=(-0.5, 1.5), title="causal LM: the labels are the inputs, shifted by one")
    ax.axis("off")
    seen = set()
    for rank, indices in deal.items():
        for k, index in enumerate(indices):
            repeat = index in seen
            seen.add(index)
            bx.add_patch(
                plt.Rectangle(
                    (k, -rank - 0.4),
                    0.9,
                    0.8,
                    fc="white" if repeat else f"C{rank}",
                    alpha=1 if repeat else 0.45,
                    ec="black",
                    hatch="//" if repeat else None,
                )
            )
            label = f"block {index}" + (" again:\ncounted once" if repeat else "")
            box = dict(fc="white", ec="none", pad=1) if repeat else None
            bx.text(k + 0.45, -rank, label, ha="center", va="center", fontsize=8, bbox=box)
    each = len(deal[0])
    padded = each * nproc - n_blocks
    bx.set_yticks([-r for r in deal], [f"rank {r}" for r in deal])
    bx.set(
        xlim=(-0.2, each + 0.1),
        ylim=(-nproc + 0.4, 0.6),
        xticks=[],
        xlabel=f"gathered by block index: the {padded} repeat{'' if padded == 1 else 's'} dropped, each block counted "
        "once,\nperplexity = exp(all loss sums / all tokens), as one process would get it",
        title=f"validation: {n_blocks} blocks dealt over {nproc} ranks by DistributedSampler",
    )
    for side in ("top", "right", "bottom"):
        bx.spines[side].set_visible(False)
    return _done(fig, save_to)
