"""The claims chapter 03 settles on its race's figures (distrinews_course/by_hand: loopback_race, dialed, zero_report,
mixed_report): each holds on figures like a real run's, and fails, or is left unchecked with its reason, when one
figure is wrong."""

import copy

import pytest

from distrinews_course.by_hand import dialed, loopback_race, mixed_report, zero_report


def by_text(claims, words):
    found = [c for c in claims if words in c.text]
    assert len(found) == 1, (words, [c.text for c in claims])
    return found[0]


# ------------------------------------------------------------------------------------------------ loopback timing

TIMING = {
    "median_step_s": {"ddp": 0.13, "naive": 0.19, "flat": 0.125, "overlapped": 0.17, "bucketed": 0.127},
    "ratio_vs_ddp": {"naive": 1.46, "flat": 0.96, "overlapped": 1.31, "bucketed": 0.98},
    "step_s": {"ddp": [0.13, 0.131, 0.129, 0.132, 0.13]},
    "foreign_cores": 0.02,
    "rounds": 5,
    "steps_per_round": 3,
}


def test_the_per_message_cost_is_naive_less_flat_over_the_extra_messages():
    t = {**TIMING, "collectives_per_step": {"naive": 72, "flat": 1}}
    assert "about 0.92 ms" in loopback_race.per_message_line(t)  # (0.19 - 0.125) / 71 s
    t["median_step_s"] = {**TIMING["median_step_s"], "naive": 0.196}
    assert "about 1.00 ms" in loopback_race.per_message_line(t)


def test_the_timing_claims_hold_on_a_quiet_run_and_fail_on_a_wrong_figure():
    claims = loopback_race.timing_claims(TIMING, 1.10, 0.3)
    assert all(c.checked and c.holds for c in claims)
    slow = copy.deepcopy(TIMING)
    slow["ratio_vs_ddp"]["bucketed"] = 1.3
    assert not by_text(loopback_race.timing_claims(slow, 1.10, 0.3), "hand-built bucketed").holds
    naive = copy.deepcopy(TIMING)
    naive["median_step_s"]["naive"] = 0.1
    assert not by_text(loopback_race.timing_claims(naive, 1.10, 0.3), "faster than naive").holds
    # overlapped slower than naive (as on a busy loopback) is not what the claim is about: it still holds
    slow_overlap = copy.deepcopy(TIMING)
    slow_overlap["median_step_s"]["overlapped"] = 0.2
    assert by_text(loopback_race.timing_claims(slow_overlap, 1.10, 0.3), "faster than naive").holds


def test_a_busy_or_noisy_run_leaves_the_timing_unchecked_with_its_reason():
    busy = dict(TIMING, foreign_cores=0.8)
    assert all("0.80 cores busy" in c.unchecked for c in loopback_race.timing_claims(busy, 1.10, 0.3))
    noisy = copy.deepcopy(TIMING)
    noisy["step_s"]["ddp"] = [0.10, 0.13, 0.18, 0.13, 0.09]
    c = by_text(loopback_race.timing_claims(noisy, 1.10, 0.3), "hand-built bucketed")
    assert "DDP's own rounds moved by" in c.unchecked


def test_ddps_spread_is_twice_the_median_distance_from_the_median():
    assert loopback_race.ddp_spread({"step_s": {"ddp": [1.0, 1.1, 0.9, 1.0, 1.5]}}) == pytest.approx(0.2)


def kinds(n=72):
    return {
        "collective_kinds": {
            "ddp": {},
            "naive": {"all_reduce": n},
            "overlapped": {"all_reduce": n},
            "flat": {"all_reduce": 1},
            "bucketed": {"all_reduce": 4},
            "zero1": {"reduce_scatter": 1, "all_gather": 1},
        },
        "collectives_per_step": {"ddp": 4, "naive": n, "overlapped": n, "flat": 1, "bucketed": 4, "zero1": 2},
    }


