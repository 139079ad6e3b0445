"""What chapter 08 decides about its two-level race (distrinews_course/by_hand/two_level_claims.py), its figure and its
node-groups demo (distrinews_course/node_groups.py): on the recorded run (benchmarks/two_level_*.json, a real launch)
every claim holds, and each wrong figure planted in it makes the claim that reads it fail."""

import copy

import pytest

from distrinews_course import node_groups
from distrinews_course.by_hand import report_two_level as two
from distrinews_course.by_hand import two_level_claims as claims

QUIET = 0.3


@pytest.fixture(scope="module")
def recorded():
    rec = two.recorded()
    assert rec is not None, "no benchmarks/two_level_*.json: record one (race_two_level.py --benchmark)"
    return rec


@pytest.fixture
def rec(recorded):
    r = copy.deepcopy(recorded)
    r["foreign_cores"] = r["calibration_foreign_cores"] = 0.01  # quiet, so that every timed claim is checked
    return r


def failing(cs) -> list[str]:
    return [c.text for c in cs if c.checked and not c.holds]


def test_the_recorded_run_holds_every_claim(rec):
    for cs in (claims.correct(rec), claims.link_bytes(rec), claims.steps(rec, QUIET), claims.memory(rec)):
        assert cs and not failing(cs) and all(c.checked for c in cs)
    sweep = claims.sweep(rec, QUIET)
    assert len(sweep) == len(claims.sweep_points(rec)) and not failing(sweep)  # each faster rate, HSDP's saving


def test_a_busy_machine_shows_the_timed_claims_with_the_reason(rec):
    rec["calibration_foreign_cores"] = 0.9
    for cs in (claims.steps(rec, QUIET), claims.sweep(rec, QUIET)):
        assert all(not c.checked and "0.90 cores busy during the calibration" in c.unchecked for c in cs)
    assert all(c.checked for c in claims.link_bytes(rec) + claims.correct(rec) + claims.memory(rec))
    assert claims.quiet({**rec, "foreign_cores": None}, QUIET)[0] is False  # no reading is not a quiet machine


def test_weights_apart_fail_correctness(rec):
    rec["correct"]["hsdp vs fsdp2_hsdp"] = 3e-6
    assert failing(claims.correct(rec)) == [next(c.text for c in claims.correct(rec) if "FSDP2's HSDP" in c.text)]
    rec["correct"]["hierarchical vs ddp"] = 0.0  # bit for bit: the same sums in DDP's order, still correct
    assert not any("hierarchical ends" in t for t in failing(claims.correct(rec)))
    assert any("bit for bit on this run" in c.text for c in claims.correct(rec))
    rec["correct"]["hierarchical vs ddp"] = 2e-6
    assert any("hierarchical ends" in t for t in failing(claims.correct(rec)))


@pytest.mark.parametrize("scale, fails", [(1 + 2e-7, False), (4.0, True), (2.0, True), (0.25, True)])
def test_a_gradient_not_divided_by_the_world_fails_correctness(rec, scale, fails):
    # the step-1 norms a live race records (the recorded benchmark predates them): 4x = no divide, 2x = by a node only
    rec["grad_norm"] = {n: 0.8125 for n in ("ddp", "flat", "hierarchical", "hsdp", "fsdp2_hsdp", "fsdp2")}
    rec["grad_norm"]["hierarchical"] *= scale
    bad = [t for t in failing(claims.correct(rec)) if "gradient norm" in t]
    assert bad == ([next(c.text for c in claims.correct(rec) if c.text.startswith("hierarchical's"))] if fails else [])
    assert f"hierarchical             |gradient| at step 1 {0.8125 * scale:.6g} ({scale - 1:+.1e} from ddp's)" in (
        claims.gradient_line(rec)
    )


def test_a_record_without_gradient_norms_shows_no_gradient_line(rec):
    rec.pop("grad_norm", None)
    assert claims.gradient_line(rec) == "" and not [c for c in claims.correct(rec) if "gradient norm" in c.text]


def test_bytes_off_the_model_fail(rec):
    c = rec["contenders"]["hierarchical"]["link_bytes_per_step"]
    c["measured_per_node"][1] *= 1.08
    assert [t.split(":")[0] for t in failing(claims.link_bytes(rec))] == ["hierarchical"]


