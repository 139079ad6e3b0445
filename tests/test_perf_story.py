"""Chapter 05's generated sentences (distrinews_course/bench/perf_story.py) on the recorded sweeps of
tests/test_loopback_model.py: a speedup the checker could not decide says so in its own sentence, one above N says it
is above N and why (with the figures section 2's table prints), the explanations are given only where checked,
a section prints at most one NOTE, and Kaggle's two figures are set side by side from the model's own numbers."""

import contextlib
import copy
import io
from unittest import mock

import pytest

from distrinews_course import cluster_model as cm
from distrinews_course.bench import loopback, perf_story
from distrinews_course.claims import Claim
from tests.test_loopback_model import DATA, NOISY, load, sweep_of


@pytest.fixture(scope="module")
def quiet_sweep():
    return sweep_of(*load(DATA))


@pytest.fixture(scope="module")
def noisy_sweep():
    return sweep_of(*load(NOISY))


def test_one_reason_for_every_point_is_said_once_in_the_same_sentence():
    rec, cost = load(DATA)
    rec = copy.deepcopy(rec)
    for b in rec["batches"]:  # the host moved one run at every batch: each batch's rounds disagree
        rec["runs"][f"single_b{b}_r1"]["seconds"] *= 1.6
    s = sweep_of(rec, cost)
    claims = s.speedup_claims()
    assert not any(c.checked for c in claims) and len({c.unchecked for c in claims}) == len(claims)
    (said,) = perf_story.reasons_once(c.unchecked for c in claims)  # each batch's spread: one line, the widest
    widest = max(loopback.point_spread(p) for p in s.pts)
    assert said.endswith(f"moved by up to {100 * widest:.0f}% from round to round")
    story = perf_story.story(s, 0.95)
    first = story.split(". ")[0]
    assert f", none of them checked on this run ({said})" in first
    assert story.count(said) == 1 and "(for the same reason)" in story
    assert all(
        f"**{p['measured']:.2f}x** at {p['b']} per process (model {p['predicted']:.2f}x)" in first for p in s.pts
    )


def superlinear(rec, cost, factor=1.6):
    """The quiet sweep with every 1-process step at the largest batch `factor` times longer: measured past N."""
    rec = copy.deepcopy(rec)
    for k in range(rec["rounds"]):
        rec["runs"][f"single_b{rec['batches'][-1]}_r{k}"]["seconds"] *= factor
    return sweep_of(rec, cost)


def test_a_checked_sweep_states_each_point_and_its_explanations(quiet_sweep):
    s = quiet_sweep
    story = perf_story.story(s, 0.95)
    for p in s.pts:
        assert f"**{p['measured']:.2f}x** at {p['b']} per process (model {p['predicted']:.2f}x)" in story
    assert "not checked" not in story and "above 2x" not in story
    r = s.pts[0]["rounds"][s.pts[0]["kept"]]  # the half-batch figure: with the two step times it rests on
    assert f"{1000 * r['pair']:.1f} ms, {r['pair'] / r['single']:.2f} of the 1-process step" in story
    assert f"({1000 * r['single']:.1f} ms)" in story
    assert "section 2's gap" not in story  # which parts can be ranked is section 2's own sentence (gap_sentence)
    assert "95% of them the input embeddings" in story


def test_an_unchecked_point_carries_its_caveat_and_hides_nothing_else(noisy_sweep):
    s = noisy_sweep
    story = perf_story.story(s, 0.95)
    claims = s.speedup_claims()
    (p, c) = next((p, c) for p, c in zip(s.pts, claims) if not c.checked)
    assert (
        f"**{p['measured']:.2f}x** at {p['b']} per process (model {p['predicted']:.2f}x; not checked on this "
        f"run: {c.unchecked})" in story
    )
    assert story.count(c.unchecked) == 1, "a reason is given once"
    # section 2's check could not decide here: the story names no part of its gap, section 2's sentence says why
    assert not s.gap_claim().checked
    assert "largest saving" not in story and "section 2's gap" not in story
    assert s.gap_claim().unchecked in perf_story.gap_fold(s) and "unranked" in perf_story.gap_sentence(s)
    rows = [perf_story.summary_speedup(s, p, c) for p, c in zip(s.pts, claims)]
    assert [("not checked" in r) for r in rows] == [not c.checked for c in claims]


