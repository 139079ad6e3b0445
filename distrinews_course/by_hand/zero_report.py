"""Chapter 03's ZeRO section, the notebook's side of the race's `zero` section (race_memory.py): its table and the
claims its figures support (ZeRO-2 and ZeRO-3 against FSDP2, the peaks against chapter 06's calculator, the bytes
and collectives per step).

    print(table(zres)); settle(claims(zres, res))
"""

from __future__ import annotations

from ..claims import Claim

MiB = 2**20
# The calculator holds the fp32 ZeRO stages' measured peaks within this share (it leaves out small buffers: a few MiB
# of ~65); FSDP2 by hand ends within this of torch's FSDP2 (bit-identical at 2 ranks, where each sum has two terms).
PEAK_MARGIN, WEIGHT_TOLERANCE = 0.15, 1e-6
SHOWN = ("ddp", "zero1", "zero2", "zero3", "fsdp2")


def table(zres: dict) -> str:
    s = zres["sharding"]
    zero, ddp_bytes = s["contenders"], s["contenders"]["ddp"]["bytes_per_step"]
    lines = [
        f"tiny model, {s['batch']} texts x {s['seq']} tokens per rank; calculator runtime {s['runtime_mb']:.1f} MiB\n",
        f"{'':>6} {'peak MiB/rank':>13} {'calculator':>10} {'error':>6} {'collectives/step':>16} "
        f"{'ring MiB/step':>13} {'vs DDP':>6} {'max |w - w_FSDP2|':>17}",
    ]
    for n in SHOWN:
        z = zero[n]
        peak, vs = max(z["peak_mb_per_rank"]), z.get("max_weight_diff_vs_fsdp2")
        vs = "reference" if n == "fsdp2" else "" if vs is None else f"{vs:.3g}"  # FSDP2 is what the others meet
        lines.append(
            f"{n:>6} {peak:>13.1f} {z['calculator_mb']:>10.1f} {100 * (peak / z['calculator_mb'] - 1):>+5.1f}% "
            f"{z['collectives_per_step']:>16.0f} {z['bytes_per_step'] / MiB:>13.2f} "
            f"{z['bytes_per_step'] / ddp_bytes:>5.2f}x {vs:>17}"
        )
    lines.append(
        "ring MiB/step: the ring formula on each step's logged calls, what a ring would send, not what gloo sent"
    )
    lines.append(
        "on a ring ZeRO-1 and ZeRO-2 send DDP's volume (a reduce-scatter then an all-gather are a ring all-reduce's "
        "two halves); gloo here sent ZeRO-1 what question 5 measured above"
    )
    return "\n".join(lines)


def claims(zres: dict, blocks: int) -> list:
    """ZeRO-2 and ZeRO-3 end within WEIGHT_TOLERANCE of FSDP2; every sharded peak within PEAK_MARGIN of the calculator;
    each stage holds less at its peak than the one before, from torch's DDP (not from the hand-built unsharded rungs,
    which peak lower); ZeRO-3's calls come to 1.5x DDP's ring bytes as FSDP2's do, in 3 collectives per block
    (`blocks`: the tiny model's). ZeRO-1's and ZeRO-2's ring bytes equal DDP's by the ring formula itself (a
    reduce-scatter plus an all-gather of one buffer is an all-reduce of it), so table() prints that as a fact, beside
    each stage's collectives per step; what gloo sent is chapter 03's question 5, measured."""
    s = zres["sharding"]
    zero, steps = s["contenders"], s["steps"]
    peaks = {n: max(zero[n]["peak_mb_per_rank"]) for n in zero}
    r3 = zero["zero3"]["bytes_per_step"] / zero["ddp"]["bytes_per_step"]
    out = [
        Claim(
            f"{n} by hand ends {steps} steps within {WEIGHT_TOLERANCE:g} of torch's FSDP2 (max weight difference "
            f"{zero[n]['max_weight_diff_vs_fsdp2']:.3g})",
            zero[n]["max_weight_diff_vs_fsdp2"] <= WEIGHT_TOLERANCE,
        )
        for n in ("zero2", "zero3")
    ]
    out += [
        Claim(
            f"{n}: measured peak {peaks[n]:.1f} MiB per rank, within {100 * PEAK_MARGIN:.0f}% of chapter 06's "
            f"calculator ({zero[n]['calculator_mb']:.1f} MiB)",
            abs(peaks[n] / zero[n]["calculator_mb"] - 1) <= PEAK_MARGIN,
        )
        for n in ("zero2", "zero3", "fsdp2")
    ]
    out += [
        Claim(
            "each stage holds less at its peak than the one before: ZeRO-3 < ZeRO-2 < ZeRO-1 < torch's DDP ("
            + ", ".join(f"{peaks[n]:.1f}" for n in ("zero3", "zero2", "zero1", "ddp"))
            + " MiB)",
            peaks["zero3"] < peaks["zero2"] < peaks["zero1"] < peaks["ddp"],
        ),
        Claim(
            f"ZeRO-3's calls come to {r3:.3f}x DDP's ring bytes, as FSDP2's do (weights gathered twice, gradients "
            "reduce-scattered once)",
            abs(r3 - 1.5) < 0.01 and zero["fsdp2"]["bytes_per_step"] == zero["zero3"]["bytes_per_step"],
        ),
        Claim(
            f"ZeRO-3: {3 * blocks} collectives per step on the tiny model ({blocks} blocks x gather, gather, "
            "reduce-scatter)",
            zero["zero3"]["collectives_per_step"] == 3 * blocks,
        ),
    ]
    return out


