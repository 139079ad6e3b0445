"""Chapter 03's named calls around its race (distrinews_course/by_hand: ddp_facts, dialed.run, exercises'
reference_claims, report's ladder sketch): each claim holds on figures like a real run's and fails when one figure is
wrong; the dialed launch assembles its arguments and stands down where no box can be built."""

import copy
import json

import pytest
import torch

from distrinews_course.by_hand import ddp_facts, dialed, exercises, report


def by_text(claims, words):
    found = [c for c in claims if words in c.text]
    assert len(found) == 1, (words, [c.text for c in claims])
    return found[0]


# ------------------------------------------------------------------------------------------- the tiny model's embedding


def embedding(share=0.934, position=40, tensors=40, buckets=(7.98,)):
    return {"share": share, "position": position, "tensors": tensors, "ddp_buckets_mib": list(buckets)}


def test_the_embedding_claims_hold_as_on_a_run_and_fail_on_each_wrong_figure():
    assert all(c.checked and c.holds for c in ddp_facts.embedding_claims(embedding()))
    assert "93.4% of the gradient bytes, ready 40th of 40: a constant" in ddp_facts.embedding_lines(embedding())
    assert "makes 1 bucket of" in ddp_facts.embedding_claims(embedding())[0].text
    for wrong in ((7.45, 0.53), (4.0, 2.0, 1.98), ()):  # two buckets would overlap the 0.53 MiB before the embedding
        assert not by_text(ddp_facts.embedding_claims(embedding(buckets=wrong)), "nothing to overlap").holds


def test_the_embedding_is_measured_from_the_model_and_the_hooks_order():
    model = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 2))
    order = ["1.bias", "1.weight", "0.weight"]
    e = ddp_facts.embedding_last(model, order, [3400], name="0.weight")
    assert e["share"] == pytest.approx(800 / 818) and e["position"] == 3 and e["tensors"] == 3
    assert e["ddp_buckets_mib"] == [0.0] and "ready 3th of 3" in ddp_facts.embedding_lines(e)


# ------------------------------------------------------------------------------------------- the interview questions

DEFINED = [f"p{i}" for i in range(8)]


def facts():
    return {
        "ddp_rebuild": {
            "buckets_seen_per_step": [1, 4, 4],
            "ready_order": ["p7", "p6", "p4", "p5", "p3", "p2", "p1", "p0"],  # a swap inside a layer
            "definition_order": list(DEFINED),
        },
        "ddp_buckets_wide": [1, 1, 1, 1],
        "gradient_as_bucket_view": {"False": {"grad_storages": 8}, "True": {"grad_storages": 4}},
        "collective_bytes": {
            "buffer_bytes": 5 * 2**20,
            "all_reduce": 10.2 * 2**20,
            "reduce_scatter": 10.2 * 2**20,
            "all_gather": 5.1 * 2**20,
        },
    }


TIMING = {
    "collectives_per_step": {"naive": 72, "flat": 1, "bucketed": 4},
    "median_step_s": {"naive": 0.145, "flat": 0.109, "bucketed": 0.120},
    "foreign_cores": 0.02,
}


def test_the_interview_claims_hold_as_on_a_run_and_each_fails_on_its_wrong_figure():
    claims = ddp_facts.interview_claims(facts(), TIMING, 0.3)
    assert len(claims) == 6 and all(c.checked and c.holds for c in claims)
    slow_flat = copy.deepcopy(TIMING)
    slow_flat["median_step_s"]["flat"] = 0.2
    assert not by_text(ddp_facts.interview_claims(facts(), slow_flat, 0.3), "1. ").holds
    wrong = []
    f = facts()
    f["ddp_rebuild"]["ready_order"] = list(DEFINED)  # ready in forward order
    wrong.append((f, "2. "))
    for seen in ([4, 4, 4], [1, 1, 1], [1, 4, 3], [1, 5, 5]):  # no first-step bucket, no rebuild, unstable, not DDP's
        f = facts()
        f["ddp_rebuild"]["buckets_seen_per_step"] = seen
        wrong.append((f, "3. "))
    f = facts()
    f["gradient_as_bucket_view"]["True"]["grad_storages"] = 8  # the gradients kept their own storages
    wrong.append((f, "4. "))
    for op, mib, words in (
        ("all_gather", 10.2, "all-gather moves"),
        ("all_gather", 2.0, "all-gather moves"),
        ("reduce_scatter", 2.0, "reduce-scatter moves"),
        ("reduce_scatter", 0.0, "reduce-scatter"),
    ):
        f = facts()
        f["collective_bytes"][op] = mib * 2**20
        wrong.append((f, words))
    for f, words in wrong:
        assert not by_text(ddp_facts.interview_claims(f, TIMING, 0.3), words).holds, words


def test_the_interview_speed_claim_stands_down_on_a_busy_machine_and_bytes_without_a_counter():
    busy = dict(TIMING, foreign_cores=0.9)
    c = by_text(ddp_facts.interview_claims(facts(), busy, 0.3), "1. ")
    assert c.unchecked == "other programs kept 0.90 cores busy"
    f = facts()
    f["collective_bytes"] = {"buffer_bytes": 5 * 2**20, "all_reduce": None}
    c = by_text(ddp_facts.interview_claims(f, TIMING, 0.3), "5. ")
    assert "no /proc/self/io" in c.unchecked
    text = ddp_facts.interview_lines(facts(), TIMING)
    assert "reduce-scatter 1.00x, all-gather 0.50x: ZeRO-1 1.50x" in text and "[1, 4, 4]" in text
    assert "1 of 8 differ" not in text and "2 of 8 differ" in text