def test_a_speedup_above_n_is_said_to_be_above_n_with_its_figures(quiet_sweep):
    rec, cost = load(DATA)
    s = superlinear(rec, cost)
    p = s.pts[-1]
    assert p["measured"] > s.n
    why = perf_story.above_ideal(s, p)
    solo = loopback.step_s(rec["runs"][f"solo_b{p['b']}_r{p['kept']}"])
    single = p["rounds"][p["kept"]]["single"]
    assert why.startswith(f"above {s.n}x, more than splitting the work {s.n} ways can give, so not DDP's doing")
    assert (
        f"({1000 * single:.1f} ms) took {single / solo:.2f}x one process's step at {p['b']} alone "
        f"({1000 * solo:.1f} ms)" in why
    )
    assert why in perf_story.story(s, 0.95)
    assert "above 2x:" in perf_story.summary_speedup(s, p, s.speedup_claims()[-1])
    assert "above 2x" in perf_story.headline_point(s, p, s.speedup_claims()[-1])
    assert all(perf_story.above_ideal(quiet_sweep, q) is None for q in quiet_sweep.pts)  # none passes N there


def test_above_n_without_a_cache_effect_blames_the_moved_single_step(quiet_sweep):
    rec, cost = load(DATA)
    rec = copy.deepcopy(rec)
    for k in range(rec["rounds"]):  # every solo run as slow as half the single: the cache effect explains nothing
        b = rec["batches"][-1]
        rec["runs"][f"solo_b{b}_r{k}"]["seconds"] = 10 * rec["runs"][f"single_b{b}_r{k}"]["seconds"]
    s = superlinear(rec, cost)
    why = perf_story.above_ideal(s, s.pts[-1])
    assert "moved from round to round" in why and "alone" not in why


def settled(conclusions):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        perf_story.settle_section(conclusions)
    return out.getvalue().splitlines()


def test_a_section_prints_one_note_saying_what_cannot_be_concluded_each_reason_once():
    speed = [Claim(f"at {b} the model says 1.0x", True, "the host moved whole runs") for b in (16, 64, 256)]
    lines = settled(
        {
            "whether the model predicts the speedup": speed,
            "where two processes beat one": Claim("two processes beat one", True, "no link far from 1x"),
            "whether the clock agrees": Claim("the clock agrees", True),
            "whether the all-reduce was predicted": [
                Claim("at 1", True),
                Claim("at 2", True, "the host moved whole runs"),
            ],
        }
    )
    notes = [x for x in lines if x.startswith("NOTE")]
    assert len(notes) == 1 and notes[0].count("the host moved whole runs") == 1 and "no link far from 1x" in notes[0]
    assert "cannot tell you whether the model predicts the speedup, nor where two processes beat one" in notes[0]
    assert "whether the all-reduce was predicted (at 1 of its 2 points)" in notes[0] and "clock" not in notes[0]
    assert "at 16 the model" not in notes[0]  # the figures stay in the table, not in the NOTE
    assert lines[:2] == ["checked: the clock agrees", "checked: at 1"]
    assert settled({"x": Claim("fine", True)}) == ["checked: fine"]
    with pytest.raises(Exception):  # a checked claim that fails still fails the notebook
        settled({"x": [Claim("wrong", False), Claim("later", True, "busy")]})


def test_sections_group_their_claims_by_what_they_let_the_learner_conclude(quiet_sweep):
    speedups, terms = perf_story.loopback_conclusions(quiet_sweep).values()
    claims, blind, _ = perf_story.blind_points(quiet_sweep)
    kept = [c for c, b in zip(claims, blind) if not b]
    assert [(c.holds, c.unchecked) for c in speedups] == [(c.holds, c.unchecked) for c in kept] and len(terms) == 1
    assert all(c.text.startswith(k.text + "; it fails a model with DDP free") for c, k in zip(speedups, kept))
    assert list(perf_story.gap_conclusions(quiet_sweep).values())[0] == quiet_sweep.gap_claim()


