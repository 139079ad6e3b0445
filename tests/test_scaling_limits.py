"""distrinews_course/scaling_limits.py: CS336's cost question (how many devices DDP, ZeRO-3 and HSDP can use before a
step's communication exceeds its computation), its arithmetic against the ring's formulas worked by hand, its
settings against their published sources, and its clear errors."""

import pytest

from distrinews_course import cluster_model, memory
from distrinews_course import scaling_limits as sl

M = 1_000_000  # elements of a one-block model in the hand-worked cases


def flat(per_node=1, intra=(1e-5, 1e-9), inter=None, backend="nccl", text_s=1e-3):
    return sl.Setting("test", per_node, sl.Level(*intra), sl.Level(*(inter or intra)), text_s, backend)


def test_an_all_reduce_is_the_rings_2_n_minus_1_steps_and_2_n_minus_1_over_n_of_the_bytes():
    s = flat(per_node=8)
    for n in (2, 4, 8):
        want = 2 * (n - 1) * 1e-5 + 2 * (n - 1) / n * 4 * M * 1e-9
        assert sl.comm_seconds("ddp", n, s, [M]) == pytest.approx(want)
    assert sl.comm_seconds("ddp", 1, s, [M]) == 0.0


def test_zero3_in_mixed_precision_sends_ddps_bytes_and_in_fp32_one_and_a_half_times():
    """Two gathers of 2-byte weights and a reduce-scatter of 4-byte gradients (a ring's half each, on NCCL): an fp32
    all-reduce's bytes; with 4-byte weights 3 halves of it. On gloo the reduce-scatter is a whole all-reduce."""
    s = flat(per_node=4, intra=(0.0, 1e-9))
    ddp = sl.comm_seconds("ddp", 4, s, [M])
    assert sl.comm_seconds("zero3", 4, s, [M]) == pytest.approx(ddp)
    assert sl.comm_seconds("zero3", 4, s, [M], param_bytes=4) == pytest.approx(1.5 * ddp)
    gloo = flat(per_node=4, intra=(0.0, 1e-9), backend="gloo")
    assert sl.comm_seconds("zero3", 4, gloo, [M]) == pytest.approx(1.5 * ddp)


def test_hsdp_inside_one_node_is_zero3_and_across_nodes_adds_the_shards_all_reduce():
    s = flat(per_node=4, intra=(0.0, 1e-9), inter=(0.0, 1e-8))
    assert sl.comm_seconds("hsdp", 4, s, [M]) == sl.comm_seconds("zero3", 4, s, [M])
    # 2 nodes x 4: inside, ZeRO-3 over 4; across, 4 rings (one per local rank) of a quarter each on the node's link
    inside = sl.comm_seconds("zero3", 4, s, [M])
    across = 4 * (2 * (2 - 1) / 2) * (4 * M / 4) * 1e-8
    assert sl.comm_seconds("hsdp", 8, s, [M]) == pytest.approx(inside + across)


def test_a_ring_over_every_device_goes_at_its_slowest_edge():
    """Past one node, one edge of the ring leaves each node: the node's link carries what one device sends, and the
    ring is as slow as the slower of that link and the edges inside the nodes."""
    slow_inside = flat(per_node=2, intra=(0.0, 4e-9), inter=(0.0, 1e-9))
    slow_between = flat(per_node=2, intra=(0.0, 1e-9), inter=(0.0, 4e-9))
    sent = 2 * 3 / 4 * 4 * M
    assert sl.comm_seconds("ddp", 4, slow_inside, [M]) == pytest.approx(sent * 4e-9)
    assert sl.comm_seconds("ddp", 4, slow_between, [M]) == pytest.approx(sent * 4e-9)


def test_n_max_is_the_last_n_where_communication_fits_in_computation():
    """4 MB of gradients at 1 GB/s: a ring all-reduce takes 4 ms at 2 devices, 6 at 4, 7 at 8; a batch of 32 texts of
    1 ms each computes 16, 8 and 4 ms per device: communication fits up to 4 devices, not at 8."""
    s = flat(per_node=64, intra=(0.0, 1e-9), text_s=1e-3)
    lim = sl.limit("ddp", s, 32, params=[M])
    assert [r["n"] for r in lim["rows"]] == [1, 2, 4, 8, 16, 32]
    assert [round(1000 * r["comm_s"], 6) for r in lim["rows"][1:4]] == [4.0, 6.0, 7.0]
    assert [round(1000 * r["compute_s"], 6) for r in lim["rows"][1:4]] == [16.0, 8.0, 4.0]
    assert lim["n_max"] == 4
    assert sl.limit("ddp", flat(text_s=1e-9), 64, params=[M])["n_max"] == 1  # not even 2 devices
    assert sl.limit("ddp", s, 4096, params=[M])["n_max"] > 4  # a larger batch keeps more devices busy


