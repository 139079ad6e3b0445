"""Chapter 05's plans (distrinews_course/bench/perf_runs.py, dialed.plans): every run's flags give the script exactly
the optimizer steps its window needs (warm-up included: a run one step short fails the launch), the sweep compares
the levers within its rounds, and the box's DDP runs carry the prediction made before the launch."""

from types import SimpleNamespace

import pytest

from distrinews_course import link
from distrinews_course.bench import dialed, loopback, perf_runs

ENV = SimpleNamespace(nproc=2, n_gpus=0, preset="cpu_smoke")


@pytest.fixture
def plan(tmp_path):
    return perf_runs.Plan(ENV, out=tmp_path)


def flag(run, name):
    flags = run["flags"]
    return flags[len(flags) - 1 - flags[::-1].index(name) + 1]  # the last one wins, as argparse reads them


def test_every_run_asks_for_the_steps_its_window_needs(plan):
    runs = plan.loopback_runs()
    assert len(runs) == 1 + 3 * (3 * 3 + 1 + 1 + 1) + 1 + 2 + 3  # collectives, 3 rounds, profiled, accum, hooks
    for name, run in runs.items():
        if "collectives" in run or name.startswith("accum"):
            continue
        steps = run["steps"] + run["warmup"]
        assert int(flag(run, "--max_steps_per_epoch")) == steps, name
        assert int(flag(run, "--num_samples")) == steps * run["per_rank"] * run["world"], name
        assert flag(run, "--output").endswith(name) or name == "profiled", name
    for hook in ("allreduce", "fp16", "powersgd"):  # the bytes each rank wrote are read from the step clock's runs
        assert runs[f"hook_{hook}"]["breakdown"] and runs[f"hook_{hook}"]["warmup"] == 2
    on = runs["accum__no_sync"]
    assert int(flag(on, "--num_samples")) == (on["steps"] + 1) * on["per_rank"] * 4 * 2


def test_the_small_buckets_run_beside_plain_ddp_in_each_round(plan):
    names = list(plan.loopback_runs())
    for k in range(3):
        ddp, small = names.index(f"ddp_b256_r{k}"), names.index(f"buckets_b256_r{k}")
        assert small == ddp + 1
        assert flag(plan.loopback_runs()[f"buckets_b256_r{k}"], "--bucket_cap_mb") == str(loopback.SMALL_BUCKET_MB)


def test_the_cell_shows_one_line_per_round(plan):
    assert plan.progress("[bench_runs] solo_b256_r1: 512 samples in 0.6 s = 850 samples/s") == (
        "round 2 of 3: single, pair and ddp at [16, 64, 256] per process measured"
    )
    assert plan.progress("[bench_runs] ddp_b16_r0: 768 samples in 0.8 s") is None
    assert plan.progress("some warning") is None


def test_the_break_even_is_where_the_model_says_1x():
    before = dialed.Before(0.914, 0.350, 0.004, 0.0009, 1, 8.0e6, large=256)
    be = before.break_even_bits()
    assert before.speedup(be) == pytest.approx(1.0)
    assert before.speedup(2 * be) > 1 > before.speedup(be / 2)
    assert [round(link.bits_per_s(r) / be, 1) for r in before.rates] == [3.0, 1.6, 0.7, 0.5]
    assert dialed.Before(0.3, 0.35, 0.004, 0.0009, 1, 8.0e6, large=256).break_even_bits() is None


def test_the_box_runs_carry_the_prediction_made_before_them(plan):
    before = dialed.Before(0.914, 0.350, 0.004, 0.0009, 1, 8.0e6, large=256)
    two, four = dialed.plans(before, plan, "400mbit")
    for i, rate in enumerate(before.rates):
        run = two[f"ddp_link{i}"]
        assert run["link"] == rate and run["predicted_comm_s"] == before.comm_s(link.bits_per_s(rate))
        assert list(two).index(f"pair_link{i}") == list(two).index(f"ddp_link{i}") - 1  # the pair just before
    fp16 = two["fp16_link"]
    assert fp16["hook"] == "fp16" and fp16["link"] == before.rates[-1]
    assert fp16["predicted_comm_s"] == pytest.approx(before.comm_s(link.bits_per_s(before.rates[-1]), 0.5))
    assert int(before.grad_bytes) // 4 * 4 in four["collectives"]["collectives"]["sizes"]