def test_the_collective_counts_hold_and_a_rung_that_sends_more_or_another_kind_fails():
    assert all(c.holds for c in loopback_race.collectives_claims(kinds(), 72))
    for rung, calls, words in (
        ("flat", {"all_reduce": 2}, "flat called 1"),  # a second all-reduce
        ("zero1", {"all_reduce": 1}, "flat called 1"),  # an all-reduce instead of reduce-scatter + all-gather
        ("zero1", {"reduce_scatter": 1, "all_gather": 2}, "flat called 1"),
        ("naive", {"all_reduce": 73}, "once per parameter tensor"),
        ("overlapped", {"all_reduce": 72, "all_gather": 1}, "once per parameter tensor"),
        ("bucketed", {"all_reduce": 3, "all_gather": 1}, "bucketed called"),
    ):
        t = kinds()
        t["collective_kinds"][rung] = calls
        assert not by_text(loopback_race.collectives_claims(t, 72), words).holds, (rung, calls)
    for bucketed, ddp in ((5, 4), (3, 4), (1, 1)):  # a bucket rule off by one either way; one bucket cannot overlap
        t = kinds()
        t["collective_kinds"]["bucketed"] = {"all_reduce": bucketed}
        t["collectives_per_step"].update(bucketed=bucketed, ddp=ddp)
        assert not by_text(loopback_race.collectives_claims(t, 72), "bucketed called").holds, (bucketed, ddp)


def test_the_prediction_table_grades_the_rungs_asked_about_only():
    measured = kinds()["collectives_per_step"]
    part1 = loopback_race.prediction_table({"naive": 72, "flat": 2, "bucketed": None}, measured).splitlines()
    assert [line.split()[0] for line in part1[1:]] == ["naive", "flat", "bucketed"]  # zero1 waits for part 2
    assert part1[1].endswith("72  right") and part1[2].endswith("1  wrong") and part1[3].endswith("4")
    assert loopback_race.prediction_table({"zero1": 2}, measured).endswith("2  right")
    assert loopback_race.prediction_table({"zero1": 1}, measured).endswith("2  wrong")


@pytest.fixture
def one_rank(tmp_path):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def test_the_count_is_of_the_calls_not_of_what_a_rung_says_it_sent(one_rank):
    import torch

    from distrinews_course.by_hand.watch import calls_per_step

    dist, said = one_rank, []

    def step(batch):  # says 1, sends 2 all-reduces and a reduce-scatter
        dist.all_reduce(batch)
        dist.all_reduce(batch, async_op=True).wait()
        dist.reduce_scatter_tensor(torch.zeros(4), batch)
        said.append(1)

    got = calls_per_step(step, [torch.ones(4), torch.ones(4)])
    assert got == {"all_reduce": 2.0, "reduce_scatter": 1.0} and len(said) == 2
    assert calls_per_step(lambda b: said.append(1), [torch.ones(4)]) == {}


# ------------------------------------------------------------------------------------------------ the dialed race


def plan(**kw):
    p = dialed.Plan(
        0.5,
        48,
        1_340_000,
        [100_000] * 6 + [540_000],
        True,
        {"forward": 0.1, "backward": 0.166, "optimizer": 0.008},
        180,
        0.250,
        0.100,
    )
    p.predicted = {"flat": p.compute_s + p.comm_s, "bucketed": p.compute_s + p.last_s}
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def dial(flat=(0.52, 0.52, 0.53, 0.52, 0.52), bucketed=(0.40, 0.39, 0.39, 0.40, 0.40), comm=0.252, foreign=0.02):
    check = {n: {"max_weight_diff": 0.0} for n in ("naive", "flat", "overlapped", "bucketed", "zero1")}
    timeline = [
        {"kind": "backward", "start": 0.1, "end": 0.27},
        {"kind": "comm_sync", "start": 0.27, "end": 0.27 + comm},
    ]
    return {
        "check": {"tiny": check},
        "timing": {
            "median_step_s": {
                "ddp": 0.40,
                "flat": sorted(flat)[2],
                "overlapped": 0.41,
                "bucketed": sorted(bucketed)[2],
            },
            "ratio_vs_ddp": {"flat": 1.3, "overlapped": 1.02, "bucketed": 0.98},
            "backward_s": {n: [0.17] * 5 for n in ("ddp", "flat", "overlapped", "bucketed")},
            "step_s": {"flat": list(flat), "bucketed": list(bucketed), "overlapped": [0.41] * 5},
            "foreign_cores": foreign,
            "timelines": {"flat": timeline},
        },
    }


def test_the_dialed_claims_hold_on_a_good_run_and_each_fails_on_its_wrong_figure():
    p = plan()
    o = dialed.outcome(dial(), p, 0.3)
    claims = dialed.claims(o, p, 1.10, 0.4, 0.5)
    assert all(c.checked and c.holds for c in claims), [c.text for c in claims if not c.holds]
    close = dialed.outcome(dial(flat=(0.42,) * 5), p, 0.3)  # flat barely slower: below the target, little saved
    bad = dialed.claims(close, p, 1.10, 0.4, 0.5)
    assert not by_text(bad, "bucketed beats flat").holds and not by_text(bad, "bucketing saves").holds
    differs = dial()
    differs["check"]["tiny"]["overlapped"]["max_weight_diff"] = 1e-7
    assert not by_text(dialed.claims(dialed.outcome(differs, p, 0.3), p, 1.10, 0.4, 0.5), "bit-identical").holds


