"""Chapter 05's generated sentences: what the sweep showed (section 3), the summary's speedup rows, the one NOTE a
section prints where its run cannot decide its checks, and section 5's 2x T4 row in words.

    display(Markdown(perf_story.story(sweep, emb_share)))   # each point with its caveats; only checked figures explain
    perf_story.settle_section(perf_story.loopback_conclusions(sweep))  # 'checked: ...', at most ONE 'NOTE: ...'
    print(perf_story.t4_row_line(paper))                     # the 2x T4 row: a PREDICTION from data sheets
    print(perf_story.gap_short_table(sweep)); print(perf_story.gap_sentence(sweep))  # section 2: rankable parts only

A sentence states a figure only where the page shows it (it prints the figures it rests on) and where the run could
check it: a speedup the checker could not decide says so in the same sentence, and a speedup above N (the number of
processes) says that it is above N and why, never that DDP reached it.
"""

from __future__ import annotations

import re
import statistics

from ..claims import Claim, settle_folded
from ..notebook import check
from . import ddp_terms
from .loopback import BOUND, GAP_BOUND, point_margin, step_s


def settle_section(conclusions: dict, fold: str | None = None) -> None:
    """Settle a section's claims, grouped by what each group would let the learner conclude ({conclusion: claims}).
    Every checked claim is checked (a failed one fails the notebook). With `fold` (what the claims are about) and every
    checked claim holding, their lines fold under ONE visible line (claims.checked_fold); a failed one is never folded.
    Where the run could not decide some, the section prints ONE NOTE that says what the learner cannot conclude from
    this run (with how many of a group's points, where only some), and each reason once: the figures themselves are in
    the section's table, not repeated."""
    groups = {k: [v] if isinstance(v, Claim) else list(v) for k, v in conclusions.items()}
    every = [c for claims in groups.values() for c in claims]
    if fold and all(c.holds for c in every if c.checked):
        settle_folded([c for c in every if c.checked], fold)
    else:
        for c in every:
            if c.checked:
                check(c.holds, c.text)
    cannot, reasons = [], []
    for conclusion, claims in groups.items():
        undecided = [c for c in claims if not c.checked]
        if undecided:
            some = f" (at {len(undecided)} of its {len(claims)} points)" if len(undecided) < len(claims) else ""
            cannot.append(conclusion + some)
            reasons += [why for why in dict.fromkeys(c.unchecked for c in undecided) if why not in reasons]
    if cannot:
        why = "; ".join(reasons_once(reasons))
        print(f"NOTE: this run cannot tell you {', nor '.join(cannot)}: {why} (the figures are above)")


BUSY = re.compile(r"^other programs used up to ([\d.]+) cores")
MOVED = re.compile(r"^the host moved whole runs: this batch's measured speedups moved by (\d+)%")


def reasons_once(reasons) -> list[str]:
    """The reasons, each said once. Several of quiet.busy_reason's 'other programs used up to X cores in K of its M
    rounds' (one per point) say one thing to the learner: they become one line with the largest X; so do several of
    loopback's 'the host moved whole runs: this batch's ... moved by X%', with the largest X."""
    reasons = list(dict.fromkeys(reasons))
    for pattern, said in (
        (BUSY, "other programs used up to {:.2f} cores during some of these runs"),
        (MOVED, "the host moved whole runs: a batch's measured speedups moved by up to {:.0f}% from round to round"),
    ):
        alike = [r for r in reasons if pattern.match(r)]
        if len(alike) >= 2:
            merged = said.format(max(float(pattern.match(r).group(1)) for r in alike))
            reasons = list(dict.fromkeys(merged if r in alike else r for r in reasons))
    return reasons


def ddp_free_ratio(p: dict) -> float:
    """model / measured at one point for a model in which DDP costs nothing (the pair's step alone), the median over
    the rounds the check reads (its quiet rounds, all where none was quiet)."""
    pool = [r for r in p["rounds"] if r["quiet"]] or p["rounds"]
    return statistics.median(r["single"] / r["pair"] / r["measured"] for r in pool)


