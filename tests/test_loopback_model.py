"""Chapter 05's loopback model (distrinews_course/bench/loopback.py) on a recorded quiet sweep of this 2-core machine
(tests/data/loopback_sweep.json: the launch's runs, trimmed to what the model reads): every point is predicted within
15% and checked, no prediction is above N, and the check fails when one term of the model is wrong; a point with a
busy round, or rounds that disagree, is shown with a NOTE instead; the step's gap to the ideal is explained by its
parts, and a wrong part fails that check."""

import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from distrinews_course import perf_model as pm
from distrinews_course.bench import loopback

DATA = Path(__file__).resolve().parent / "data" / "loopback_sweep.json"
NOISY = DATA.with_name("loopback_sweep_noisy.json")  # a host that moved runs by 23%: see its note


def load(path):
    rec = json.loads(path.read_text())
    fit = pm.Fit(rec["fit"]["alpha_s"], rec["fit"]["beta_s_per_byte"])
    cost = loopback.Model.from_runs(rec["runs"], fit, rec["n"], rec["batches"][0], rec["rounds"])
    return rec, cost


@pytest.fixture(scope="module")
def sweep():
    return load(DATA)


@pytest.fixture(scope="module")
def noisy():
    return load(NOISY)


def points(rec, cost):
    return loopback.points(rec["runs"], cost, rec["batches"], rec["rounds"])


def test_every_point_is_checked_and_holds(sweep):
    rec, cost = sweep
    pts = points(rec, cost)
    verdicts = loopback.verdicts(pts)
    assert len(verdicts) == len(rec["batches"]), "a quiet sweep checks every point, the smallest included"
    assert all(ok for ok, _ in verdicts), [claim for ok, claim in verdicts if not ok]
    assert all(p["predicted"] <= rec["n"] for p in pts)
    assert all(c.checked for c in loopback.speedup_claims(pts))


def test_a_model_without_the_all_reduce_fails_the_check(sweep):
    # at 16 per process the all-reduce is a fifth of the DDP step: more than the 15% the check allows. (Doubled, it
    # moves that point by about as much, from 1.08 to 0.87 on this sweep: within the bound, so the check is not
    # claimed to catch it; section 1's count of the ring's bytes does.)
    rec, cost = sweep
    bad = dataclasses.replace(
        cost, transfer_rounds={b: [(0.0, q) for _, q in v] for b, v in cost.transfer_rounds.items()}
    )
    failed = [claim for ok, claim in loopback.verdicts(points(rec, bad)) if not ok]
    assert any(claim.startswith("at 16 per process") for claim in failed), failed


def test_each_point_uses_the_other_batches_all_reduce_never_its_own(sweep):
    rec, cost = sweep
    rounds = cost.transfer_rounds
    for k, (s, _) in enumerate(rounds[16]):  # the DDP run's own clock: the transfer part of its steps
        assert s == loopback.part(rec["runs"][f"ddp_b16_r{k}"], "transfer")
    for b in rounds:
        others = sorted(s for o, v in rounds.items() if o != b for s, quiet in v if quiet)
        assert cost.comm_for(b) == pytest.approx(statistics.median(others))
        own_wrong = dataclasses.replace(cost, transfer_rounds={**rounds, b: [(9.9, True)] * len(rounds[b])})
        assert own_wrong.comm_for(b) == cost.comm_for(b), "a point's own DDP runs went into its prediction"


def test_a_host_that_moves_runs_between_rounds_does_not_move_the_all_reduce(noisy):
    rec, cost = noisy
    runs = rec["runs"]
    # 8e1d6c5's term: the DDP step less the pair's and DDP's own work, the median of 64's rounds (a difference of two
    # runs seconds apart): 37 ms on this host, where the DDP steps' own clock says 10 to 13 ms at every batch
    diff = statistics.median(
        loopback.step_s(runs[f"ddp_b64_r{k}"]) - loopback.lockstep_s(runs[f"pair_b64_r{k}"]) - cost.overhead_s
        for k in range(rec["rounds"])
    )
    assert diff > 2.5 * cost.comm_for(16)
    assert max(cost.transfer_s.values()) / min(cost.transfer_s.values()) < 1.5
    pts = points(rec, cost)
    assert pts[0]["quiet"] and abs(pts[0]["ratio"] - 1) < 0.05, pts[0]["ratios"]
    old = dataclasses.replace(cost, transfer_rounds={64: [(diff, True)]})  # 8e1d6c5's model, which CI failed on
    assert points(rec, old)[0]["ratio"] < 0.8
    # every round of this sweep but one at 64 ran quiet, while the host moved them by up to 23%: 16 and 256 are
    # checked, each within twice its own rounds' spread (16's agree within 5%: held to 15%), and hold; 64 is a NOTE
    verdicts = loopback.verdicts(pts)
    assert [c.split(" per process")[0] for _, c in verdicts] == ["at 16", "at 256"] and all(ok for ok, _ in verdicts)
    assert "within 15% of the measurement" in verdicts[0][1] and "within 39% of the measurement" in verdicts[1][1]


