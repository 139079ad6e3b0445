"""Chapter 03's mixed-precision section, the notebook's side of the race's `mixed` section (race_mixed.py): its tables,
its figure, and the claims its figures support.

    m = zres["mixed"]                       # report.run_race([... "--sections", "zero,mixed" ...])
    print(table(m)); plot(m); settle(claims(m))
    print(loss_scale_table(m)); settle(loss_scale_claims(m))
"""

from __future__ import annotations

from ..claims import Claim
from ..plots import finish

MiB = 2**20
# Chapter 06's calculator predicts the fp32 ZeRO rungs' peaks within 15% (chapter 03's zero section); its mode for
# FSDP2's split is held to the same. The measured spread between the two ranks is under 2%.
MEMORY_MARGIN = 0.15


def gathers(collectives: list) -> list:
    return [e for e in collectives if e["name"].startswith("gather")]


def table(m: dict) -> str:
    """Per precision: the weights against FSDP2's, the bytes of the largest gather and of the largest reduce-scatter,
    and the peak per rank during a block's compute against chapter 06's calculator ('-': not measured)."""
    c, mem = m["collectives"], m["memory"] or {}
    batch = f" ({m['memory_batch']} texts per rank)" if m.get("memory_batch") else ""
    first = f"ZeRO-3, {m['memory_batch']} texts/rank" if mem and m.get("memory_batch") else "ZeRO-3 by hand"
    head = (first, "max |w - w_FSDP2|", "largest gather", "largest reduce", "peak MiB/rank", "calculator")
    widths = (22, 17, 14, 14, 13, 10)
    lines = [" ".join(f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w) in enumerate(zip(head, widths)))]
    for label in ("float32", "float16"):  # (bfloat16 moves float16's bytes: the claims below name its FSDP2 check)
        ev, peak, vs = c.get(label), mem.get(f"zero3 {label}"), m["vs_fsdp2"].get(label)
        cells = [
            label if label == "float32" else f"{label} (param_dtype)",
            "-" if vs is None else f"{vs:.3g}",
            "-" if not ev else f"{max(e['bytes'] for e in gathers(ev)) / MiB:.2f} MiB",
            "-" if not ev else f"{max(e['bytes'] for e in ev if e['name'].startswith('grads')) / MiB:.2f} MiB",
            "-" if not peak else f"{max(peak['compute_mb_per_rank']):.1f}",
            "-" if not peak else f"{peak['calculator_mb']:.1f}",
        ]
        lines.append(" ".join(f"{x:<{w}}" if i == 0 else f"{x:>{w}}" for i, (x, w) in enumerate(zip(cells, widths))))
    if mem and batch:
        lines.append(f"peaks: a step's forward and backward{batch}; the gathers and reduces: any batch")
    low, full = gathers(c.get("float16") or []), gathers(c.get("float32") or [])
    if low and full:  # a fact of the given code, not a check: Block allocates the gathered block in param_dtype
        share = sum(e["bytes"] for e in low) / sum(e["bytes"] for e in full)
        lines.append(
            f"the {len(low)} gathers of a float16 step move {share:.2f}x float32's bytes: zero3.py's Block (given "
            "code) allocates each gathered block in param_dtype"
        )
    return "\n".join(lines)


def claims(m: dict) -> list:
    """FSDP2's arithmetic (the same casts, the same sums in the same order: bit-identical), fp32 reduce-scatters
    (the gradients summed in reduce_dtype), and the peak against the calculator: float16 lowers it far from half, as the
    gathered block, its gradient and the activations take 2 bytes a number instead of 4 while the fp32 master shards,
    AdamW's state and the runtime do not shrink. (The gathers' halved bytes are
    table()'s printed fact: zero3.py's Block, given code, allocates the gathered block in param_dtype.)"""
    c, vs = m["collectives"], m["vs_fsdp2"]
    reduces = {label: [e["bytes"] for e in c[label] if e["name"].startswith("grads")] for label in c}
    out = [
        Claim(
            f"with param_dtype float16 and bfloat16, ZeRO-3 by hand ends {m['steps']} steps of AdamW bit-identical to "
            f"torch's FSDP2 with the same MixedPrecisionPolicy (max difference {vs['float16']:.3g}, "
            f"{vs['bfloat16']:.3g})",
            vs["float16"] == 0.0 and vs["bfloat16"] == 0.0,
        ),
        Claim(
            f"with param_dtype float16 the {len(reduces['float16'])} reduce-scatters of a step keep float32's bytes "
            f"(the largest {max(reduces['float16'] or [0]) / MiB:.2f} MiB in both): the gradients are summed in "
            "reduce_dtype, float32",
            len(reduces["float16"]) > 0 and reduces["float16"] == reduces["float32"],
        ),
    ]
    mem = m.get("memory")
    if mem:
        for label in ("zero3 float32", "zero3 float16"):
            got, est = max(mem[label]["compute_mb_per_rank"]), mem[label]["calculator_mb"]
            out.append(
                Claim(
                    f"{label}: the peak during a block's compute, {got:.1f} MiB per rank, is within "
                    f"{100 * MEMORY_MARGIN:.0f}% of chapter 06's calculator ({est:.1f} MiB, "
                    f"{'its fp32 mode' if 'float32' in label else 'its mode for this split'})",
                    all(abs(p / est - 1) <= MEMORY_MARGIN for p in mem[label]["compute_mb_per_rank"]),
                )
            )
        # each rank against itself: the same texts, the same shards, float32 then float16. The ranks' peaks differ by
        # up to 2 MiB (when a prefetched gather's pages are written): at 8 texts per rank the predicted saving (~4 MiB)
        # was about that noise, and two runs in four measured none on a rank, so the memory runs take 32 (race.py's
        # --mixed_batch), where it is ~10 MiB. The check still stands down where the saving is within twice the spread.
        hi, lo = mem["zero3 float32"]["compute_mb_per_rank"], mem["zero3 float16"]["compute_mb_per_rank"]
        gaps = [h - low for h, low in zip(hi, lo)]
        saving = mem["zero3 float32"]["calculator_mb"] - mem["zero3 float16"]["calculator_mb"]
        spread = max(max(r) - min(r) for r in (hi, lo))
        out.append(
            Claim(
                f"param_dtype float16 lowers that peak on every rank, by {min(gaps):.1f} MiB at least of "
                f"{max(hi):.1f} ({100 * min(gaps) / max(hi):.0f}%; the calculator predicts {saving:.1f}): far from "
                "half",
                min(gaps) > 0 and all(low > h / 2 for h, low in zip(hi, lo)),
                None
                if saving > 2 * spread
                else f"the predicted saving, {saving:.1f} MiB, is within twice the ranks' own spread, {spread:.1f} MiB",
            )
        )
    return out