def blind_points(sweep) -> tuple[list, list, list]:
    """The speedup claims, whether each is checked yet blind to DDP's terms (a DDP-free model is inside its margin),
    and the batches that can catch a model missing them (checked, not blind)."""
    claims = sweep.speedup_claims()
    blind = [c.checked and abs(ddp_free_ratio(p) - 1) < (point_margin(p) or BOUND) for p, c in zip(sweep.pts, claims)]
    return claims, blind, [str(p["b"]) for p, c, b in zip(sweep.pts, claims, blind) if c.checked and not b]


def loopback_conclusions(sweep) -> dict:
    """Section 3's checks, each able to catch a model missing DDP's terms: the model against the measured speedup at
    each batch where a DDP-free model falls outside the margin, and DDP's step at the smallest batch from nocomm's step
    plus section 1's fitted all-reduce (ddp_terms.terms_claim: an all-reduce timed apart from training). Each checked
    line says which wrong models it fails and which it cannot tell (ddp_terms.verdicts). The points a DDP-free model
    passes too are not here: loopback_facts prints them, not checked."""
    claims, blind, _ = blind_points(sweep)
    told = [
        Claim(
            f"{c.text}; {ddp_terms.verdicts(ddp_terms.point_wrong_models(sweep, p), point_margin(p) or BOUND)}",
            c.holds,
            c.unchecked,
        )
        if c.checked
        else c
        for p, c, b in zip(sweep.pts, claims, blind)
        if not b
    ]
    return {
        "whether the model predicts DDP's speedup at a batch size": told,
        "whether DDP's own work and the fitted all-reduce make DDP's step": [ddp_terms.terms_claim(sweep)],
    }


def loopback_facts(sweep) -> str:
    """The speedup points whose check a model where DDP is free passes too, not checked (ddp_terms.blind_facts)."""
    _, blind, _ = blind_points(sweep)
    return ddp_terms.blind_facts(sweep, ddp_free_ratio, blind)


def loopback_fold(sweep) -> str:
    """Section 3's visible line (what its folded checks are): the batches whose speedup check a DDP-free model fails
    (loopback_conclusions), and the DDP step rebuilt from nocomm and section 1's fit."""
    told = blind_points(sweep)[2]
    who = f"the speedup at {' and '.join(told)} per process, and " if told else ""
    return (
        f"checks of the model: {who}DDP's step at {sweep.batches[0]} per process rebuilt from nocomm's step + "
        "section 1's fitted all-reduce; each line names the wrong models it fails and those it cannot tell"
    )


GAP_SHORT = {  # section 2's four parts a learner needs (and the rest): label, and the fold's parts each adds up
    "compute": ("computing b per process, against the even split", ("repeated", "cache", "sharing")),
    "ddp_own": ("DDP's own work (measured at the smallest batch)", ("ddp_own",)),
    "transfer": ("the all-reduce's transfer", ("transfer",)),
    "waiting": ("waiting for the slower rank", ("waiting",)),
    "rest": ("everything else (the nine-part table splits it)", ("gloo", "others", "rest")),
}


def gap_short(sweep) -> dict:
    """sweep.gap() (nine parts, seconds per step) added up into GAP_SHORT's five: the same total, every part once."""
    gap = sweep.gap()
    return {key: sum(gap[k] for k in parts) for key, (_, parts) in GAP_SHORT.items()}


def rankable_parts(sweep) -> dict:
    """The parts of section 2's gap (GAP_SHORT's, less the rest) this run can rank: those larger than gap_claim's bound
    (GAP_BOUND of the DDP step, or what the runs behind the gap moved over the rounds, whichever is more), largest
    first; none where gap_claim could not decide (a busy or moved run). A part within the bound could be any size the
    noise allows, so no order among such parts is shown."""
    if not sweep.gap_claim().checked:
        return {}
    parts, bound = {k: v for k, v in gap_short(sweep).items() if k != "rest"}, sweep.gap_bound_s()
    return {k: parts[k] for k in sorted(parts, key=lambda k: -abs(parts[k])) if abs(parts[k]) > bound}