def test_a_point_a_model_without_ddp_would_pass_too_is_a_fact_not_a_check(quiet_sweep):
    # at 256 per process DDP's two terms are inside the 15% margin: leaving both out still passes, so that point is
    # printed as a fact; 16 and 64 per process stay checks, and the visible line names them
    free = perf_story.ddp_free_ratio(quiet_sweep.pts[-1])
    assert abs(free - 1) < 0.15
    speedups, _ = perf_story.loopback_conclusions(quiet_sweep).values()
    assert [c.text.split(" per process")[0] for c in speedups] == ["at 16", "at 64"]
    assert perf_story.loopback_facts(quiet_sweep) == (
        f"at 256 per process the model says {quiet_sweep.pts[-1]['predicted']:.2f}x, the run "
        f"{quiet_sweep.pts[-1]['measured']:.2f}x: not checked, as a model with DDP free lands as close ({free:.2f})"
    )
    assert perf_story.loopback_fold(quiet_sweep).startswith(
        "checks of the model: the speedup at 16 and 64 per process, and DDP's step at 16"
    )
    assert all(abs(perf_story.ddp_free_ratio(p) - 1) >= 0.15 for p in quiet_sweep.pts[:-1])


def test_the_t4_row_line_agrees_with_its_table_row_and_names_no_unsourced_figure():
    tensors = cm.distilbert_tensors()
    paper = cm.on_paper(tensors)
    row = next(r for r in paper if r["gpu"] == "T4")
    est, table = row["estimate"], cm.on_paper_table(tensors, paper)
    line = perf_story.t4_row_line(paper)
    comm, exposed = round(est.comm_ms, 1), round(est.exposed_ms, 1)  # the same row as the on-paper table prints
    assert f" {comm:.1f} " in table and f" {exposed:.1f} " in table
    assert f"takes {comm:.1f} ms" in line and f"the model hides {comm - exposed:.1f} ms behind backward" in line
    assert f"hides {comm - exposed:.1f} ms behind backward" in table  # the table's own T4 line says the same
    # the row rests on data sheets only, and says so; the learner gets the command that measures it
    assert row["link"] is cm.LINKS["pcie3"] and "PREDICTION" in line and "PREDICTION" in table
    assert "15.75 GB/s" in line and f"{cm.GPUS['T4']:.0f} TFLOP/s" in table
    assert "--preset kaggle_t4x2 --only 05" in line
    assert "Kaggle notebook" not in line + table and "peer-to-peer" not in line + table
    many = [r["n"] for r in paper if r["n"] > 8]  # the rows that price a ring where NCCL would pick trees say so
    assert f"the {' and '.join(map(str, many))} GPU rows price a ring only" in table


def test_busy_reasons_of_several_points_are_said_once_with_the_largest_load():
    busy = [f"other programs used up to {x} cores in 1 of its 3 rounds" for x in ("0.91", "1.01", "0.50")]
    assert perf_story.reasons_once([*busy, "the host moved whole runs", busy[0]]) == [
        "other programs used up to 1.01 cores during some of these runs",
        "the host moved whole runs",
    ]
    assert perf_story.reasons_once(busy[:1]) == busy[:1]  # one point: its own words
    lines = settled({"whether the model predicts the speedup": [Claim(f"at {b}", True, w) for b, w in zip("ab", busy)]})
    assert lines == [
        "NOTE: this run cannot tell you whether the model predicts the speedup: other programs used up to 1.01 cores "
        "during some of these runs (the figures are above)"
    ]


def test_a_sweep_busy_in_every_point_says_so_once_in_its_story():
    rec, cost = load(DATA)
    rec = copy.deepcopy(rec)
    for i, b in enumerate(rec["batches"]):  # a different load in one round of each batch's runs
        for r in rec["runs"][f"single_b{b}_r0"]["ranks"]:
            r["foreign_cores"] = 0.9 + i / 10
    s = sweep_of(rec, cost)
    assert not any(c.checked for c in s.speedup_claims())
    story = perf_story.story(s, 0.95)
    assert story.count("other programs used up to") == 1 and "during some of these runs" in story.split(". ")[0]


