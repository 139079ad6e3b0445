"""Chapter 06's claims, read from real launches of memory_footprint.py (tests/data/memory_world*.json, recorded by the
chapter's two launches) and from the committed DistilBERT-base benchmark: each claim holds on the recorded numbers,
and a wrong figure makes it fail. Fast: no launch."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import matplotlib
import pytest

from distrinews_course import memory as M
from distrinews_course import memory_figures as F
from distrinews_course import memory_runs as R
from distrinews_course.memory_calculator_check import (
    DistilbertPeak,
    calculator_check,
    committed_facts,
    distilbert_peak,
    write_chapter_record,
)

matplotlib.use("Agg")
DATA = Path(__file__).parent / "data"


def _launch(world: int, foreign_cores=None) -> R.Launch:
    return R.Launch(json.loads((DATA / f"memory_world{world}.json").read_text()), foreign_cores)


@pytest.fixture
def one():
    return _launch(1, foreign_cores=0.05)


@pytest.fixture
def two():
    return _launch(2)


def _set(launch: R.Launch, name: str, key: str, value, rank=None) -> None:
    """Give one run a wrong figure, on every rank (or one)."""
    for i, x in enumerate(launch.results[name]["per_rank"]):
        if rank is None or i == rank:
            x[key] = value(x[key]) if callable(value) else value


def _all_hold(claims) -> bool:
    return all(ok for ok, _ in claims)


def test_a_launch_reads_its_runs(one, two):
    assert one.world == 1 and two.world == 2 and one.model == "tiny"
    assert "ddp@1x8#2" not in one.names() and "ddp@8x64" in one.names()
    assert len(one.peaks("ddp@1x8")) == 3
    assert one.spread_mb == max(one.peaks("ddp@1x8")) - min(one.peaks("ddp@1x8"))
    # the runtime is what the calibration's peak holds beyond the calculator's tensors
    tensors = M.estimate("tiny", 1, 8, world=1).peak_mb
    assert one.runtime_mb == pytest.approx(sorted(one.peaks("ddp@1x8"))[1] - tensors)
    assert 0 < one.runtime_mb < 60


def test_quiet_means_under_a_third_of_a_core_of_other_programs():
    assert _launch(1, 0.05).quiet and not _launch(1, 1.2).quiet and not _launch(1, None).quiet


def test_the_activation_claims_fail_on_a_wrong_figure(one):
    rows = R.activation_rows(one)
    ok, claim = R.activations_follow_the_formula(rows)
    assert ok and "the 6 runs above 8 tokens without recomputation, ddp@8x64 to ddp@64x128" in claim
    # one more saved tensor per layer (1 of 16) is about 6% more: caught
    wrong = [dict(x, saved=x["saved"] * 1.06) if x["name"] == "ddp@8x128" else x for x in rows]
    assert not R.activations_follow_the_formula(wrong)[0]
    # the batch's linearity is a printed fact (shapes make it), which reports the figures it was given
    wrong = [dict(x, saved=x["saved"] * 0.85) if x["name"] == "ddp@32x64" else x for x in rows]
    assert "4x the batch 3.40x" in R.activations_by_batch(wrong) and "2x the batch 2.00x" in R.activations_by_batch(
        rows
    )
    assert R.longer_sequences_cost_more(rows)[0]
    no_mask = [dict(x, saved=x["saved"] - 0.45) if x["name"] == "ddp@8x128" else x for x in rows]  # masks missing
    assert not R.longer_sequences_cost_more(no_mask)[0]


def test_the_recomputation_claims_fail_on_a_wrong_figure(one):
    assert _all_hold(R.recomputation(one).claims())
    for key, value, words in [
        ("flops_per_step", lambda f: f * 1.5 / (4 / 3), "4/3 of the FLOPs"),  # a second backward, say
        ("cpu_ratio_pairs", [0.97, 0.98, 0.99, 0.99, 1.0], "more CPU time"),
        ("activations_saved", lambda a: a * 5, "saves most of the activations"),
        ("peak_rss_above_start_mb", lambda p: p + 40, "lowers the step's peak"),
    ]:
        wrong = copy.deepcopy(one)
        _set(wrong, "ddp@64x128+ckpt", key, value)
        failed = [claim for ok, claim in R.recomputation(wrong).claims() if not ok]
        assert failed and words in failed[0], (key, failed)


def test_the_recomputed_peaks_reason_is_what_section_5s_calculator_says_sets_it(one):
    (row,) = [r for r in calculator_check(one).rows if r["name"] == "ddp@64x128+ckpt"]
    rec = R.recomputation(one)
    assert rec.ckpt_set_by == row["sets"] == "activations"
    (peak,) = [claim for _, claim in rec.claims() if "lowers the step's peak" in claim]
    assert peak.endswith("one recomputed layer's activations, which the calculator says still set the peak")
    floor = dataclasses.replace(rec, ckpt_set_by="optimizer step")  # a calculator that put the peak at the optimizer
    (peak,) = [claim for _, claim in floor.claims() if "lowers the step's peak" in claim]
    assert "the calculator says the optimizer step (gradients plus AdamW's temporaries) sets the peak" in peak


def test_wall_time_is_checked_only_on_a_quiet_machine(one):
    slower = copy.deepcopy(one)
    _set(slower, "ddp@64x128+ckpt", "seconds_per_step", lambda s: 0.97 * one.fullest("ddp@64x128")["seconds_per_step"])
    (ok, claim), *_ = [c for c in R.recomputation(slower).claims() if "wall time" in c[1]]
    assert not ok and "quiet" in claim
    slower.foreign_cores = 1.2  # busy: shown, not checked
    assert not [c for c in R.recomputation(slower).claims() if "wall time" in c[1]]
    assert "1.2 cores busy: shown, not checked" in R.recomputation(slower).table()


def test_the_bucket_view_claims_fail_on_a_wrong_figure(two):
    assert R.the_view_saves_the_buckets(two)[0] and R.every_run_trains_the_same_weights(two)[0]
    wrong = copy.deepcopy(two)
    _set(wrong, "ddp+view", "peak_rss_above_start_mb", lambda p: two.peak("ddp") - 0.5)  # no copy saved
    assert not R.the_view_saves_the_buckets(wrong)[0]
    buckets = R.bucket_view_saving(two)[1]
    for copies in (0.5, 0.7, 1.3, 2.0):  # half a copy, 30% off either way (40% passed these), two copies
        off = copy.deepcopy(two)
        _set(off, "ddp+view", "peak_rss_above_start_mb", lambda p, c=copies: two.peak("ddp") - c * buckets)
        assert not R.the_view_saves_the_buckets(off)[0], copies
    _set(wrong, "zero1", "max_weight_diff_vs_first", 1e-3, rank=1)
    assert not R.every_run_trains_the_same_weights(wrong)[0]


def test_a_saving_prediction_is_judged_in_one_line(capsys):
    assert R.judge_saving_prediction(None, 7.9) is None
    assert R.judge_saving_prediction("8", 7.9) is None and "write a number" in capsys.readouterr().out
    assert R.judge_saving_prediction(8.0, 7.9) is True
    assert R.judge_saving_prediction(16.0, 7.9) is False and "which part" in capsys.readouterr().out


def test_the_calculator_claims_fail_on_a_wrong_figure(one, two):
    assert _all_hold(calculator_check(one, two).claims())
    assert calculator_check(one, two).coverage().startswith("5 runs have a predicted peak")
    few = calculator_check(one, two)  # checked on fewer than 4 runs: not a check of the calculator
    few.rows = [x for x in few.rows if x["kind"] != "checked" or x["world"] == 1]
    assert not few.claims()[0][0]
    wrong = copy.deepcopy(one)  # a checked run 20% above what the calculator says
    _set(wrong, "ddp@64x128", "peak_rss_above_start_mb", lambda p: 1.2 * one.predicted("ddp@64x128").peak_mb)
    failed = [claim for ok, claim in calculator_check(wrong, two).claims() if not ok]
    assert failed and "within 15%" in failed[0]
    wrong = copy.deepcopy(two)  # sharding that saved nothing: the move is wrong, the level still within 15%
    for v in ("fsdp2_reshard_off", "fsdp2_reshard_on"):
        _set(wrong, v, "peak_rss_above_start_mb", two.peak("ddp") - 1)
    failed = [claim for ok, claim in calculator_check(one, wrong).claims() if not ok]
    assert any("how far each peak moved" in c for c in failed), failed
    wrong = copy.deepcopy(one)  # a run the optimizer step should set, 10% above the calibration
    _set(wrong, "ddp@8x64", "peak_rss_above_start_mb", lambda p: 1.1 * p)
    failed = [claim for ok, claim in calculator_check(wrong, two).claims() if not ok]
    assert any("measured within 5%" in c for c in failed), failed


def test_every_row_of_the_calculator_check_is_of_a_known_kind(one, two):
    rows = calculator_check(one, two).rows
    kinds = {x["name"]: x["kind"] for x in rows}
    assert kinds["ddp@64x128"] == kinds["fsdp2_reshard_on"] == "checked" and kinds["ddp@8x64"] == "= calibration"
    assert kinds["zero1"] == "section 6" and kinds.get("deepspeed_1", "not modelled") == "not modelled"
    assert {x["twin"] for x in rows if x["name"] in ("ddp+view", "fsdp2_reshard_off")} == {"ddp"}


def test_the_sharding_claims_fail_on_a_wrong_figure(two):
    assert _all_hold(R.sharding_claims(two)) and R.zero1_peak_claim(two)[0]
    assert R.ddp_held_line(two).startswith("plain DDP holds 16.00 bytes per parameter")
    assert not any("plain DDP holds 16" in claim for _, claim in R.sharding_claims(two))  # printed, not checked
    cases = [
        ("fsdp2_reshard_on", "total", lambda b: b * 1.2, "FSDP2 holds 1/2"),
        ("fsdp2_reshard_on", "peak_rss_above_start_mb", lambda p: two.peak("ddp") + 1, "below plain DDP's"),
    ]
    for run, key, value, words in cases:
        wrong = copy.deepcopy(two)
        _set(wrong, run, key, value)
        failed = [claim for ok, claim in R.sharding_claims(wrong) if not ok]
        assert failed and words in failed[0], (run, key, failed)
    even = copy.deepcopy(two)  # an even split, as FSDP2 would make it: not ZeroRedundancyOptimizer's
    half = sum(x["optimizer_state"] for x in two.results["zero1"]["per_rank"]) // 2
    _set(even, "zero1", "optimizer_state", half)
    assert any("greedy split" in claim for ok, claim in R.sharding_claims(even) if not ok)
    higher = copy.deepcopy(two)  # ZeRO-1 peaking far above DDP (a module imported inside its window, say)
    _set(higher, "zero1", "peak_rss_above_start_mb", lambda p: p + 5 + 2 * two.spread_mb)
    assert not R.zero1_peak_claim(higher)[0]


@pytest.mark.skipif(
    "deepspeed_1" not in json.loads((DATA / "memory_world2.json").read_text())["results"], reason="no DeepSpeed runs"
)
def test_the_deepspeed_claims_fail_on_a_wrong_figure(two):
    wrong = copy.deepcopy(two)
    _set(wrong, "deepspeed_3", "total", lambda b: b * 1.25, rank=1)  # one rank's master copy unsharded
    assert any("every DeepSpeed rank holds" in claim for ok, claim in R.sharding_claims(wrong) if not ok)
    _set(wrong, "deepspeed_2", "peak_rss_above_start_mb", lambda p: two.peak("ddp") - 5)
    assert any("peaked above plain DDP's" in claim for ok, claim in R.sharding_claims(wrong) if not ok)


def test_the_distilbert_claims_fail_on_a_wrong_figure():
    base = distilbert_peak()
    assert _all_hold(base.claims()) and base.model == "distilbert-base"
    assert "optimizer step sets the peak" in base.summary()
    # the summary's sum is the parts' sum, generated: the 8 x 64 peak is said apart from it
    assert f"make **{sum(mb for _, mb in base.parts):.0f} MiB**" in base.summary()
    assert f"step peaked at **{base.peak2:.0f} MiB**" in base.summary()
    # the chapter prints these as facts of the committed file (every run reads the same), never as "checked:"
    facts = committed_facts(base.claims())
    assert all(f.startswith("the committed benchmark shows: ") for f in facts) and len(facts) == 2
    assert committed_facts([(False, "x")]) == ["the committed benchmark does NOT show: x"]
    fields = {k: getattr(base, k) for k in DistilbertPeak.__dataclass_fields__}
    extra = base.peak2 - base.peak1  # named as what it is: a difference of two peaks, not one rank's own
    assert f"the fullest rank's 2-rank peak minus the 1-process peak ({extra:.0f} MiB)" in base.claims()[0][1]
    assert "second rank" not in base.claims()[0][1]
    no_buckets = DistilbertPeak(**{**fields, "peak1": base.peak2 - 5})  # the second rank added no bucket copy
    assert not no_buckets.claims()[0][0]
    by_activations = DistilbertPeak(**{**fields, "calibration2": base.peak2 * 0.9})
    assert not by_activations.claims()[1][0]
    # the runtime is the calibration's residual: the parts add up to the ddp@1x8 peak by construction, so the chapter
    # prints that sum as the calibration's peak and checks nothing on it
    assert sum(mb for _, mb in base.parts) == pytest.approx(base.calibration2, rel=0.01)
    assert not any("add up" in claim for _, claim in base.claims())
    assert "the parts: the ddp@1x8 run's peak, by construction" in base.table() and "about" not in base.table()


def test_the_adamw_claim_fails_on_a_wrong_figure():
    want = {k: M.estimate("tiny", adamw=k).parts["AdamW temporaries"] for k in M.ADAMW}
    right = R.AdamwTemporaries({k: [v, v + 4096, v - 4096] for k, v in want.items()})
    assert right.claim()[0] and "14.9" in right.table() and "less with foreach" in right.summary()
    one_temporary = R.AdamwTemporaries({**right.measured, "for-loop": [want["for-loop"] / 2] * 3})
    assert not one_temporary.claim()[0]


def test_each_figure_draws_what_it_is_given(one, two):
    estimates = {
        "a": M.estimate("distilbert-base", 8, 64, world=2),
        "b": M.estimate("distilbert-base", 16, 256, world=2),
    }
    fig = F.step_timeline(estimates, "t")
    assert len(fig.axes) == 2 and fig.axes[0].get_ylim()[1] >= estimates["b"].peak_mb
    xs, curves = F._step_curves(estimates["a"].parts_mb)
    tops = [sum(c[i] for c in curves.values()) for i in range(len(xs))]
    assert max(tops) == pytest.approx(estimates["a"].peak_mb, rel=1e-6), "the picture's top is the calculator's peak"
    assert len(F.activations_figure(R.activation_rows(one), lambda t: t / 100).axes[0].lines) >= 4
    rows = calculator_check(one, two).rows
    assert len(F.calculator_figure(rows).axes[0].patches) == len(rows)
    assert len(F.held_figure(R.held_rows(two), 2).axes[0].patches) == 3 * len(R.held_rows(two))
    base = distilbert_peak()
    assert len(F.parts_figure(base.parts, base.peak2, "x").axes[0].patches) == len(base.parts) + 1


def test_the_chapter_record_holds_the_runs_figures(one, two, tmp_path, monkeypatch):
    monkeypatch.setenv("DISTRINEWS_COURSE_RECORDS", str(tmp_path))
    calc, rec = calculator_check(one, two), R.recomputation(one)
    want = {k: M.estimate("tiny", adamw=k).parts["AdamW temporaries"] for k in M.ADAMW}
    adamw = R.AdamwTemporaries({k: [v] * 3 for k, v in want.items()})
    record = write_chapter_record(calc, one, two, adamw, rec, 8.0, distilbert_peak())
    assert json.loads((tmp_path / "06_memory_and_sharding.json").read_text())["headline"] == record["headline"]
    assert record["runtime_mib"] == {"1": round(one.runtime_mb, 1), "2": round(two.runtime_mb, 1)}
    assert record["held_bytes_per_param"]["ddp"] == 16.0 and record["bucket_view_saves_mib"] == 8.0
    assert f"of {len(calc.rel_errors)} measured peaks" in record["headline"]