def _within(sweep) -> str:
    """What a part must pass to be ranked, in words: the runs' movement, or GAP_BOUND of the step where larger."""
    bound, noise = sweep.gap_bound_s(), sweep.gap_noise_s()
    if bound <= noise:
        return f"{1000 * noise:.0f} ms by which section 2's runs moved"
    return f"{1000 * bound:.0f} ms of {100 * GAP_BOUND:.0f}% of the DDP step (its runs moved {1000 * noise:.0f} ms)"


def gap_short_table(sweep) -> str:
    """Section 2's visible gap: the even split, the parts this run can rank (rankable_parts), the others added up in
    one line, and the measured DDP step. Every part is in gap_fold's tables."""
    single, ddp = step_s(sweep.run("single")), sweep.ddp_s
    ranked, short = rankable_parts(sweep), gap_short(sweep)
    lines = [
        f"{f'even split: 1 process / {sweep.n} ({1000 * single:.1f} / {sweep.n})':<50} {1000 * sweep.ideal_s:>7.1f} ms"
    ]
    lines += [f"  {GAP_SHORT[k][0]:<48} {1000 * v:>+7.1f}" for k, v in ranked.items()]
    rest = sum(v for k, v in short.items() if k not in ranked)
    label = "the other parts (folded: none rankable alone)" if ranked else "all parts together (each in the fold)"
    lines.append(f"  {label:<48} {1000 * rest:>+7.1f}")
    lines.append(f"{f'DDP step, measured ({single / ddp:.2f}x)':<50} {1000 * ddp:>7.1f} ms")
    return "\n".join(lines)


def comm_fact(sweep) -> str:
    """What section 2's parts table shows, as a fact from its DDP rows (the round of the median speedup): the
    all-reduce's transfer and waiting on each rank against the DDP step, and their largest share of it."""
    ddp = [ms for label, ms in sweep.parts_rows() if label.startswith("DDP")]
    both = lambda key: " and ".join(f"{ms[key]:.1f}" for ms in ddp)  # noqa: E731
    share = max((ms["transfer"] + ms["waiting"]) / ms["step"] for ms in ddp)
    ranks = " (rank 0, rank 1)" if len(ddp) == 2 else ""
    compute = min((ms["forward"] + ms["backward"]) / ms["step"] for ms in ddp)
    rest = f", and forward and backward at least {100 * compute:.0f}%" if compute > 0.5 else ""
    return (
        f"In the table (the round of the median speedup), DDP's all-reduce took {both('transfer')} ms of transfer "
        f"and {both('waiting')} ms of waiting{ranks}: at most {100 * share:.0f}% of a rank's step "
        f"({ddp[0]['step']:.1f} ms on rank 0){rest}."
    )


def gap_sentence(sweep) -> str:
    """Section 2's generated lines under its table: what the parts table shows (comm_fact), then which parts of the
    gap this run can rank, or that it ranks none (why it could not decide is in gap_fold)."""
    claim, ranked = sweep.gap_claim(), rankable_parts(sweep)
    if not claim.checked:
        return f"{comm_fact(sweep)} The gap's parts are folded below, unranked: this run cannot rank them (why, there)."
    if not ranked:
        return (
            f"{comm_fact(sweep)} Every part of the gap is within the {_within(sweep)}: this run cannot rank them, "
            "so the table shows their sum (the parts are folded below)."
        )
    named = ", ".join(f"{GAP_SHORT[k][0]} ({1000 * v:+.1f} ms a step)" for k, v in ranked.items())
    return (
        f"{comm_fact(sweep)} Of the gap, only {named} {'is' if len(ranked) == 1 else 'are'} larger than the "
        f"{_within(sweep)}; the other parts are within it, and this run cannot rank them (folded below)."
    )


