"""Chapter 05's check of DDP's two terms, at the smallest batch, from an independent measurement: DDP's step there
predicted as the `nocomm` run's step (DDP without its send, same round) plus the all-reduce that section 1's alpha-beta
fit gives for the gradient bytes (a separate launch of bare all-reduces, no training run). A model where DDP is free
(the pair's step alone) fails it, and so does one that leaves out either term where that term is over the margin.

    claim = ddp_terms.terms_claim(sweep)      # 'checked: ...' where its rounds ran quiet; else a NOTE's reason
    print(ddp_terms.blind_facts(sweep))       # the speedup points a DDP-free model passes too: printed as facts
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
                predicted=nocomm + comm,
                free=lockstep_s(runs["pair"]),
                quiet=quiet.all_quiet(list(runs.values()), sweep.gpus),
            )
        )
    return out


def terms_ratio(rows: list[dict], key: str = "predicted") -> float:
    """The median over the rounds of `key` / the DDP step measured in the same round."""
    return statistics.median(r[key] / r["ddp"] for r in rows)


def terms_claim(sweep, bound: float = BOUND) -> Claim:
    """DDP's step at the smallest batch, predicted from nocomm's step plus section 1's fitted all-reduce of the
    gradient bytes, is within the point's margin (loopback.point_margin: BOUND, or twice its rounds' spread) of the
    measured step, on the median over its rounds. The all-reduce term comes from bare collectives, never from a
    training run, so the check is not DDP's step against itself; the pair's step alone (DDP free) is printed beside
    it. Checked where every round ran quiet and the point's rounds agreed (point_margin is not None)."""
    rows, b = terms_rounds(sweep), sweep.batches[0]
    ratio, free = terms_ratio(rows), terms_ratio(rows, "free")
    m = point_margin(sweep.pts[0], bound)
    within = bound if m is None else m
    med = lambda key: 1000 * statistics.median(r[key] for r in rows)  # noqa: E731
    text = (
        f"at {b} per process DDP's step ({med('ddp'):.1f} ms) is nocomm's step + section 1's fitted all-reduce of "
        f"{sweep.model.grad_bytes / 2**20:.1f} MiB ({1000 * sweep.model.comm_s:.1f} ms) = {med('predicted'):.1f} ms, "
        f"within {100 * within:.0f}%: predicted / measured {ratio:.2f} (DDP free, the pair's step alone: {free:.2f})"
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
    """The speedup points a model where DDP is free passes too (`blind`), as facts: their model and measured speedup
    and the DDP-free model's ratio. Not checks: such a point cannot test DDP's terms; terms_claim can."""
    return "\n".join(
        f"fact, not a check: at {p['b']} per process the model says {p['predicted']:.2f}x, the run "
        f"{p['measured']:.2f}x; a model where DDP is free gives model / measured {free_ratio(p):.2f}, inside the "
        "margin, so this point cannot test DDP's terms"
        for p, bl in zip(sweep.pts, blind)
        if bl
    )