def test_a_point_is_judged_on_the_median_of_its_quiet_rounds(sweep):
    rec, cost = sweep
    runs = json.loads(json.dumps(rec["runs"]))
    b = rec["batches"][0]
    runs[f"ddp_b{b}_r1"]["seconds"] *= 1.25  # one round the host slowed, unseen in the VM
    (p, *_) = loopback.points(runs, cost, rec["batches"], rec["rounds"])
    assert len(p["ratios"]) == rec["rounds"] and p["ratio"] == pytest.approx(statistics.median(p["ratios"]))
    assert max(p["ratios"]) > 1.2 and abs(p["ratio"] - 1) < loopback.BOUND, "one slowed round decided the point"
    (claim,) = [c for _, c in loopback.verdicts(loopback.points(runs, cost, rec["batches"], rec["rounds"]))][:1]
    assert f"over its {rec['rounds']} rounds, median {p['ratio']:.2f}" in claim


def test_the_speedup_follows_the_pair_past_n_and_never_past_the_pair(sweep):
    _, cost = sweep
    # a pair 4x faster than the single (the cache effect at half the batch): the prediction passes N with it, as
    # chapter 05 measured (2.49x at 256 per process, 2 processes), less what DDP adds to the pair's step
    fast = cost.speedup(single_step=1.0, pair_step=0.25)
    assert cost.n < fast < 4 and fast == pytest.approx(1.0 / cost.step(0.25))


def test_a_busy_round_is_shown_with_the_part_it_missed(sweep):
    rec, cost = sweep
    runs = json.loads(json.dumps(rec["runs"]))
    b = rec["batches"][0]
    for k in range(rec["rounds"]):  # other programs took a core during every DDP run at the smallest batch
        ranks = runs[f"ddp_b{b}_r{k}"]["ranks"]
        for i, r in enumerate(ranks):  # whichever rank is the longest: 1 core beside our other ranks' CPU
            r["foreign_cores"] = 1.0 + sum(o["cpu_s"] for j, o in enumerate(ranks) if j != i) / r["seconds"]
    pts = loopback.points(runs, cost, rec["batches"], rec["rounds"])
    assert len(loopback.verdicts(pts)) == len(rec["batches"]) - 1
    (note,) = [c for c in loopback.speedup_claims(pts) if not c.checked]
    assert note.unchecked == f"other programs used up to 1.00 cores in {rec['rounds']} of its {rec['rounds']} rounds"
    assert note.text.startswith(f"at {b} per process the model says") and "the run" in note.text


def test_a_quiet_sweep_is_checked_within_15_percent(sweep):
    rec, cost = sweep
    pts = points(rec, cost)
    assert loopback.SPREAD_TIMES * loopback.spread(pts) < loopback.BOUND, "the quiet rounds agree within a few percent"
    assert all("within 15% of the measurement" in claim for _, claim in loopback.verdicts(pts))


def slowed(rec, cost, factor):
    """The recorded sweep with one DDP run at the largest batch slowed by `factor`: the host, with nothing in the VM
    to show for it (its other programs' cores stay as recorded)."""
    runs = json.loads(json.dumps(rec["runs"]))
    runs[f"ddp_b{rec['batches'][-1]}_r1"]["seconds"] *= factor
    pts = loopback.points(runs, cost, rec["batches"], rec["rounds"])
    assert all(r["quiet"] for p in pts for r in p["rounds"])
    speeds = [r["measured"] for r in pts[-1]["rounds"]]
    return pts, (max(speeds) - min(speeds)) / sorted(speeds)[1]


def test_rounds_that_disagree_widen_that_batchs_check_to_twice_their_spread(sweep):
    rec, cost = sweep
    pts, widest = slowed(rec, cost, 1.25)
    assert loopback.BOUND < widest <= 2 * loopback.BOUND
    assert loopback.spread(pts) == pytest.approx(widest) and loopback.margin(pts) == pytest.approx(2 * widest)
    verdicts = loopback.verdicts(pts)
    assert len(verdicts) == len(rec["batches"])
    # the slowed batch's own margin; the others' rounds still agree, and they are held to 15%
    assert f"within {200 * widest:.0f}% of the measurement" in verdicts[-1][1], verdicts
    assert all("within 15% of the measurement" in claim for _, claim in verdicts[:-1]), verdicts


def test_a_model_without_the_all_reduce_fails_at_a_tight_batch_beside_a_loose_one(sweep):
    # one margin for the whole sweep (twice the widest spread) would let it pass: the loose batch must not loosen 16's
    rec, cost = sweep
    runs = json.loads(json.dumps(rec["runs"]))
    runs[f"ddp_b{rec['batches'][-1]}_r1"]["seconds"] *= 1.4
    bad = dataclasses.replace(
        cost, transfer_rounds={b: [(0.0, q) for _, q in v] for b, v in cost.transfer_rounds.items()}
    )
    pts = loopback.points(runs, bad, rec["batches"], rec["rounds"])
    off = abs(pts[0]["ratio"] - 1)
    assert loopback.point_spread(pts[0]) < 0.075 and loopback.BOUND < off < loopback.margin(pts), "not the case"
    failed = [claim for ok, claim in loopback.verdicts(pts) if not ok]
    assert any(claim.startswith("at 16 per process") and "within 15%" in claim for claim in failed), failed