def test_a_mesh_that_shards_across_the_nodes_fails(rec):
    full = rec["contenders"]["fsdp2"]["link_bytes_per_step"]
    rec["contenders"]["fsdp2_hsdp"]["link_bytes_per_step"] = copy.deepcopy(full)
    assert any("the mesh's dimension 0" in t for t in failing(claims.link_bytes(rec)))


def test_a_step_off_the_model_fails(rec):
    s = rec["contenders"]["fsdp2"]["step_s"]
    s["measured"] = 1.3 * s["predicted"]
    s["rounds"] = [s["measured"]] * len(s["rounds"])
    assert any(t.startswith("fsdp2:") for t in failing(claims.steps(rec, QUIET)))


def test_a_saving_short_of_the_model_fails(rec):
    flat, hier = rec["contenders"]["flat"]["step_s"], rec["contenders"]["hierarchical"]["step_s"]
    hier["rounds"] = [f - 0.2 * (flat["predicted"] - hier["predicted"]) for f in flat["rounds"]]
    assert any(t.startswith("hierarchical beats the flat rung") for t in failing(claims.steps(rec, QUIET)))


def test_rounds_that_moved_too_much_are_shown_not_checked(rec):
    s = rec["contenders"]["ddp"]["step_s"]
    s["rounds"] = [s["measured"] * f for f in (0.7, 1.0, 1.3)][: len(s["rounds"])]
    per_step = [c for c in claims.steps(rec, QUIET) if c.text.split(":")[0] in rec["contenders"]]
    assert all(not c.checked and "moved by" in c.unchecked for c in per_step)


def test_a_sweep_point_off_the_curve_fails(rec):
    pts = claims.sweep_points(rec)
    fast = max(pts)
    key = next(k for k in rec["sweep"] if int(k) == fast)
    p = rec["sweep"][key]["hsdp"]
    p["measured"] = 1.5 * p["predicted"]
    p["rounds"] = [p["measured"]] * len(p["rounds"])
    assert any(t.startswith(f"at {fast} Mbit/s") for t in failing(claims.sweep(rec, QUIET)))


def test_a_saving_that_grows_with_the_rate_fails_the_sweep(rec):
    pts = claims.sweep_points(rec)
    fast = max(pts)
    key = next(k for k in rec["sweep"] if int(k) == fast)
    at = rec["sweep"][key]
    at["hsdp"]["rounds"] = [f - 10.0 for f in at["fsdp2"]["rounds"]]  # saves 10 s a step on the fastest link
    assert any(t.startswith("HSDP's saving over full sharding shrinks") for t in failing(claims.sweep(rec, QUIET)))


def test_memory_off_the_calculator_fails(rec):
    rec["peak_mb_per_rank"]["hsdp"]["measured"] = 1.2 * rec["peak_mb_per_rank"]["hsdp"]["calculator"]
    assert any(t.startswith("hsdp: peak") for t in failing(claims.memory(rec)))
    rec["peak_mb_per_rank"]["hsdp"]["measured"] = rec["peak_mb_per_rank"]["ddp"]["measured"] + 1
    assert any(t.startswith("HSDP by hand holds more than ZeRO-3 by hand") for t in failing(claims.memory(rec)))


def test_the_learners_byte_predictions_are_graded(rec):
    lines = claims.grade_link_bytes({"ddp": 1.5, "hierarchical": 1.5, "fsdp2": None, "hsdp": 1.0}, rec)
    assert [l.rsplit(": ", 1)[1] for l in lines] == ["right", "wrong", "right"]
    none = claims.grade_link_bytes(dict.fromkeys(("ddp", "hierarchical", "fsdp2", "hsdp")), rec)
    assert len(none) == 1 and "not attempted yet" in none[0]


def test_the_word_embeddings_share_is_computed_from_the_model(rec):
    from distrinews_course.by_hand import report_two_level as two

    rec = {**rec, "model": "tiny", "grad_bytes": 4 * 2_090_692}  # the tiny model: 30,522 x 64 of 2,090,692
    assert round(100 * two.embedding_share(rec)) == 93
    assert "93% of the race's 2,090,692 parameters" in two.embedding_line(rec)
    assert round(100 * two.embedding_share({**rec, "grad_bytes": 8 * 2_090_692})) == 47  # another M: another share
    assert round(100 * two.embedding_share(rec, dim=32)) == 47  # another width: another share
    assert two.embedding_share({**rec, "model": "minilm"}) is None