def test_the_dialed_table_names_its_backward_cost_the_median_of_each_rounds_difference():
    d = dial()
    d["timing"]["backward_s"]["flat"] = [0.10, 0.20, 0.11, 0.19, 0.15]
    d["timing"]["backward_s"]["bucketed"] = [0.11, 0.21, 0.12, 0.20, 0.30]  # +10 ms in 4 rounds, +150 in one
    text = dialed.table(dialed.outcome(d, plan(), 0.3), plan(), {})
    assert "sending made backward +10 ms (bucketed's less flat's, the median of the rounds)" in text
    assert "+50 ms" not in text  # 200 - 150, the columns' medians: not the statistic printed


def test_a_busy_dialed_run_shows_its_speed_claims_unchecked_but_still_checks_the_bits():
    p = plan()
    claims = dialed.claims(dialed.outcome(dial(foreign=0.9), p, 0.3), p, 1.10, 0.4, 0.5)
    assert by_text(claims, "bit-identical").checked
    assert all("0.90 cores busy" in c.unchecked for c in claims if "bit-identical" not in c.text)


def test_the_scaling_point_is_the_measured_all_reduce_within_its_margin():
    p = plan()
    good = dialed.point_claim(dialed.outcome(dial(comm=0.26), p, 0.3))
    assert good.checked and good.holds and "below the 274 ms of computation (the model: below)" in good.text
    slow = dialed.point_claim(dialed.outcome(dial(comm=0.30), p, 0.3))
    assert not slow.holds  # 20% over the model's 250 ms
    missing = dialed.outcome(dial(), p, 0.3)
    missing["point"]["comm_s"] = None
    assert not dialed.point_claim(missing).checked


# ------------------------------------------------------------------------------------------------ the ZeRO section


def zres():
    contenders = {
        "ddp": {
            "peak_mb_per_rank": [85.1, 85.0],
            "calculator_mb": 81.1,
            "collectives_per_step": 1,
            "bytes_per_step": 8.0,
        },
        "zero1": {
            "peak_mb_per_rank": [82.2, 82.0],
            "calculator_mb": 73.1,
            "collectives_per_step": 2,
            "bytes_per_step": 8.0,
        },
        "zero2": {
            "peak_mb_per_rank": [70.8, 70.1],
            "calculator_mb": 65.1,
            "collectives_per_step": 2,
            "bytes_per_step": 8.0,
            "max_weight_diff_vs_fsdp2": 0.0,
        },
        "zero3": {
            "peak_mb_per_rank": [66.2, 66.0],
            "calculator_mb": 61.1,
            "collectives_per_step": 9,
            "bytes_per_step": 12.0,
            "max_weight_diff_vs_fsdp2": 0.0,
        },
        "fsdp2": {
            "peak_mb_per_rank": [67.7, 67.0],
            "calculator_mb": 68.7,
            "collectives_per_step": 9,
            "bytes_per_step": 12.0,
        },
    }
    return {"sharding": {"contenders": contenders, "steps": 20, "batch": 8, "seq": 64, "runtime_mb": 26.3}}


def test_the_zero_claims_hold_and_each_fails_on_its_wrong_figure():
    assert all(c.holds for c in zero_report.claims(zres(), blocks=3))
    for path, value, words in (
        (("zero3", "max_weight_diff_vs_fsdp2"), 1e-5, "zero3 by hand ends"),
        (("zero2", "calculator_mb"), 50.0, "zero2: measured peak"),
        (("zero3", "peak_mb_per_rank"), [75.0, 75.0], "each stage holds less"),
        (("zero3", "bytes_per_step"), 16.0, "ZeRO-3's calls come to"),
        (("zero3", "collectives_per_step"), 6, "collectives per step"),
    ):
        z = zres()
        z["sharding"]["contenders"][path[0]][path[1]] = value
        assert not by_text(zero_report.claims(z, blocks=3), words).holds, words
    assert "66.2" in zero_report.table(zres()) and "1.50x" in zero_report.table(zres())
    assert "what a ring would send, not what gloo sent" in zero_report.table(zres())
    assert not any("ZeRO-1 and ZeRO-2" in c.text for c in zero_report.claims(zres(), blocks=3))  # a formula, printed
    fsdp2_row = next(line for line in zero_report.table(zres()).splitlines() if line.strip().startswith("fsdp2"))
    assert fsdp2_row.endswith("reference")  # FSDP2 against itself is no figure: the others' reference