def test_the_no_broadcast_drift_is_checked_on_the_moves_and_fails_a_rung_that_never_averaged():
    line = (
        "no broadcast: the ranks started 0.142301 apart and end 0.142294 apart; their moves differ by 7.1e-06 | "
        "lr 0.001, weight decay 0.01"
    )
    d = ddp_facts.drift(line, 5)
    assert d == {"before": 0.142301, "after": 0.142294, "moved": 7.1e-06, "lr": 0.001, "wd": 0.01, "steps": 5}
    assert ddp_facts.drift_claims(d)[0].holds
    for key, value in (("moved", 2e-3), ("before", 0.0), ("after", 0.0)):  # no average; broadcast anyway; converged
        assert not ddp_facts.drift_claims(dict(d, **{key: value}))[0].holds, key
    with pytest.raises(ValueError, match="no drift figures"):
        ddp_facts.drift("after 5 steps: max weight difference between the ranks 0.142", 5)
    text = ddp_facts.interview_lines(facts(), TIMING)
    assert "4. What does gradient_as_bucket_view save? a second copy of the gradients per rank: 0.0 MiB" in text


# ------------------------------------------------------------------------------------------------ the dialed launch


def plan():
    return dialed.Plan(
        0.5, 48, 1000, [600, 400], True, {"forward": 0.05, "backward": 0.1, "optimizer": 0.01}, 240, 0.15, 0.06
    )


def test_the_dialed_run_stands_down_without_a_box_and_launches_with_the_plans_figures(monkeypatch, tmp_path, capsys):
    from distrinews_course import link

    launched = []
    monkeypatch.setattr(link, "usable", lambda: (False, "no network namespaces"))
    monkeypatch.setattr(link, "run_in_box", lambda *a, **k: launched.append((a, k)))
    assert dialed.run(plan(), tmp_path / "d.json") == (None, "no network namespaces") and not launched
    assert dialed.run(plan(), tmp_path / "d.json", dial=False) == (None, "DIAL = False") and not launched
    assert "no dialed link here (DIAL = False)" in capsys.readouterr().out

    def box(script, args, rate, timeout):
        launched.append((script, args, rate))
        (tmp_path / "d.json").write_text(json.dumps({"seconds": 40.8}))

    monkeypatch.setattr(link, "usable", lambda: (True, "box ok"))
    monkeypatch.setattr(link, "run_in_box", box)
    out, how = dialed.run(plan(), tmp_path / "d.json", rounds=5, sweep="0.5,25", sweep_rounds=2)
    assert out == {"seconds": 40.8} and how == "box ok"
    script, args, rate = launched[0]
    assert script.name == "race.py" and rate == "240mbit"
    flags = {a: args[i + 1] for i, a in enumerate(args[:-1]) if str(a).startswith("--")}
    assert flags["--bucket_mb"] == 0.5 and flags["--timing_batch_size"] == 48 and flags["--rounds"] == 5
    assert flags["--sweep"] == "0.5,25" and flags["--sweep_rounds"] == 2 and "--no-dropout" in args


# --------------------------------------------------------------------------------------------- the reference answers


def verdicts():
    clear = {"summary": "a clear error on every rank: ..."}
    probes = {
        r: {
            "accumulate": {"summary": "two backward passes per step: refused on every rank, ..."},
            "unused_rank1": clear,
            "unused_all": clear,
        }
        for r in ("overlapped", "bucketed")
    }
    out = {r: {"ok": True, "passed": ["a", "b"]} for r in exercises.REFERENCE_RUNGS}
    return {**out, "_race": {"probes": probes}}


def test_the_reference_claims_hold_and_each_fails_on_its_wrong_verdict():
    assert all(c.holds for c in exercises.reference_claims(verdicts()))
    v = verdicts()
    v["zero1"]["ok"] = False
    assert not by_text(exercises.reference_claims(v), "reference zero1").holds
    v = verdicts()
    v["_race"]["probes"]["bucketed"]["accumulate"]["summary"] = "two backward passes per step: accumulated"
    assert not by_text(exercises.reference_claims(v), "second backward").holds
    v = verdicts()
    v["_race"]["probes"]["overlapped"]["unused_rank1"]["summary"] = "rank 0 waited 20 s in a collective"
    assert not by_text(exercises.reference_claims(v), "without a gradient").holds
    v = verdicts()
    del v["_race"]  # the launch crashed: every rung's verdict says so, and no probe claim can hold
    assert not any(c.holds for c in exercises.reference_claims(v)[-2:])


# ---------------------------------------------------------------------------------------------- the ladder, sketched


def test_the_ladder_sketch_sends_when_each_rung_says_it_does():
    s = report.ladder_sketch()
    msgs = {r: [b for b in bars if b[0] == 0] for r, bars in s.items()}
    end = next(b for b in s["naive"] if b[3] == "backward")[2]
    assert len(msgs["naive"]) == len(msgs["overlapped"]) == 8 and len(msgs["flat"]) == 1 and len(msgs["bucketed"]) == 3
    assert all(b[1] >= end for r in ("naive", "flat", "ZeRO-1") for b in msgs[r])  # after backward
    assert msgs["overlapped"][0][1] < end and msgs["bucketed"][0][1] < end  # during it
    assert [b[3] for b in msgs["ZeRO-1"]] == ["reduce_scatter", "all_gather"]
    done = {r: max(b[1] + b[2] for b in bars) for r, bars in s.items()}
    assert done["naive"] > done["flat"] > done["overlapped"] > done["bucketed"]
    assert len(report.plot_ladder().axes) == 5


def test_the_given_block_class_is_shown_whole_before_exercise_4():
    block = exercises.given_class("zero3", "Block")
    assert block.startswith("class Block:") and "self.full = " in block and "self.shard = " in block
    assert "class Zero3DP" not in block
    with pytest.raises(ValueError, match="no class Nope"):
        exercises.given_class("zero3", "Nope")