def test_the_texts_that_hide_the_communication_are_its_time_over_a_texts():
    s = flat(per_node=8, text_s=2e-3)
    assert sl.texts_to_hide("ddp", 8, s, params=[M]) == pytest.approx(sl.comm_seconds("ddp", 8, s, [M]) / 2e-3)


def test_the_settings_are_their_sources():
    k = cluster_model.KAGGLE_NANOGPT
    kaggle = sl.SETTINGS["kaggle_t4"]
    # the measured all-reduce of the Kaggle notebook's gradients, at 2 devices, back from the fitted level
    assert kaggle.intra.seconds(sl.steps("all_reduce", 2), k["params"] * 4) == pytest.approx(k["comm_ms"] / 1000)
    dgx = sl.SETTINGS["dgx1"]
    assert dgx.per_node == 8 and dgx.intra.beta_s_per_byte == pytest.approx(1 / 25e9)  # NVLink 2
    assert dgx.inter.beta_s_per_byte == pytest.approx(1 / 50e9)  # 4x InfiniBand EDR
    shape = memory.SHAPES["distilbert-base"]
    assert sum(sl.blocks()) == shape.n_params and len(sl.blocks()) == shape.layers + 1
    per_text = 6 * (shape.n_params - (shape.vocab + shape.positions) * shape.hidden) * 128
    assert sl.text_flops() == pytest.approx(per_text + 12 * shape.layers * shape.hidden * 128**2)
    assert sl.text_seconds("T4", 0.5) == pytest.approx(sl.text_flops() / (65e12 * 0.5))


def test_the_table_holds_every_strategy_at_every_setting():
    rows = sl.table(texts=(64, 1024))
    assert {(r["setting"], r["strategy"]) for r in rows} == {(k, s) for k in sl.SETTINGS for s in sl.STRATEGIES}
    for r in rows:
        assert 1 <= r["n_max"][64] <= r["n_max"][1024] <= 1024
        assert r["texts_per_device"] > 0


def test_the_boxs_point_is_the_dialed_payload_rate():
    from distrinews_course.link import PAYLOAD_SHARE

    p = sl.point("ddp", 2, sl.box(180), [M], step_s=0.3, texts=48)
    assert p["comm_s"] == pytest.approx(4 * M / (180e6 / 8 * PAYLOAD_SHARE))  # 2 ranks: the ring sends the buffer
    assert p["compute_s"] == 0.3


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown strategy 'tp'"):
        sl.comm_seconds("tp", 2, flat(), [M])
    with pytest.raises(ValueError, match="unknown GPU 'A999'"):
        sl.text_seconds("A999")
    with pytest.raises(ValueError, match=r"mfu 1.5: a share of the peak"):
        sl.text_seconds("T4", 1.5)
    with pytest.raises(ValueError, match="6 devices do not fill nodes of 4"):
        sl.comm_seconds("ddp", 6, flat(per_node=4), [M])
    with pytest.raises(ValueError, match="a global batch of 0 texts"):
        sl.limit("ddp", flat(), 0)
    with pytest.raises(ValueError, match="a link of 0 Mbit/s"):
        sl.box(0)


def test_the_table_names_its_two_columns_at_n_devices_and_kaggles_line_gives_its_own_figures():
    rows = sl.table(texts=(64, 1024), n=4)
    text = sl.table_text(rows, n=4)
    assert "at 4 devices:" in text and "texts/device to hide it" in text and "1024 texts" in text
    assert f"{rows[0]['texts_per_device']:>23.0f}" in text.splitlines()[2]
    s = sl.SETTINGS["kaggle_t4"]
    need = sl.texts_to_hide("ddp", 2, s)
    line = sl.kaggle_line("ddp", 64)
    assert f"which {need:.0f} texts per T4 would hide" in line and "gives each T4 32 (64 a step)" in line
    assert f"{sl.comm_seconds('ddp', 2, s) / (32 * s.text_s):.1f}x as long" in line
    assert line.startswith("ESTIMATE (the link's rate from one 16 MB all-reduce in a public Kaggle notebook")
    assert (
        f"DistilBERT's {sl.MODEL.n_params * 4 / 1e6:.0f} MB of gradients; the computation at 40% of a T4's fp16" in line
    )
    assert "at 50% of" in sl.kaggle_line("ddp", 64, mfu=0.5)
    assert sl.kaggle_line("ddp", int(2 * need) + 2).endswith("enough to hide it")
