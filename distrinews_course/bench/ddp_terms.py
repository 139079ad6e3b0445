"""Chapter 05's check of DDP's two terms, at the smallest batch, from an independent measurement: DDP's step there
predicted as the `nocomm` run's step (DDP without its send, same round) plus the all-reduce that section 1's alpha-beta
fit gives for the gradient bytes (a separate launch of bare all-reduces, no training run). A model where DDP is free
(the pair's step alone) fails it, and so does one that leaves out either term where that term is over the margin.

    claim = ddp_terms.terms_claim(sweep)      # 'checked: ...' where its rounds ran quiet; else a NOTE's reason
    print(ddp_terms.blind_facts(sweep, ratio, blind))  # the speedup points a DDP-free model passes too: not checked
"""

from __future__ import annotations

import statistics

from ..claims import Claim
from . import quiet
from .loopback import BOUND, lockstep_s, point_margin, step_s


def terms_rounds(sweep) -> list[dict]:
    """Per round at the smallest batch: the DDP step measured, its prediction (nocomm's step + the fit's all-reduce),
    and the DDP-free prediction (the pair's step), in seconds; whether the round's three runs ran quiet."""
    b, comm, out = sweep.batches[0], sweep.model.comm_s, []
    for k in range(sweep.rounds):
        runs = {kind: sweep.R[f"{kind}_b{b}_r{k}"] for kind in ("nocomm", "pair", "ddp")}
        ddp, nocomm = step_s(runs["ddp"]), step_s(runs["nocomm"])
        out.append(
            dict(
                ddp=ddp,
                nocomm=nocomm,
                predicted=nocomm + comm,
                half=nocomm + comm / 2,
                free=lockstep_s(runs["pair"]),
                quiet=quiet.all_quiet(list(runs.values()), sweep.gpus),
            )
        )
    return out


def terms_ratio(rows: list[dict], key: str = "predicted") -> float:
    """The median over the rounds of `key` / the DDP step measured in the same round."""
    return statistics.median(r[key] / r["ddp"] for r in rows)


def median_round(rows: list[dict]) -> dict:
    """The round whose predicted / measured is the median (the lower middle where the count is even): the check reads
    its ratio, and the line prints that round's own figures, so the printed ms give the printed ratio."""
    return sorted(rows, key=lambda r: r["predicted"] / r["ddp"])[(len(rows) - 1) // 2]


def verdicts(ratios: dict, within: float, untestable: tuple = ()) -> str:
    """{wrong model: model / measured} in words: the ones outside `within` (the check fails them) and the ones inside
    it, with `untestable` (wrong models the check's inputs hold), which the check cannot tell from the right model."""
    fails = [f"{k} ({v:.2f})" for k, v in ratios.items() if abs(v - 1) >= within]
    blind = [f"{k} ({v:.2f})" for k, v in ratios.items() if abs(v - 1) < within] + list(untestable)
    words = lambda xs: " or ".join([", ".join(xs[:-1]), xs[-1]] if len(xs) > 1 else xs)  # noqa: E731
    said = [f"it fails a model {words(fails)}"] if fails else []
    said += [f"it cannot tell a model {words(blind)}"] if blind else []
    return "; ".join(said)


def point_wrong_models(sweep, p: dict) -> dict:
    """One speedup point's model / measured (the median over the rounds its check reads) for three wrong models:
    DDP free (the pair's step alone), without DDP's own work, and with half the all-reduce."""
    pool = [r for r in p["rounds"] if r["quiet"]] or p["rounds"]
    own, comm = sweep.model.overhead_s, sweep.model.comm_for(p["b"])
    med = lambda step: statistics.median(r["ddp"] / step(r) for r in pool)  # noqa: E731
    return {
        "with DDP free": med(lambda r: r["pair"]),
        "without DDP's own work": med(lambda r: r["pair"] + comm),
        "with half the all-reduce": med(lambda r: r["pair"] + own + comm / 2),
    }


def terms_claim(sweep, bound: float = BOUND) -> Claim:
    """DDP's step at the smallest batch, predicted from nocomm's step plus section 1's fitted all-reduce of the
    gradient bytes, is within the point's margin (loopback.point_margin: BOUND, or twice its rounds' spread) of the
    measured step, in the round of the median ratio (median_round). The all-reduce term comes from bare collectives,
    never from a training run, so the check is not DDP's step against itself. The line says which wrong models it
    fails (DDP free: the pair's step alone; half the all-reduce) and which it cannot tell (no DDP's own work: nocomm's
    step holds it). Checked where every round ran quiet and the point's rounds agreed (point_margin is not None)."""
    rows, b = terms_rounds(sweep), sweep.batches[0]
    kept = median_round(rows)
    ratio = kept["predicted"] / kept["ddp"]
    m = point_margin(sweep.pts[0], bound)
    within = bound if m is None else m
    each = ", ".join(f"{r['predicted'] / r['ddp']:.2f}" for r in rows)
    wrong = {"with DDP free": terms_ratio(rows, "free"), "with half the all-reduce": terms_ratio(rows, "half")}
    text = (
        f"at {b} per process, in the round of the median ratio, DDP's step ({1000 * kept['ddp']:.1f} ms) against "
        f"nocomm's step ({1000 * kept['nocomm']:.1f} ms) + section 1's fitted all-reduce of "
        f"{sweep.model.grad_bytes / 2**20:.1f} MiB ({1000 * sweep.model.comm_s:.1f} ms) = "
        f"{1000 * kept['predicted']:.1f} ms: predicted / measured {ratio:.2f} (its {len(rows)} rounds: "
        f"{each}), within {100 * within:.0f}%; "
        + verdicts(wrong, within, ("without DDP's own work (nocomm's step holds it)",))
    )
    if not all(r["quiet"] for r in rows):
        why = quiet.busy_reason(
            [sweep.R[f"{k}_b{b}_r{i}"] for k in ("nocomm", "pair", "ddp") for i in range(len(rows))]
        )
    elif m is None:
        why = "the host moved whole runs at this batch (section 3's table)"
    else:
        why = None
    return Claim(text, abs(ratio - 1) < within, why)


def blind_facts(sweep, free_ratio, blind: list[bool]) -> str:
    """The speedup points a model where DDP is free passes too (`blind`), in one plain line each: their model and
    measured speedup, not checked, and why (the DDP-free model's ratio). terms_claim tests DDP's terms instead."""
    return "\n".join(
        f"at {p['b']} per process the model says {p['predicted']:.2f}x, the run {p['measured']:.2f}x: not checked, "
        f"as a model with DDP free lands as close ({free_ratio(p):.2f})"
        for p, bl in zip(sweep.pts, blind)
        if bl
    )
