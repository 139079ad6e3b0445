"""Chapter 03's facts about torch's DDP, answered on the race's own figures: why the tiny model's buckets cannot
overlap (one backward's ready order), and the interview questions (race.py's `facts` section). Each function returns
the lines a learner reads or the claims those figures support; the margins live here, each with why it is what it is.

    e = embedding_last(model, order, ddp_bucket_bytes); print(embedding_lines(e)); settle(embedding_claims(e))
    print(interview_lines(res["facts"], res["timing"])); settle(interview_claims(res["facts"], res["timing"], 0.3))
"""

from __future__ import annotations

import re

from ..claims import Claim
from .loopback_race import quiet

MiB = 2**20
EMBEDDING = "distilbert.embeddings.word_embeddings.weight"


def embedding_last(model, order: list, ddp_bucket_bytes: list, name: str = EMBEDDING) -> dict:
    """The word embedding's share of the gradient bytes and its place in one backward's ready `order` (names, as the
    hooks noted them), beside torch's DDP's bucket sizes on the same model (bytes)."""
    sizes = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
    return {
        "share": sizes[name] / sum(sizes.values()),
        "position": order.index(name) + 1,
        "tensors": len(order),
        "ddp_buckets_mib": [round(b / MiB, 2) for b in ddp_bucket_bytes],
    }


def embedding_lines(e: dict) -> str:
    return (
        f"word embedding: {100 * e['share']:.1f}% of the gradient bytes, ready {e['position']}th of {e['tensors']}: "
        "a constant of the tiny model and of autograd's order for it; "
        "whatever the bucket size, that share can only be sent after backward\n"
        f"torch's DDP on the same model: buckets of {e['ddp_buckets_mib']} MiB"
    )


def embedding_claims(e: dict) -> list:
    """Why nothing overlaps on the tiny model. The embedding's share and place (embedding_lines) are constants of the
    tiny model and autograd's order for it, so they are printed, not checked: no rung or race could change them. One
    DDP bucket is what "nothing to overlap" means: with 2 or more, the bytes ready before the embedding would leave
    under backward, so the sentence is checked at exactly 1."""
    n = len(e["ddp_buckets_mib"])
    return [
        Claim(
            f"torch's DDP itself makes {n} bucket{'' if n == 1 else 's'} of the tiny model: nothing to overlap", n == 1
        ),
    ]


def interview_lines(f: dict, t: dict) -> str:
    """The interview questions' figures that are shown, not checked: messages and step times (1), DDP's buckets in
    its first three steps (3), and the bytes each collective put on the wire (5)."""
    per, med = t["collectives_per_step"], t["median_step_s"]
    ready, defined = f["ddp_rebuild"]["ready_order"], f["ddp_rebuild"]["definition_order"]
    seen = f["ddp_rebuild"]["buckets_seen_per_step"]
    lines = [
        f"1. Why buckets? naive: {per['naive']:.0f} messages/step, {med['naive']:.3f} s; flat: 1 message, "
        f"{med['flat']:.3f} s; bucketed: {per['bucketed']:.0f} messages that can also overlap backward, "
        f"{med['bucketed']:.3f} s",
        "2. Why in reverse order? backward produces the last layers' gradients first",
        f"3. Why does DDP's first step differ? its buckets in steps 1, 2, 3 (gradient storages): {seen}; the ready "
        f"order against reverse definition order: {sum(a != b for a, b in zip(ready, reversed(defined)))} of "
        f"{len(ready)} differ",
        f"4. What does gradient_as_bucket_view save? a second copy of the gradients per rank: "
        f"{sum(f['ddp_buckets_wide']) / MiB:.1f} MiB on the wide model (the gradients ARE the buckets, not copied in)",
    ]
    cb = f["collective_bytes"]
    if cb.get("all_reduce"):
        ag, rs = cb["all_gather"] / cb["all_reduce"], cb["reduce_scatter"] / cb["all_reduce"]
        lines += [
            f"5. ZeRO-1's bytes? on the wire (both ranks) for a {cb['buffer_bytes'] / MiB:.1f} MiB buffer: all-reduce "
            f"{cb['all_reduce'] / MiB:.1f} MiB, reduce-scatter {rs:.2f}x, all-gather {ag:.2f}x: ZeRO-1 {ag + rs:.2f}x "
            "DDP's here, as gloo's reduce-scatter is not a ring's. A ring all-reduce IS a reduce-scatter then an "
            "all-gather, 0.5x each (chapter 05 builds it): "
            "on a ring ZeRO-1 costs DDP's volume"
        ]
    return "\n".join(lines)