def test_a_batch_whose_rounds_disagree_by_over_twice_the_bound_is_shown_not_checked(sweep):
    rec, cost = sweep
    pts, widest = slowed(rec, cost, 1.6)
    assert widest > 2 * loopback.BOUND
    assert loopback.margin(pts) is None  # section 4, held to the widest, checks nothing on this sweep
    claims = loopback.speedup_claims(pts)
    assert [c.checked for c in claims] == [True, True, False] and all(c.holds for c in claims[:2])
    assert claims[-1].unchecked == (
        f"the host moved whole runs: this batch's measured speedups moved by {100 * widest:.0f}% from round to round"
    )


def test_a_point_with_a_busy_round_is_shown_not_checked(sweep):
    # its median would rest on 2 rounds: one the host slowed, unseen, would decide it
    rec, cost = sweep
    runs = json.loads(json.dumps(rec["runs"]))
    b = rec["batches"][-1]
    (r,) = runs[f"single_b{b}_r2"]["ranks"]  # other programs took a core during one single run at the largest batch
    r["foreign_cores"] = 1.0
    pts = loopback.points(runs, cost, rec["batches"], rec["rounds"])
    assert [p["quiet"] for p in pts] == [True, True, False] and len(pts[-1]["ratios"]) == 2
    assert [c for _, c in loopback.verdicts(pts)][-1].startswith(f"at {rec['batches'][1]} per process")
    (note,) = [c for c in loopback.speedup_claims(pts) if not c.checked]
    assert note.unchecked == "other programs used up to 1.00 cores in 1 of its 3 rounds"
    assert note.text.startswith(f"at {b} per process") and "the run" in note.text
    # the NOTE leaves each round's ratio to the table beside it, which marks the busy round
    table = sweep_of(rec, cost, runs).speedup_table().splitlines()[-1]
    assert table.startswith(f"{b:>13}") and "(busy: 1.00 cores)" in table


def sweep_of(rec, cost, runs=None) -> loopback.Sweep:
    runs = runs or rec["runs"]
    return loopback.Sweep(runs, cost, loopback.points(runs, cost, rec["batches"], rec["rounds"]), rec["n"], 3, 2)


def test_the_gap_is_explained_by_its_parts(sweep):
    rec, cost = sweep
    s = sweep_of(rec, cost)
    gap = s.gap()
    assert set(gap) == set(loopback.GAP_LABELS)
    # the parts and the rest add up to the DDP step less the ideal, by definition of the rest
    assert sum(gap.values()) == pytest.approx(s.ddp_s - s.ideal_s)
    claim = s.gap_claim()
    assert claim.checked and claim.holds, claim
    assert "explain the DDP step within" in claim.text and s.gap_table().count("\n") == len(gap) + 1


def test_a_wrong_part_fails_the_gap_check(sweep):
    # the DDP run's own transfer part, recorded 100 ms too long on each rank (the step unchanged): the
    # parts now say more than the step holds, and the rest, beyond the bound, fails the check
    rec, cost = sweep
    runs = json.loads(json.dumps(rec["runs"]))
    s = sweep_of(rec, cost, runs)
    kept = s.at[s.large]["kept"]
    for r in runs[f"ddp_b{s.large}_r{kept}"]["ranks"]:
        r["parts"]["transfer"] += 0.100
    claim = sweep_of(rec, cost, runs).gap_claim()
    assert claim.checked and not claim.holds, claim


def test_a_busy_run_leaves_the_gap_unchecked(sweep):
    rec, cost = sweep
    runs = json.loads(json.dumps(rec["runs"]))
    (r,) = runs[f"solo_b{rec['batches'][-1]}_r1"]["ranks"]
    r["foreign_cores"] = 0.8
    claim = sweep_of(rec, cost, runs).gap_claim()
    assert not claim.checked and "other programs used up to 0.80 cores during 1 of its 12 runs" == claim.unchecked
    assert "within" not in claim.text, "a bound the run cannot check is not printed"


def test_only_ddp_rows_show_an_all_reduce_and_the_gap_rest_is_printed(sweep):
    rec, cost = sweep
    s = sweep_of(rec, cost)
    rows = s.parts_table().splitlines()[1:]
    numbers = {line.split(",")[0].split(" (")[0]: len(line[30:].split()) for line in rows}
    # 7 parts and the step for DDP's ranks; no waiting or transfer where no all-reduce ran
    assert numbers == {"1 process": 6, "pair": 6, "DDP": 8}, rows
    line = s.gap_rest_line()
    assert f"{1000 * s.gap()['rest']:+.1f} ms of the DDP step ({1000 * s.ddp_s:.1f} ms)" in line
    assert f"moved by {1000 * s.gap_noise_s():.0f} ms" in line and "checked:" not in line