def gap_fold(sweep) -> str:
    """Every part, folded: GAP_SHORT's five, then the nine, and the rest's line (the learner opens it on purpose)."""
    short = "\n".join(f"  {GAP_SHORT[k][0]:<48} {1000 * v:>+7.1f}" for k, v in gap_short(sweep).items())
    claim = sweep.gap_claim()
    why = "" if claim.checked else f"not ranked: {claim.unchecked}\n"
    return (
        "<details><summary>The gap's parts, unranked, and how far their runs moved</summary>\n\n```\n"
        f"{why}each part from the round of the median speedup (section 3's * round)\n"
        f"the parts, in five:\n{short}\nand in nine:\n{sweep.gap_table()}\n{sweep.gap_rest_line()}\n```\n</details>"
    )


def gap_conclusions(sweep) -> dict:
    """Section 2's one claim: the parts, each measured on its own, add up to the DDP step."""
    return {"which parts make the gap between the even split and DDP's step": sweep.gap_claim()}


def hooks_conclusions(hooks) -> dict:
    """Section 6's compression hooks: the bytes each writes (its first two claims), and fp16's cost in accuracy."""
    claims = hooks.claims()
    return {
        "how many bytes each compression hook sends": claims[:2],
        "what 16-bit gradients cost in accuracy": claims[2:],
    }


def box_conclusions(after, margin) -> dict:
    """Section 4's DDP runs on the dialed links, grouped by what each would let the learner conclude."""
    return {
        "whether the all-reduce predicted before the run holds on a dialed link": after.comm_claims(),
        "whether the model predicts DDP's speedup on a dialed link": after.speedup_claims(margin),
        "on which links two processes beat one": after.crossing_claim(margin),
        "whether the step clock's comm part is the all-reduce's time": after.clock_claim(),
    }


def above_ideal(sweep, p: dict) -> str | None:
    """Why a point's measured speedup passes N (None where it does not), from figures section 2's table prints: the
    1-process step at N b against N times one process's step at b alone (the `solo` run, at the largest batch), or,
    where no solo run explains it, the 1-process step's own rounds (it moved)."""
    n, b = sweep.n, p["b"]
    if p["measured"] <= n:
        return None
    kept = p["rounds"][p["kept"]]
    solo = sweep.R.get(f"solo_b{b}_r{p['kept']}")
    head = f"above {n}x, more than splitting the work {n} ways can give, so not DDP's doing: "
    if solo and kept["single"] > n * step_s(solo):
        return head + (
            f"the 1-process step at {n * b} ({1000 * kept['single']:.1f} ms) took {kept['single'] / step_s(solo):.2f}x "
            f"one process's step at {b} alone ({1000 * step_s(solo):.1f} ms): the larger batch cost more per example"
        )
    singles = ", ".join(f"{1000 * r['single']:.0f}" for r in p["rounds"])
    return head + (
        f"the 1-process step it divides moved from round to round ({singles} ms) and was slower in this one than the "
        "model's parts explain"
    )


def point_text(sweep, p: dict, claim: Claim, caveat: bool = True) -> str:
    """One point's speedup with its model and, in the same sentence, whether it was checked (where `caveat`: the
    story says it once where every point shares the reason) and why it passes N."""
    notes = [] if claim.checked or not caveat else [f"not checked on this run: {claim.unchecked}"]
    why = above_ideal(sweep, p)
    if why:
        notes.append(why)
    return (
        f"**{p['measured']:.2f}x** at {p['b']} per process (model {p['predicted']:.2f}x"
        + "".join(f"; {x}" for x in notes)
        + ")"
    )