# What each stage keeps of the fp32 training state, per rank: the share of weights, gradients and AdamW's two moments
# (1 = whole, 1/world = a shard), and the collectives its step sends (the rungs' scripts, zero1.py ... zero3.py).
STAGES = {
    "DDP": ((1, 1, 1), "all-reduce the gradients"),
    "ZeRO-1": ((1, 1, "shard"), "reduce-scatter the gradients, all-gather the weights"),
    "ZeRO-2": ((1, "shard", "shard"), "reduce-scatter each bucket, all-gather the weights"),
    "ZeRO-3": (("shard", "shard", "shard"), "per block: all-gather the weights twice, reduce-scatter its gradients"),
}


def held_mib(n_params: int, world: int) -> dict:
    """{stage: {"weights", "gradients", "adamw": MiB}} each rank keeps between steps (ZeRO-3 between a block's uses),
    fp32: 4 bytes a weight, 4 a gradient, 8 for AdamW's two moments; a sharded part is 1/world of it."""
    full = {"weights": 4 * n_params / MiB, "gradients": 4 * n_params / MiB, "adamw": 8 * n_params / MiB}
    return {
        stage: {part: mib / (world if share == "shard" else 1) for (part, mib), share in zip(full.items(), shares)}
        for stage, (shares, _) in STAGES.items()
    }


def plot_held(n_params: int, world: int, save_to=None):
    """The picture of the ZeRO stages: per stage, a bar of what each rank keeps (weights, gradients, AdamW state; a
    hatched part is a 1/world shard), and the collectives its step sends."""
    from ..plots import _pyplot

    plt = _pyplot()
    held = held_mib(n_params, world)
    fig, ax = plt.subplots(figsize=(9, 3.2))
    colours = {"weights": "tab:blue", "gradients": "tab:orange", "adamw": "tab:green"}
    for y, (stage, parts) in enumerate(held.items()):
        left = 0.0
        for (part, mib), share in zip(parts.items(), STAGES[stage][0]):
            sharded = share == "shard"
            label = {"adamw": "AdamW state"}.get(part, part) if y == 0 else None
            ax.barh(
                y, mib, left=left, color=colours[part], hatch="//" if sharded else None, edgecolor="white", label=label
            )
            left += mib
        ax.text(left + 0.3, y, STAGES[stage][1], va="center", fontsize=8)
    ax.set_yticks(range(len(held)), list(held))
    ax.invert_yaxis()
    ax.set_xlim(0, 1.9 * sum(held["DDP"].values()))
    ax.set(xlabel="MiB kept per rank (fp32)", title=f"What each of {world} ranks keeps, and what its step sends")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=3, fontsize=8, title=f"hatched: a 1/{world} shard")
    fig.tight_layout()
    if save_to:
        from pathlib import Path

        Path(save_to).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(save_to, dpi=110)
    return fig
