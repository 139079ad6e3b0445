"""Chapter 08's two-level cost model (distrinews_course/two_level.py): the bytes each collective puts on a node's link,
each variant's plan and step, the rate chosen from a computation, the node layout a two-level rung refuses, and the
model on paper (where HSDP's saving grows and where it vanishes). Arithmetic only: the box's measurements are the
chapter's (notebooks/08_several_nodes.ipynb) and tests/test_cluster_box.py's."""

from datetime import timedelta

import pytest
import torch.distributed as dist

from distrinews_course import two_level as tl
from distrinews_course.perf_model import Fit
from distrinews_lib.errors import UserError

M = 8 * 2**20  # bytes of gradients, as in the paper estimate
TWO_BY_TWO = tl.Layout(2, 2)


def link(variant, lay=TWO_BY_TWO, backend="gloo", blocks=(M // 4,)):
    return sum(o.link_bytes(lay, backend) for o in tl.plan(variant, list(blocks), lay))


def test_what_a_rank_sends_in_a_ring_and_in_gloo():
    assert tl.sent_factor("all_reduce", 4) == 1.5  # 2(k-1)/k: a missing factor hides at k = 2, where it is 1
    assert tl.sent_factor("all_gather", 4) == 0.75
    assert tl.sent_factor("reduce_scatter", 4, "nccl") == 0.75  # a ring's half
    assert tl.sent_factor("reduce_scatter", 4, "gloo") == 1.5  # gloo: an all-reduce, then the rank's slice
    assert tl.sent_factor("all_reduce", 1) == 0.0


def test_bytes_over_each_nodes_link_two_nodes_of_two():
    """The issue's paper estimate (1.5 M, 2.25 M, 1.0 M), and gloo's full sharding, whose reduce-scatter is an
    all-reduce: 3.0 M. Measured in the box: 1.504, 1.002 and 3.0 M (chapter 08)."""
    assert link("ddp") == pytest.approx(1.5 * M)
    assert link("hierarchical") == pytest.approx(1.0 * M)
    assert link("hsdp") == pytest.approx(1.0 * M)
    assert link("fsdp", backend="nccl") == pytest.approx(2.25 * M)
    assert link("fsdp") == pytest.approx(3.0 * M)


def test_only_the_cross_node_collectives_use_the_link():
    ops = tl.plan("hierarchical", [M // 4], TWO_BY_TWO)
    assert [(o.op, o.group) for o in ops] == [
        ("reduce_scatter", "intra"),
        ("all_reduce", "cross"),
        ("all_gather", "intra"),
    ]
    assert [o.link_bytes(TWO_BY_TWO) for o in ops] == [0.0, M, 0.0]  # g = 2 ranks each send their M/2 shard
    one_node = tl.Layout(1, 4)
    assert link("ddp", one_node) == link("fsdp", one_node) == 0.0


def test_a_world_of_one_rank_per_node_is_a_flat_ring():
    lay = tl.Layout(4, 1)
    assert link("hierarchical", lay) == pytest.approx(link("ddp", lay)) == pytest.approx(1.5 * M)


def test_blocks_are_padded_to_whole_shards():
    lay = tl.Layout(2, 2)
    odd = tl.plan("fsdp", [10], lay, element_bytes=4)
    assert {o.nbytes for o in odd} == {4 * 12}  # 10 elements padded to 12: 4 ranks of 3
    hsdp = tl.plan("hsdp", [10], lay, element_bytes=4)
    assert [o.nbytes for o in hsdp] == [40, 40, 40, 20]  # padded to 2 ranks; the shard crosses


def test_a_step_is_its_computation_and_its_collectives_one_after_another():
    intra, inter = Fit(1e-3, 1 / 1e9), Fit(2e-3, 1 / 25e6)
    compute = {"forward": 0.03, "backward": 0.06, "optimizer": 0.08}
    p = tl.predict("hierarchical", [M // 4], TWO_BY_TWO, intra, inter, compute)
    assert p.compute_s == pytest.approx(0.17)
    assert p.inter_s == pytest.approx(2e-3 + M / 25e6)
    assert p.intra_s == pytest.approx((1e-3 + M / 1e9) + (1e-3 + 0.5 * M / 1e9))  # gloo RS = AR; AG (k-1)/k
    assert p.step_s == pytest.approx(p.compute_s + p.intra_s + p.inter_s)
    h = tl.predict("hsdp", [M // 4], TWO_BY_TWO, intra, inter, compute)
    assert h.compute_s == pytest.approx(0.03 + 0.06 + 0.08 / 2)  # the optimizer on its node's shard
    f = tl.predict("fsdp", [M // 4], TWO_BY_TWO, intra, inter, compute)
    assert f.compute_s == pytest.approx(0.03 + 0.06 + 0.08 / 4)
    assert tl.saving(f, h) == pytest.approx(f.step_s - h.step_s) and tl.saving(f, h) > 0


def test_the_rate_comes_from_the_computation():
    assert tl.rate_for(M, 0.25) == pytest.approx(4 * M)  # M bytes in a quarter of a second


def test_on_paper_hsdp_saves_where_the_network_is_slow_and_not_where_computation_hides_it():
    params = 7e9  # a model that does not fit one GPU with AdamW (16 bytes a parameter), but one node of 8
    slow = tl.paper_table(params, compute_s=1.0, overlap=True)
    at = {(r["nodes"], r["gbit"]): r for r in slow}
    assert at[(2, 100)]["saved_share"] > 0.3  # 100 Gbit/s per node: FSDP's 3x crosses it, HSDP's ~1x
    assert at[(2, 100)]["saved_s"] > at[(2, 400)]["saved_s"]  # a faster network leaves less to save
    hidden = tl.paper_table(params, compute_s=100.0, overlap=True)
    assert all(r["saved_s"] == 0 for r in hidden)  # every byte hides under a long enough computation
    assert all(r["hsdp_link_bytes"] < r["fsdp_link_bytes"] for r in slow)


def test_a_world_that_does_not_split_into_nodes_is_refused(tmp_path, monkeypatch):
    from distrinews_course.by_hand.nodes import Nodes

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1, timeout=timedelta(seconds=20)
    )
    try:
        with pytest.raises(UserError, match="1 ranks do not split into nodes of 2"):
            Nodes(ranks_per_node=2)
        with pytest.raises(UserError, match="the node layout is unknown"):
            Nodes()
        one = Nodes(ranks_per_node=1)
        assert (one.n, one.per_node, one.node, one.local) == (1, 1, 0, 0)
    finally:
        dist.destroy_process_group()


def test_a_prediction_moves_to_another_link_rate():
    """The chapter's curves: a step on a link of another rate keeps its computation and its collectives inside the
    node, and pays each collective across at the link's fit scaled to the rate."""
    intra, inter = Fit(1e-3, 1 / 1e9), Fit(2e-3, 1 / 20e6)
    p = tl.predict("hsdp", [M // 4, M // 8], TWO_BY_TWO, intra, inter, 0.1).as_dict()
    assert p["inter_ops"] == 2  # one all-reduce across per block
    assert tl.step_at(p, inter) == pytest.approx(p["step_s"])
    faster = tl.link_fit(inter.alpha_s, inter.bandwidth, 400, 100)
    assert faster.alpha_s == inter.alpha_s and faster.bandwidth == pytest.approx(4 * inter.bandwidth)
    at_400 = tl.step_at(p, faster)
    assert at_400 == pytest.approx(p["compute_s"] + p["intra_s"] + 2 * 2e-3 + p["link_bytes"] / 80e6)
    ddp = tl.predict("ddp", [M // 4], TWO_BY_TWO, intra, inter, 0.1).as_dict()
    assert ddp["inter_ops"] == 1 and ddp["link_bytes"] == pytest.approx(1.5 * M)


def test_the_paper_table_prints_every_point():
    text = tl.paper_table_text(7e9, 0.435)
    lines = text.splitlines()
    assert len(lines) == 4 and "100 Gbit/s" in lines[0] and "400 Gbit/s" in lines[0]
    assert lines[1].split()[:2] == ["2", "16"] and lines[-1].split()[:2] == ["64", "512"]


def test_the_recorded_run_has_what_the_chapter_reads_without_a_box():
    """Where no box can be built (Kaggle), chapter 08 shows benchmarks/two_level_<machine>.json: every figure its cells
    print must be there, from a real run (its provenance says which)."""
    from distrinews_course.by_hand import report_two_level as two

    rec = two.recorded()
    assert rec is not None, "no benchmarks/two_level_*.json: record one (race_two_level.py --benchmark)"
    assert rec["provenance"]["git_commit"] and rec["link_mbit"] > 0 and rec["grad_bytes"] > 0
    assert set(rec["contenders"]) == set(two.NAMES) - {"zero3"}
    for name, c in rec["contenders"].items():
        assert c["step_s"]["measured"] > 0 and len(c["step_s"]["rounds"]) == rec["rounds"]
        assert len(c["link_bytes_per_step"]["measured_per_node"]) == rec["layout"]["nodes"]
    assert {"zero3", "hsdp", "fsdp2"} <= set(rec["peak_mb_per_rank"]) and rec["correct"]["hsdp vs fsdp2_hsdp"] <= 1e-6
    text = two.table(rec)
    assert len(text.splitlines()) == 2 + len(rec["contenders"])  # a header, a row each, what M is
    from distrinews_course.by_hand.two_level_claims import per_round_saving, sweep_points

    saved, rounds = per_round_saving(rec, "fsdp2", "hsdp")
    assert len(rounds) == rec["rounds"] and saved > 0
    pts = sweep_points(rec)
    assert len(pts) >= 3 and rec["link_mbit"] in pts, "a record without the sweep of rates: record anew"
    assert set(rec["terms"]) == set(rec["contenders"]) and all(
        set(p) == {"ddp", "hierarchical", "fsdp2", "hsdp"} for p in pts.values()
    )
    assert "calibration_foreign_cores" in rec, "a record from before the calibration's load was counted: record anew"


def test_the_chapter_shows_the_recorded_run_where_no_box_can_be_built(tmp_path, monkeypatch, capsys):
    """The chapter's two-level cells, from the launch to the paper table, run as a kernel would with TWO_LEVEL = False
    (or no namespaces): they show the recorded run, its tables and its figure, and check nothing of it."""
    import json
    import re

    import matplotlib

    from distrinews_course import ROOT

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = json.loads((ROOT / "notebooks" / "08_several_nodes.ipynb").read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    first = next(i for i, s in enumerate(code) if "race_or_recorded" in s)
    last = next(i for i, s in enumerate(code) if "paper_table_text" in s)
    monkeypatch.chdir(tmp_path)  # the cells save their figure under outputs/
    kernel = {"BOX2_OK": False, "BOX2_WHY": "TWO_LEVEL = False", "TIMEOUT_S": 1, "COMM_OVER_STEP": 6.0}
    kernel.update(QUIET_CORES=0.3, PREDICT_LINK_BYTES={"ddp": 1.5, "hsdp": 3.0})
    from distrinews_course.by_hand import report_two_level
    from distrinews_course.claims import settle
    from distrinews_course.notebook import check

    kernel.update(check=check, settle=settle, two_level=report_two_level, plt=plt)
    for source in code[first : last + 1]:
        exec(source, kernel)
    out = capsys.readouterr().out
    assert "no box here (TWO_LEVEL = False): the recorded run instead" in out
    assert not re.search(r"^(checked|NOTE):", out, re.M)
    assert "your ddp: 1.5 M, counted 1.50 M: right" in out and "your hsdp: 3.0 M" in out and "wrong" in out
    assert "peak MiB/rank" in out and "bytes/B_link" in out and (tmp_path / "outputs/two_level/sweep.png").is_file()


def test_chapter_08s_hsdp_cell_is_the_skeletons_two_functions(tmp_path):
    """Exercise 5's cell holds the skeleton's node_group and replicate, word for word, still blank; the checker takes
    the file it writes as 'not attempted' without a launch."""
    import nbformat

    from distrinews_course import ROOT
    from distrinews_course.by_hand import exercises

    nb = nbformat.read(ROOT / "notebooks" / "08_several_nodes.ipynb", as_version=4)
    cell = next(c.source for c in nb.cells if c.source.startswith("%%writefile outputs/two_level/ex_hsdp.py"))
    skeleton = exercises.skeleton("hsdp")
    for head in ("def node_group(dp):", "def replicate(dp) -> int:"):
        start = skeleton.index(head)
        end = skeleton.find("\n\n\n", start)
        assert skeleton[start : end if end > 0 else None].strip() in cell, head
    written = tmp_path / "ex_hsdp.py"
    written.write_text(cell.split("\n", 1)[1] + "\n")
    assert exercises.stubs(written) == ["node_group", "replicate"]
    v = exercises.check_exercises([("hsdp", written, "hsdp")], tmp_path)["hsdp"]
    assert v["ok"] is None and "not attempted yet" in v["message"]


def test_the_dialed_rate_is_held_between_its_floor_and_its_ceiling():
    from distrinews_course.by_hand import race_two_level as race

    # a busy machine's slow computation asks for a slow link: the floor keeps the race's time bounded
    assert race.dialed_mbit(30) == race.MIN_MBIT
    assert race.dialed_mbit(130) == 130
    assert race.dialed_mbit(600) == race.MAX_MBIT