def test_the_peak_saving_says_its_share_of_the_peak_not_half():
    text = by_text(mixed_report.claims(mixed()), "lowers that peak").text
    assert "by 6.3 MiB at least of 67.2 (9%; the calculator predicts 3.8): far from half" in text


# ------------------------------------------------------------------------------------------------ mixed precision


def gathers(scale):
    names = [
        "gather the rest",
        "gather layer 0",
        "gather layer 1",
        "gather the rest",
        "gather layer 1",
        "gather layer 0",
    ]
    sizes = [7962896, 199936, 199936, 7962896, 199936, 199936]
    out = [{"name": n, "bytes": b // scale} for n, b in zip(names, sizes)]
    return out + [
        {"name": f"grads {n}", "bytes": b} for n, b in (("layer 1", 199936), ("layer 0", 199936), ("the rest", 7962896))
    ]


def mixed():
    return {
        "steps": 5,
        "vs_fsdp2": {"float16": 0.0, "bfloat16": 0.0},
        "collectives": {"float32": gathers(1), "float16": gathers(2)},
        "underflow": {
            "float32": {"lost_share": 0.0, "nonfinite": 0, "rel_error": 0.0},
            "float16 x1": {"lost_share": 0.033, "nonfinite": 0, "rel_error": 0.0015},
            "float16 x1024": {"lost_share": 0.00014, "nonfinite": 0, "rel_error": 0.0014},
            "float16 x65536": {"lost_share": 0.0, "nonfinite": 133732, "rel_error": None},
            "bfloat16": {"lost_share": 0.0005, "nonfinite": 0, "rel_error": 0.012},
        },
        "memory": {
            "zero3 float32": {"compute_mb_per_rank": [67.2, 66.3], "calculator_mb": 61.5},
            "zero3 float16": {"compute_mb_per_rank": [59.7, 60.0], "calculator_mb": 57.7},
            "fsdp2 float16": {"compute_mb_per_rank": [65.3, 64.8], "calculator_mb": 61.5},
        },
    }


def test_the_mixed_claims_hold_and_each_fails_on_its_wrong_figure():
    assert all(c.holds for c in mixed_report.claims(mixed()))
    m = mixed()
    m["vs_fsdp2"]["bfloat16"] = 2**-10
    assert not by_text(mixed_report.claims(m), "bit-identical").holds
    m = mixed()
    m["collectives"]["float16"][-1]["bytes"] //= 2  # the gradients reduced in float16
    assert not by_text(mixed_report.claims(m), "reduce-scatters of a step keep").holds
    m = mixed()
    m["collectives"]["float16"] = [e for e in m["collectives"]["float16"] if not e["name"].startswith("grads")]
    assert not by_text(mixed_report.claims(m), "reduce-scatters of a step keep").holds  # none seen: nothing shown
    m = mixed()
    m["memory"]["zero3 float16"]["calculator_mb"] = 45.0
    assert not by_text(mixed_report.claims(m), "zero3 float16: the peak").holds
    m = mixed()
    m["memory"]["zero3 float16"]["compute_mb_per_rank"] = [68.0, 67.5]
    assert not by_text(mixed_report.claims(m), "lowers that peak").holds
    m = mixed()  # everything cast to float16, the master and AdamW's state too: the peak halves, which it must not
    m["memory"]["zero3 float16"]["compute_mb_per_rank"] = [33.0, 33.1]
    assert not by_text(mixed_report.claims(m), "lowers that peak").holds
    m = mixed()  # a saving smaller than twice the ranks' spread is noise: shown, with the reason, not checked
    m["memory"]["zero3 float32"]["compute_mb_per_rank"] = [68.2, 66.1]
    m["memory"]["zero3 float16"]["compute_mb_per_rank"] = [64.7, 64.7]
    assert "twice the ranks' own spread" in by_text(mixed_report.claims(m), "lowers that peak").unchecked


def test_the_loss_scale_claims_hold_and_each_fails_on_its_wrong_figure():
    assert all(c.holds for c in mixed_report.loss_scale_claims(mixed()))
    m = mixed()
    m["underflow"]["float16 x1024"]["lost_share"] = 0.01  # the scale did not help
    assert not by_text(mixed_report.loss_scale_claims(m), "scaled by 1024").holds
    m = mixed()
    m["underflow"]["float16 x65536"]["nonfinite"] = 0
    assert not by_text(mixed_report.loss_scale_claims(m), "overflows").holds
    m = mixed()
    m["underflow"]["bfloat16"]["lost_share"] = 0.02
    assert not by_text(mixed_report.loss_scale_claims(m), "bfloat16 needs no scale").holds


def test_the_mixed_tables_and_figure_come_out():
    assert "float16 (param_dtype)" in mixed_report.table(mixed()) and "3.80 MiB" in mixed_report.table(mixed())
    assert "the 6 gathers of a float16 step move 0.50x float32's bytes" in mixed_report.table(mixed())
    assert "float16 x1024" in mixed_report.loss_scale_table(mixed())
    fig = mixed_report.plot(mixed())
    assert len(fig.axes) == 2


def test_the_dialed_plan_picks_the_rate_that_gives_flat_its_share_of_backward():
    """One step of the wide model alone, then the rate at which flat's one all-reduce takes 1.5x backward (rounded to
    10 Mbit/s): the prediction is scaling_limits' point on that link."""
    from distrinews_course.link import PAYLOAD_SHARE

    p = dialed.plan(0.5, 8, 1.5)
    per_s = p.mbit * 1e6 / 8 * PAYLOAD_SHARE
    assert p.comm_s == pytest.approx(4 * p.elements / per_s)
    assert p.last_s == pytest.approx(4 * p.buckets[-1] / per_s)
    assert abs(p.comm_s / p.alone["backward"] - 1.5) < 0.5 or p.mbit == 10
    assert p.embedding_last and sum(p.buckets) == p.elements
    assert p.predicted["flat"] - p.predicted["bucketed"] == pytest.approx(p.could_save)


def test_the_dialed_sweep_table_shows_each_size_and_its_rounds():
    o = dialed.outcome(dial(), plan(), 0.3)
    assert dialed.sweep_table(o) == "no bucket sweep on the dialed link"
    o["sweep"] = {"0.05": {"bucketed_step_s": 0.496, "bucketed_rounds_s": [0.4975, 0.4953], "bucketed_buckets": 26}}
    row = dialed.sweep_table(o).splitlines()[1].split()
    assert row == ["0.05", "26", "496", "498,", "495"]


def test_the_zero_picture_shards_one_more_part_per_stage():
    held = zero_report.held_mib(2**20, world=2)  # 1 Mi weights: 4 MiB each of weights and gradients, 8 of AdamW
    assert held["DDP"] == {"weights": 4.0, "gradients": 4.0, "adamw": 8.0}
    assert held["ZeRO-1"] == {"weights": 4.0, "gradients": 4.0, "adamw": 4.0}
    assert held["ZeRO-2"] == {"weights": 4.0, "gradients": 2.0, "adamw": 4.0}
    assert held["ZeRO-3"] == {"weights": 2.0, "gradients": 2.0, "adamw": 4.0}
    assert zero_report.held_mib(2**20, world=4)["ZeRO-3"]["adamw"] == 2.0


def test_the_last_bucket_is_read_against_backwards_end():
    """As the dialed race drew it: the embedding's bucket left 0.12 ms before backward ended and spent 67 ms on the
    cable, all but that after backward; a bucket launched early, under backward, shows a small share after."""
    from distrinews_course.by_hand import report

    events = [
        {"kind": "comm", "name": "bucket 5", "start": 0.1887, "end": 0.1962},
        {"kind": "comm", "name": "bucket 6", "start": 0.19060, "end": 0.25783},
        {"kind": "backward", "start": 0.0691, "end": 0.19072},
    ]
    got = report.last_bucket(events)
    assert got["left_before_ms"] == pytest.approx(0.12, abs=1e-6) and got["wire_ms"] == pytest.approx(67.23)
    assert got["after_ms"] == pytest.approx(67.11) and got["share_after"] > 0.99
    early = copy.deepcopy(events)
    early[1].update(start=0.1, end=0.2)  # launched mid-backward: 8.7 of its 100 ms after
    assert report.last_bucket(early)["share_after"] == pytest.approx(0.0928)
    late = copy.deepcopy(events)
    late[1].update(start=0.2, end=0.25)  # left after backward: all of it after, left_before negative
    assert report.last_bucket(late)["share_after"] == 1.0 and report.last_bucket(late)["left_before_ms"] < 0