def test_the_visible_gap_shows_only_the_parts_this_run_can_rank(quiet_sweep):
    s = quiet_sweep
    # all within what section 2's runs moved: none ranked, the table shows their sum, the sentence says why
    assert perf_story.rankable_parts(s) == {}
    table, said = perf_story.gap_short_table(s), perf_story.gap_sentence(s)
    assert table.count("\n") == 2 and "all parts together" in table
    assert f"{1000 * (s.ddp_s - s.ideal_s):+.1f}" in table
    assert f"Every part of the gap is within the {1000 * s.gap_noise_s():.0f} ms" in said and "cannot rank" in said
    # a part past the bound is ranked, shown on its own line and named; the others are summed
    big = dict(s.gap(), cache=-2 * s.gap_bound_s())
    with mock.patch.object(loopback.Sweep, "gap", lambda self: big):
        ranked, table, said = perf_story.rankable_parts(s), perf_story.gap_short_table(s), perf_story.gap_sentence(s)
        compute = perf_story.gap_short(s)["compute"]
    label = perf_story.GAP_SHORT["compute"][0]
    assert list(ranked) == ["compute"] and f"  {label}" in table and "the other parts" in table
    assert f"only {label} ({1000 * compute:+.1f} ms a step) is larger than the" in said


def test_an_undecided_gap_ranks_nothing_and_says_why(noisy_sweep):
    claim = noisy_sweep.gap_claim()
    assert not claim.checked and perf_story.rankable_parts(noisy_sweep) == {}
    assert perf_story.gap_sentence(noisy_sweep).endswith(
        "folded below, unranked: this run cannot rank them (why, there)."
    )
    assert f"not ranked: {claim.unchecked}\n" in perf_story.gap_fold(noisy_sweep)


def test_the_gap_sentence_states_the_parts_tables_communication(quiet_sweep):
    # the figures are the parts table's DDP rows: a sentence that took another round's transfer would not match
    table, said = quiet_sweep.parts_table(), perf_story.comm_fact(quiet_sweep)
    ddp = [line.split() for line in table.splitlines() if line.startswith("DDP")]
    transfer, waiting, step = [r[-4] for r in ddp], [r[-5] for r in ddp], float(ddp[0][-1])
    assert f"took {' and '.join(transfer)} ms of transfer and {' and '.join(waiting)} ms of waiting" in said
    share = max((float(r[-4]) + float(r[-5])) / float(r[-1]) for r in ddp)
    assert f"at most {100 * share:.0f}% of a rank's step ({step:.1f} ms on rank 0)" in said
    assert said.startswith(perf_story.comm_fact(quiet_sweep)) and said in perf_story.gap_sentence(quiet_sweep)


def test_the_short_gap_adds_every_part_once_and_the_fold_keeps_all_nine(quiet_sweep):
    s = quiet_sweep
    grouped = [k for _, parts in perf_story.GAP_SHORT.values() for k in parts]
    assert sorted(grouped) == sorted(loopback.GAP_LABELS)  # every one of the nine parts in exactly one group
    short, gap = perf_story.gap_short(s), s.gap()
    assert sum(short.values()) == pytest.approx(s.ddp_s - s.ideal_s)
    assert short["compute"] == pytest.approx(gap["repeated"] + gap["cache"] + gap["sharing"])
    assert short["ddp_own"] == pytest.approx(s.model.overhead_s)  # the same figure section 3 calls DDP's own work
    assert f"{1000 * s.ddp_s:.1f} ms" in perf_story.gap_short_table(s)
    fold = perf_story.gap_fold(s)
    assert fold.startswith("<details>") and s.gap_table() in fold and s.gap_rest_line() in fold
    assert all(f"  {perf_story.GAP_SHORT[k][0]:<48} {1000 * v:>+7.1f}" in fold for k, v in short.items())


def test_the_storys_gap_bound_is_the_constant_the_gate_uses(quiet_sweep):
    # where the rounds moved less than GAP_BOUND of the step, the story quotes that share: from the constant, not typed
    ok = Claim("the parts explain the step", True)
    for share in (loopback.GAP_BOUND, 0.2):
        with (
            mock.patch.object(loopback, "GAP_BOUND", share),
            mock.patch.object(perf_story, "GAP_BOUND", share),
            mock.patch.object(loopback.Sweep, "gap_noise_s", lambda self: 0.001),
            mock.patch.object(loopback.Sweep, "gap_claim", lambda self: ok),
        ):
            told = perf_story.gap_sentence(quiet_sweep)
            bound = quiet_sweep.gap_bound_s()
        assert f"{1000 * bound:.0f} ms of {100 * share:.0f}% of the DDP step" in told, told