def loss_scale_table(m: dict) -> str:
    lines = [f"{'one backward':<18} {'entries lost to 0':>17} {'not finite':>10} {'error of the gradient':>21}"]
    for label, u in m["underflow"].items():
        err = "-" if u["rel_error"] is None else f"{100 * u['rel_error']:.2f}%"
        lines.append(f"{label:<18} {100 * u['lost_share']:>16.2f}% {u['nonfinite']:>10} {err:>21}")
    return "\n".join(lines)


def loss_scale_claims(m: dict) -> list:
    """float16 loses small gradients to zero unless the loss is scaled; too large a scale overflows; bfloat16, with
    float32's exponent range, loses none to speak of (at 10x fewer than float16's at least)."""
    u = m["underflow"]
    raw, scaled, over, bf = u["float16 x1"], u["float16 x1024"], u["float16 x65536"], u["bfloat16"]
    return [
        Claim(
            f"float16 turns {100 * raw['lost_share']:.1f}% of the gradient's nonzero entries into zeros; with the loss "
            f"scaled by 1024 (and the fp32 gradient divided back) {100 * scaled['lost_share']:.2f}%",
            raw["lost_share"] > 10 * scaled["lost_share"] and raw["nonfinite"] == scaled["nonfinite"] == 0,
        ),
        Claim(
            f"a scale of 65536 overflows: {over['nonfinite']} entries of the gradient are not finite (a GradScaler "
            "skips that step and halves its scale)",
            over["nonfinite"] > 0,
        ),
        Claim(
            f"bfloat16 needs no scale: {100 * bf['lost_share']:.2f}% lost, none overflowed (its 8 exponent bits are "
            f"float32's; its shorter mantissa costs precision instead: {100 * bf['rel_error']:.1f}% off the fp32 "
            "gradient)",
            bf["nonfinite"] == 0 and bf["lost_share"] * 10 < raw["lost_share"],
        ),
    ]


def plot(m: dict, save_to=None):
    """Two panels: the bytes of each collective of one step, float32 against param_dtype float16; and the peak memory
    per rank during a block's compute, measured against chapter 06's calculator."""
    from ..plots import _pyplot

    plt = _pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [3, 2]})
    c = m["collectives"]
    names = [e["name"] for e in c["float32"]]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [e["bytes"] / MiB for e in c["float32"]], 0.4, label="float32")
    ax.bar([i + 0.2 for i in x], [e["bytes"] / MiB for e in c["float16"]], 0.4, label="param_dtype float16")
    ax.set_xticks(list(x), names, rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="MiB per collective (its whole buffer)", title="one step of ZeRO-3 by hand, in order")
    ax.legend(fontsize=8, loc="upper center")
    mem = m.get("memory") or {}
    labels = [k for k in ("zero3 float32", "zero3 float16", "fsdp2 float16") if k in mem]
    bx.bar(
        [i - 0.2 for i in range(len(labels))],
        [max(mem[k]["compute_mb_per_rank"]) for k in labels],
        0.4,
        label="measured",
    )
    bx.bar(
        [i + 0.2 for i in range(len(labels))],
        [mem[k]["calculator_mb"] for k in labels],
        0.4,
        label="chapter 06's calculator",
    )
    bx.set_xticks(range(len(labels)), labels, fontsize=8)
    bx.set(ylabel="MiB per rank", title="peak during a block's compute")
    bx.legend(fontsize=8, loc="lower right")
    return finish(fig, save_to)