def story(sweep, emb_share: float) -> str:
    """What the sweep showed, as short generated Markdown bullets: each point (with its caveats), and why small
    batches pay little (only where that point was checked, with the figures it rests on). Which parts of section 2's
    gap this run can rank is section 2's own sentence (gap_sentence). A reason already given is not repeated."""
    claims = sweep.speedup_claims()
    reasons = {c.unchecked for c in claims}
    once = reasons_once(sorted(reasons)) if None not in reasons else []
    shared = once[0] if len(once) == 1 else None  # every point unchecked, for what the learner reads as one reason
    said = {shared, *reasons} if shared else {c.unchecked for c in claims if not c.checked}
    busy_said = any(BUSY.match(x) for x in said if x)
    again = lambda why: "for the same reason" if why in said or (busy_said and BUSY.match(why)) else why  # noqa: E731
    out = [
        "**On this machine**"
        + (f", none of them checked on this run ({shared})" if shared else "")
        + ", the measured speedups:\n",
        *(f"- {point_text(sweep, p, c, caveat=shared is None)}" for p, c in zip(sweep.pts, claims)),
        f"- DDP's own work was measured once, at {sweep.pts[0]['b']} per process "
        f"({1000 * sweep.model.overhead_s:.1f} ms a step), and the model takes it as the same at every batch. The "
        f"all-reduce moves the same {sweep.model.grad_bytes / 2**20:.1f} MiB of gradients at every batch "
        f"({100 * emb_share:.0f}% of them the input embeddings); training's took "
        + ", ".join(f"{1000 * v:.1f} ms at {b}" for b, v in sorted(sweep.model.transfer_s.items()))
        + " (the median over the rounds; section 2 shows one round).",
    ]
    small, small_claim = sweep.pts[0], claims[0]
    r = small["rounds"][small["kept"]]
    half = r["pair"] / r["single"]
    if not small_claim.checked:
        out.append(
            f"- How much of a 1-process step half a batch of {small['b']} per process costs was not measurable on this "
            f"run ({again(small_claim.unchecked)})."
        )
    elif half > 0.55:
        out.append(
            f"- Half a small batch does not take half the time: at {small['b']} per process each process's step took "
            f"{1000 * r['pair']:.1f} ms, {half:.2f} of the 1-process step at {sweep.n * small['b']} "
            f"({1000 * r['single']:.1f} ms). The processes share the machine, and every call of forward and backward "
            "has fixed costs (Python, operator dispatch) that a larger batch spreads over more examples."
        )
    return "\n".join(out)


def summary_speedup(sweep, p: dict, claim: Claim) -> str:
    """A speedup row of the results table: measured and modelled, 'not checked' where section 3 could not decide, and
    'above Nx' where it passes N."""
    row = f"{p['measured']:.2f}x measured, model {p['predicted']:.2f}x"
    if not claim.checked:
        row += ", not checked (section 3)"
    if above_ideal(sweep, p):
        row += f"; above {sweep.n}x: the 1-process run's doing, not DDP's (section 3)"
    return row


def headline_point(sweep, p: dict, claim: Claim) -> str:
    marks = ([] if claim.checked else ["not checked"]) + (
        [f"above {sweep.n}x: not DDP's"] if above_ideal(sweep, p) else []
    )
    return f"{p['measured']:.2f}x (model {p['predicted']:.2f}" + "".join(f", {m}" for m in marks) + ")"


def t4_row_line(paper: list[dict]) -> str:
    """Section 5's 2x T4 row in words, from the same rounded figures the table prints: a PREDICTION from two data
    sheets (the T4's peak, PCIe 3.0 x16's nominal rate), and the command that measures the real rate on Kaggle."""
    row = next(r for r in paper if r["gpu"] == "T4")
    est, link = row["estimate"], row["link"]
    comm, exposed = round(est.comm_ms, 1), round(est.exposed_ms, 1)  # the table's row, as it prints them
    return (
        f"PREDICTION, {row['n']}x T4: DistilBERT's all-reduce takes {comm:.1f} ms a step over "
        f"{link.name.split(' (')[0]}'s nominal {link.gb_s} GB/s, of which the model hides {comm - exposed:.1f} ms "
        f"behind backward ({est.speedup:.1f}x).\nMeasured, on Kaggle's 2x T4: `python scripts/run_course.py "
        "--preset kaggle_t4x2 --only 05`; section 1's fit there is the two T4s' real all-reduce rate,\n"
        "to put in the place of the data sheet's."
    )