def interview_claims(f: dict, t: dict, quiet_cores: float) -> list:
    """The interview answers the run checks.
    1. naive's many small messages are slower than flat's one: a speed claim, checked on a quiet machine only.
    2. the first half of the gradients ready are exactly the second half of the parameters as defined: a set, so a
       swap inside a layer (autograd's choice) does not matter, and a forward order would fail it.
    3. DDP's first step uses ONE bucket (gradient storages counted with gradient_as_bucket_view) and the next two as
       many as DDP's reducer reports, more than one: a rebuild from one to one would show nothing.
    4. with gradient_as_bucket_view the gradients' storages are the buckets; without it one per gradient: exact.
    5. on 2 ranks an all-gather moves half an all-reduce's bytes (the per-process write counter, /proc/self/io,
       over 3 calls): 0.15 spares what else the process writes meanwhile and still fails an all-gather that moved a
       whole all-reduce's bytes or a quarter of them. A reduce-scatter moves at least half (each rank must receive
       the other's half of the sums); gloo's moves a whole all-reduce's, so no upper bound; 0.45, not 0.5, leaves a
       tenth for a counter that reads low (none known), while one that skipped the exchange reads 0.
    Where the machine cannot count bytes (no /proc/self/io), 5 is shown unchecked with that reason."""
    per, med = t["collectives_per_step"], t["median_step_s"]
    ready, defined = f["ddp_rebuild"]["ready_order"], f["ddp_rebuild"]["definition_order"]
    seen, buckets = f["ddp_rebuild"]["buckets_seen_per_step"], len(f["ddp_buckets_wide"])
    gv, cb = f["gradient_as_bucket_view"], f["collective_bytes"]
    busy = None if quiet(t, quiet_cores) else f"other programs kept {t['foreign_cores'] or 0:.2f} cores busy"
    out = [
        Claim(f"1. {per['naive']:.0f} small messages cost more than one big one", med["naive"] > med["flat"], busy),
        Claim(
            "2. the first half of the gradients to become ready are exactly the second half of the parameters as "
            "defined",
            set(defined[len(defined) // 2 :]) == set(ready[: len(ready) // 2]),
        ),
        Claim(
            f"3. DDP's first step runs with ONE bucket: it does not know yet in which order gradients arrive. It "
            f"records that order during the first backward, then rebuilds {seen[1]} buckets of bucket_cap_mb in it",
            seen[0] == 1 and seen[1] == seen[2] == buckets > 1,
        ),
        Claim(
            f"4. with gradient_as_bucket_view the {len(defined)} gradients ARE views into DDP's {buckets} buckets: "
            f"{gv['True']['grad_storages']} storages, where without it each gradient has its own "
            f"({gv['False']['grad_storages']})",
            gv["False"]["grad_storages"] == len(defined) and gv["True"]["grad_storages"] == buckets,
        ),
    ]
    if cb.get("all_reduce"):
        ag, rs = cb["all_gather"] / cb["all_reduce"], cb["reduce_scatter"] / cb["all_reduce"]
        out += [
            Claim(f"5. an all-gather moves half the bytes of an all-reduce ({ag:.2f}x)", abs(ag - 0.5) < 0.15),
            Claim(
                f"5. a reduce-scatter moves no less than half an all-reduce's bytes ({rs:.2f}x): each rank still "
                "receives the other's half of the buffer",
                rs >= 0.45,
            ),
        ]
    else:
        out.append(Claim("5. an all-gather moves half an all-reduce's bytes", False, "no /proc/self/io to count bytes"))
    return out


DRIFT = re.compile(
    r"started (?P<before>\S+) apart and end (?P<after>\S+) apart; their moves differ by (?P<moved>\S+) \| "
    r"lr (?P<lr>\S+), weight decay (?P<wd>\S+)"
)
ROUNDING = 1e-5  # fp32 rounding of two copies' different weights: at most ~2.4e-7 a step each, over a few steps


def drift(line: str, steps: int) -> dict:
    """harness.train's no-broadcast line, as figures: the ranks' difference before step 1 and after `steps`, and how
    much their moves (weights after less weights before) differ."""
    m = DRIFT.search(line)
    if m is None:
        raise ValueError(f"no drift figures in {line!r}")
    return {k: float(v) for k, v in m.groupdict().items()} | {"steps": steps}


def drift_claims(d: dict) -> list:
    """Without the broadcast, averaged gradients give both ranks the same update, so both copies move by the same
    amount and their initial difference stays. The moves may differ by AdamW's weight decay only, which shrinks each
    copy by lr x weight decay of itself a step: at most steps x lr x wd x the initial difference, plus ROUNDING. A rung
    that never averaged moves the ranks by their own gradients, about lr a step apart (1e-3, a hundred times the
    bound); a broadcast that ran anyway starts them 0 apart."""
    decay = d["steps"] * d["lr"] * d["wd"] * d["before"]
    bound = decay + ROUNDING
    return [
        Claim(
            f"without the broadcast the ranks start {d['before']:.3g} apart and still differ after {d['steps']} steps "
            f"({d['after']:.3g}): averaged gradients move both alike (their moves differ by {d['moved']:.2g}, at "
            f"most weight decay's {decay:.2g} plus {ROUNDING:g} for rounding)",
            d["before"] > 0 and d["after"] > 0 and d["moved"] <= bound,
        )
    ]