def test_the_tables_and_the_figure(rec, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from distrinews_course.by_hand import two_level_figures as figs

    terms = two.terms_table(rec).splitlines()
    assert len(terms) == 1 + len(rec["terms"]) and "bytes/B_link" in terms[0]
    for name, t in rec["terms"].items():  # the terms add up to the step the table says
        row = next(l for l in terms if l.startswith(two.NAMES[name]))
        nums = [float(x) for x in row[len(two.NAMES[name]) :].split()]
        assert sum(nums[:4]) == pytest.approx(nums[4], abs=2.5)
        assert figs.curve(rec, name, [rec["link_mbit"]])[0] == pytest.approx(t["step_s"], rel=1e-9)
    assert len(two.memory_table(rec).splitlines()) == 1 + len(rec["peak_mb_per_rank"])
    fig = figs.step_vs_rate(rec, save_to=tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 10_000 and len(fig.axes) == 2
    slow, fast = figs.curve(rec, "ddp", [40, 640])
    assert slow > fast  # a slower link, a longer step
    fig = figs.link_bytes_bars(rec, save_to=tmp_path / "bytes.png")
    assert (tmp_path / "bytes.png").stat().st_size > 10_000
    drawn = sorted(round(p.get_width(), 6) for p in fig.axes[0].patches)  # each bar is the record's bytes / M
    m, want = rec["grad_bytes"], []
    for c in rec["contenders"].values():
        want += [
            c["link_bytes_per_step"]["predicted"] / m,
            *(x / m for x in c["link_bytes_per_step"]["measured_per_node"]),
        ]
    assert drawn == sorted(round(w, 6) for w in want)
    fig = figs.memory_bars(rec, save_to=tmp_path / "memory.png")
    assert (tmp_path / "memory.png").stat().st_size > 10_000
    drawn = sorted(round(p.get_width(), 6) for p in fig.axes[0].patches)  # each bar is a peak of the record
    mem = rec["peak_mb_per_rank"].values()
    assert drawn == sorted(round(x, 6) for m in mem for x in (m["measured"], m["calculator"]))


def test_the_break_even_rate_is_where_the_models_saving_changes_sign(rec):
    """Hierarchical's saving over DDP crosses zero inside the drawn rates (on this box it pays only on slow links);
    HSDP's over full sharding does not. A design whose computation grows by a second never pays, and says so."""
    from distrinews_course.by_hand import two_level_figures as figs

    edge = figs.break_even(rec, "ddp", "hierarchical")
    assert edge is not None and figs.rates_to_draw(rec)[0] < edge < figs.rates_to_draw(rec)[-1]
    assert figs.saving(rec, "ddp", "hierarchical", 0.9 * edge) > 0 > figs.saving(rec, "ddp", "hierarchical", 1.1 * edge)
    assert figs.break_even(rec, "fsdp2", "hsdp") is None
    line = figs.pays_line(rec)
    assert f"pays on links slower than {edge:.0f} Mbit/s" in line and "HSDP over full sharding saves" in line
    rec["terms"]["hsdp"]["compute_s"] += 10.0  # a wrong computation: HSDP slower at every rate
    assert figs.break_even(rec, "fsdp2", "hsdp") is None and "HSDP over full sharding never pays" in figs.pays_line(rec)


def test_the_link_rate_line_is_the_fit_beside_the_dialed_rate(rec):
    rec = copy.deepcopy(rec)
    rec["link_mbit"], rec["fits"]["inter"] = 160, {"alpha_s": 0.0, "bytes_per_s": 18.7e6, "smallest_bytes": 2**20}
    line = two.link_rate_line(rec)
    assert "18.7 MB/s on messages of 1.0 MiB and more" in line and "94% of 160 Mbit/s / 8 (20.0 MB/s)" in line
    assert "above what the wire carries" not in line
    rec["fits"]["inter"]["bytes_per_s"] = 20.1e6  # a fit faster than the wire is said to be off, not passed as the link
    assert "101% of 160" in two.link_rate_line(rec) and "above what the wire carries" in two.link_rate_line(rec)


def test_the_dialed_links_fit_times_only_messages_of_4x_its_burst():
    from distrinews_course.by_hand.race_two_level import rate_bound_sizes

    link_bytes = lambda size: 2 * size  # noqa: E731 - 2 nodes x 2 ranks: a node's link carries its 2 ranks' bytes
    sizes = [2**18, 2**19, 2**20, 2**21]
    assert rate_bound_sizes(sizes, link_bytes, 160e6) == [2**19, 2**20, 2**21]  # 256 KiB burst: 1 MiB and more
    assert rate_bound_sizes(sizes, link_bytes, 4e9) == sizes  # a 1 MB burst leaves one size: all of them, to fit two


def test_an_excerpt_is_the_functions_source():
    text = two.excerpt("scripts/by_hand/skeletons/hsdp.py", "HSDP.sync_gradients")
    assert text.startswith("    def sync_gradients(self):") and "replicate(self)" in text
    with pytest.raises(ValueError, match="has no HSDP.nothing"):
        two.excerpt("scripts/by_hand/skeletons/hsdp.py", "HSDP.nothing")


def node_group_rows():
    """What scripts/multinode/node_groups.py prints on 2 nodes x 2 ranks: 8 MiB on each link for the groups across."""
    rows = []
    for rank in range(4):
        node, local = divmod(rank, 2)
        mine, across = [2 * node, 2 * node + 1], [local, local + 2]
        rows.append(
            {
                "rank": rank,
                "node": node,
                "local": local,
                "within": {"ranks": mine, "sum": float(sum(mine)), "link_mib": 0.001},
                "across": {"ranks": across, "sum": float(sum(across)), "link_mib": 8.02},
            }
        )
    return rows


def test_rows_that_share_a_line_are_each_read():
    """The four ranks print into one pipe: two rows can land on one line, after another rank's text."""
    import json

    rows = [{"rank": r, "node": r // 2} for r in range(4)]
    text = "\n".join(
        [
            "[node0] starting",
            "[groups] " + json.dumps(rows[2]) + "[groups] " + json.dumps(rows[0]),
            "noise [groups] " + json.dumps(rows[3]),
            "[groups] " + json.dumps(rows[1]),
        ]
    )
    assert node_groups.rows_of(text) == rows and node_groups.rows_of("no rows here") == []
    cut = text.replace(json.dumps(rows[3]), json.dumps(rows[3])[:20])  # a row cut short: read as missing, and said
    assert [r["rank"] for r in node_groups.rows_of(cut)] == [0, 1, 2]
    assert "printed its groups (got ranks [0, 1, 2])" in node_groups.claims(node_groups.rows_of(cut))[0].text


def test_the_node_groups_as_numbered_pass():
    rows = node_group_rows()
    cs = node_groups.claims(rows)
    assert len(cs) == 3 and all(c.holds for c in cs)
    assert node_groups.across_mib(2, 2) == pytest.approx(8.0)  # 2 ranks x a ring's 2(N-1)/N of 4 MiB
    assert len(node_groups.table(rows).splitlines()) == 5


@pytest.mark.parametrize(
    "plant, failing",
    [
        (lambda rows: rows[1]["within"].update(ranks=[0, 2], sum=2.0), 0),  # a node group across the nodes
        (lambda rows: rows[3]["across"].update(sum=6.0), 0),  # a sum over the wrong ranks
        (lambda rows: rows[0]["within"].update(link_mib=2.0), 1),  # the node's all-reduce went over the link
        (lambda rows: rows[2]["across"].update(link_mib=4.0), 2),  # half the ring's bytes
    ],
)
def test_each_wrong_figure_fails_its_groups_claim(plant, failing):
    rows = node_group_rows()
    plant(rows)
    assert [i for i, c in enumerate(node_groups.claims(rows)) if not c.holds] == [failing]
    assert not node_groups.claims([])[0].holds


def _carried(mib):
    """The node-groups claim on the bytes across, with rank 2's link at `mib` MiB."""
    rows = node_group_rows()
    rows[2]["across"]["link_mib"] = mib
    return node_groups.claims(rows)[2]


@pytest.mark.parametrize("mib", [8.02, 8.15, 8.96])  # a quiet box; CI's load (a run that once failed at 5%)
def test_the_payload_with_its_headers_passes(mib):
    """The link carries the ring's payload plus the packets' headers and ACKs (more of them under load)."""
    c = _carried(mib)
    assert c.holds and "headers and ACKs" in c.text
    assert "4 MiB (4.00 MiB), 8.00 MiB a node" in c.text  # each rank sent half the node's bytes, not all of them


@pytest.mark.parametrize(
    "mib",
    [
        7.5,  # less than the ring's payload: a rank sent only part of its message
        10.4,  # 30% more than the ring needs: over a quarter, more than twice the headers of any run seen (12%)
        12.0,  # half as much again as the ring needs
        16.0,  # twice the ring's bytes
    ],
)
def test_a_wrong_byte_count_fails(mib):
    assert not _carried(mib).holds


def test_the_measured_crossover_is_stated_from_the_signs_the_rounds_agree_on(rec):
    """The line beside the model's break-even says where the box measured hierarchical stop paying: a saving whose
    rounds disagree on its sign is called even, never a gain or a loss. It is an observation: the sweep's claims leave
    hierarchical's saving out (a one-sided "does not grow" could not fail for a plausible bug)."""
    pts = claims.sweep_points(rec)
    rates = list(pts)

    def set_rounds(mbit, saved_ms):  # hierarchical's rounds = DDP's less each saving
        at = rec["sweep"][str(mbit)]
        at["hierarchical"]["rounds"] = [d - s / 1000 for d, s in zip(at["ddp"]["rounds"], saved_ms)]

    set_rounds(rates[0], [150, 160])
    set_rounds(rates[1], [30, 28])
    set_rounds(rates[2], [-25, -20])
    line = claims.crossover_line(rec, "hierarchical over DDP", "ddp", "hierarchical")
    assert f"stops paying between {rates[1]} and {rates[2]} Mbit/s" in line
    set_rounds(rates[2], [-25, 10])  # the rounds disagree on the sign: even, not a loss
    line = claims.crossover_line(rec, "hierarchical over DDP", "ddp", "hierarchical")
    assert f"pays up to {rates[1]} Mbit/s and breaks even at {rates[2]}" in line
    assert not failing(claims.sweep(rec, QUIET))
    set_rounds(rates[2], [60, 70])
    assert "paid at every rate measured" in claims.crossover_line(rec, "h", "ddp", "hierarchical")
    set_rounds(rates[0], [150, -140])
    set_rounds(rates[1], [-30, -28])
    set_rounds(rates[2], [-25, -20])
    assert "it paid clearly at none of the rates measured" in claims.crossover_line(rec, "h", "ddp", "hierarchical")
    assert not any("hierarchical's saving" in c.text for c in claims.sweep(rec, QUIET))  # shown, not checked


def test_the_race_log_holds_back_the_bytes_per_link():
    """Chapter 08 prints the race's predictions before it grades PREDICT_LINK_BYTES: the bytes per link are cut."""
    line = "predicted hierarchical:    564 ms/step,   7.98 MiB/step per link"
    assert two.without_link_bytes(line) == "predicted hierarchical:    564 ms/step"
    assert two.without_link_bytes("fit: inside a node alpha 2.14 ms") == "fit: inside a node alpha 2.14 ms"
    capped = (
        "step with no communication: 64 ms; every link dialed to 160 Mbit/s (held to 100-160: 6x the step asks 180)"
    )
    assert two.without_link_bytes(capped) == "step with no communication: 64 ms; every link dialed to 160 Mbit/s"


def test_the_measured_saving_names_its_statistic_beside_the_medians_difference(rec):
    """The sweep's saving is the median of each round's saving; the step table invites the difference of the median
    steps, which differs: the line names its statistic and prints the other at the first rate, from the table's ms."""
    pts = claims.sweep_points(rec)
    first = next(iter(pts))
    at = pts[first]
    at["ddp"]["rounds"] = [0.75, 0.80, 0.70]  # median 0.75
    at["hierarchical"]["rounds"] = [0.58, 0.60, 0.59]  # per round 170, 200, 110: median 170; medians 0.75 - 0.59
    at["ddp"]["measured"], at["hierarchical"]["measured"] = 0.75, 0.59
    line = claims.crossover_line(rec, "hierarchical over DDP", "ddp", "hierarchical")
    assert line.startswith("measured, the median of each round's saving: hierarchical over DDP saved +170 ms")
    assert f"+170 ms at {first} Mbit/s (its median steps differ by +160)" in line
