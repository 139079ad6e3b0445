"""Chapter 06's memory calculator (distrinews_course.memory), memory_footprint.py's run specs (memory_probe): fast,
no launch."""

from __future__ import annotations

import os

import pytest
import torch

from distrinews_course import memory as M
from distrinews_course import memory_probe
from distrinews_lib.data.texts import AG_NEWS_LABELS
from distrinews_lib.models.build import build_model
from distrinews_lib.training.config import RunConfig


def _tiny():
    model = build_model(RunConfig(model="tiny", seed=0), AG_NEWS_LABELS)[0]
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def test_the_shape_has_the_models_tensors():
    model = _tiny()
    assert sorted(M.SHAPES["tiny"].tensors()) == sorted(p.numel() for p in model.parameters())


@pytest.mark.parametrize("batch,seq", [(4, 32), (2, 96)])
def test_the_activation_formula_counts_what_autograd_saves(batch, seq):
    model = _tiny()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    ids = torch.randint(1000, 2000, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[:, seq // 2 :] = 0  # padded, as the course's batches are
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, attention_mask=mask)
    assert M.activation_bytes(M.SHAPES["tiny"], batch, seq) == pytest.approx(sum(seen.values()), rel=0.03)


def test_zero1_split_is_greedy_by_whole_tensor():
    assert M.zero1_split([10, 1, 1, 1], 2) == [10, 3]
    assert M.zero1_split([4, 3, 3, 2], 2) == [6, 6]
    tiny = M.SHAPES["tiny"]
    assert max(M.zero1_split(tiny.tensors(), 2)) > 0.9 * tiny.n_params  # the word embeddings decide it


def test_the_estimate_moves_the_right_way():
    base = M.estimate("distilbert-base", 8, 64, world=2)
    assert base.parts["DDP buckets"] == 4 * M.SHAPES["distilbert-base"].n_params
    assert M.estimate("distilbert-base", 8, 64, world=2, bucket_view=True).peak < base.peak
    assert M.estimate("distilbert-base", 8, 64, world=1).parts["DDP buckets"] == 0
    big = M.estimate("distilbert-base", 64, 512, world=2)
    assert M.estimate("distilbert-base", 64, 512, world=2, recompute=True).peak < big.peak
    assert M.estimate("distilbert-base", 64, 512, stage=3, world=8).peak < big.peak
    mixed = M.estimate("distilbert-base", 8, 64, precision="mixed (fp16 + fp32 master)", stage=1, world=64, impl="even")
    assert mixed.parts["optimizer state"] == pytest.approx(12 * M.SHAPES["distilbert-base"].n_params / 64, rel=1e-6)
    with pytest.raises(ValueError, match="ZeRO stage"):
        M.estimate(stage=4)


def test_the_calculator_prints_a_table_without_a_front_end(capsys):
    assert not M.interactive()
    text = M.calculator(overhead_mb=20.0)
    assert "distilbert-base" in text and text in capsys.readouterr().out


def test_every_calculator_row_adds_up_from_its_own_columns():
    # the peak a learner reads follows from the row and the runtime printed above it, gathered unit included
    runtime = 26.5
    for line in M.table(overhead_mb=runtime).splitlines()[2:]:
        w, g, opt, buckets, temps, gather, act, peak = map(float, line.split("|")[1].split())
        assert peak == pytest.approx(w + opt + buckets + gather + runtime + max(act, g + temps), abs=3), line
    assert "gather" in M.table().splitlines()[0] and "gather (one gathered unit" in M.precision_note()
    (sharded,) = [ln for ln in M.table().splitlines() if ln.split("|")[0].split()[3:5] == ["3", "8"]]
    assert float(sharded.split("|")[1].split()[5]) > 300, "the gathered unit: DistilBERT's embeddings and head"


def test_run_specs_are_read_or_refused_with_the_grammar():
    assert memory_probe.parse_run("ddp@32x128+ckpt", 8, 64) == {
        "name": "ddp@32x128+ckpt",
        "variant": "ddp",
        "batch": 32,
        "seq": 128,
        "ckpt": True,
        "view": False,
    }
    assert memory_probe.parse_run("ddp+view", 8, 64)["view"] and memory_probe.parse_run("zero1", 8, 64)["batch"] == 8
    with pytest.raises(SystemExit, match=r"VARIANT\[@BATCHxSEQ\]"):
        memory_probe.parse_run("ddp@32", 8, 64)


def test_adamw_temporaries_follow_the_implementation():
    base = M.SHAPES["distilbert-base"]
    temps = {k: M.estimate("distilbert-base", adamw=k).parts["AdamW temporaries"] for k in M.ADAMW}
    assert temps == {"for-loop": 8 * max(base.tensors()), "foreach": 4 * base.n_params, "fused": 0}
    # foreach spans the parameters this rank updates: its shard under full sharding
    assert M.estimate("distilbert-base", stage=3, world=4, adamw="foreach").parts["AdamW temporaries"] == base.n_params
    with pytest.raises(ValueError, match="for-loop, foreach, fused"):
        M.estimate(adamw="sgd")


@pytest.mark.also_in_notebook  # chapter 06's section 1 asserts the same, on the same measurement
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="reads the peak from Linux's /proc")
def test_measured_adamw_temporaries_match_the_calculator():
    measured = M.measure_adamw_temporaries("tiny")
    spread = max(max(v) - min(v) for v in measured.values())
    for impl, values in measured.items():
        want = M.estimate("tiny", adamw=impl).parts["AdamW temporaries"]
        assert abs(sorted(values)[1] - want) <= 0.05 * want + spread, (impl, measured)


def test_a_peak_prediction_is_judged_by_the_part_it_got_wrong():
    runtime = 20.0
    right = M.estimate("tiny", 16, 512, overhead_mb=runtime).peak_mb
    assert M.judge_peak_prediction(right, "tiny", 16, 512, overhead_mb=runtime) == (
        True,
        "right: the activations set the peak at this setting",
    )
    ok, why = M.judge_peak_prediction(right - runtime, "tiny", 16, 512, overhead_mb=runtime)
    assert not ok and "runtime" in why
    ok, why = M.judge_peak_prediction(right, "tiny", 16, 512, recompute=True, overhead_mb=runtime)
    assert not ok and "recomputation keeps only" in why
    ok, why = M.judge_peak_prediction(right / 5, "tiny", 16, 512, overhead_mb=runtime)
    assert not ok and "below the calculator" in why
    assert M.judge_peak_prediction("150", "tiny", 16, 512) == (False, "write a positive number of MiB, not '150'")
