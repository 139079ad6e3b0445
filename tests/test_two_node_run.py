"""Chapter 08's reading of its two-node run (distrinews_course/two_node_run.py), on a real run's log and record
(tests/data/two_node_run: node1 killed after step 7, a replacement joined, the run resumed): the story keeps node0's
error with the cause gloo quoted, and every claim fails when a figure in the log or the record is wrong."""

import json
import shutil
from pathlib import Path

import pytest

from distrinews_course.two_node_run import TwoNodeRun, snapshot_name

DATA = Path(__file__).parent / "data" / "two_node_run"
PARAMS, STEPS, KILL = 2_090_692, 40, 7


def run_with(tmp_path, log=None, record=None) -> TwoNodeRun:
    """The recorded run, its log and record edited by the given functions (a wrong figure planted)."""
    shutil.copy(DATA / "all_nodes.log", tmp_path)
    shutil.copy(DATA / "cluster.json", tmp_path)
    shutil.copytree(DATA / "shared", tmp_path / "shared", dirs_exist_ok=True)  # the run's metrics.json
    if log:
        p = tmp_path / "all_nodes.log"
        p.write_text(log(p.read_text()))
    if record:
        p = tmp_path / "cluster.json"
        p.write_text(json.dumps(record(json.loads(p.read_text()))))
    return TwoNodeRun.read(tmp_path, KILL)


def held(claims) -> list[bool]:
    return [c.holds for c in claims]


def test_the_recorded_run_supports_every_claim(tmp_path):
    r = run_with(tmp_path)
    assert r.netns
    for claims in (
        r.identity_claims(),
        r.rounds_claims(),
        r.traffic_claims(PARAMS, STEPS),
        r.timeline_claims(),
    ):
        assert claims and all(held(claims)), [c.text for c in claims if not c.holds]


def test_the_story_keeps_node0s_error_with_its_cause_in_one_line(tmp_path):
    story = run_with(tmp_path).story()
    errors = [l for l in story.splitlines() if "error:" in l]
    assert errors == [
        "node0 | error: [rank 0] a collective operation could not complete: "
        "Read error [10.77.0.2]:62627: Connection reset by peer"
    ]
    assert "waited longer" not in story  # the generic either-or of the library's paragraph is not the cause
    assert len(story.splitlines()) <= 30 and "Starting elastic_operator" not in story
    assert story.count("rendezvous round complete") == 4


def test_an_error_that_came_after_the_timeout_is_not_called_a_dropped_connection(tmp_path):
    late = run_with(
        tmp_path,
        record=lambda r: {
            **r,
            "events": [{**e, "t": e["t"] + 61} if e["event"] == "node0 error" else e for e in r["events"]],
        },
    )
    assert held(late.timeline_claims()) == [False, True, True]
    timeout = run_with(tmp_path, log=lambda s: s.replace("Connection reset by peer", "Timed out waiting 60000ms"))
    assert held(timeout.timeline_claims())[0] is False


def test_a_resume_from_an_older_snapshot_or_a_failed_node_fails_the_timeline(tmp_path):
    older = run_with(tmp_path, log=lambda s: s.replace("snap_e001_b000006", "snap_e001_b000003"))
    assert held(older.timeline_claims())[1] is False
    failed = run_with(tmp_path, record=lambda r: {**r, "exit_code": 1})
    assert held(failed.timeline_claims())[2] is False
    assert snapshot_name(7, 3) == "snap_e001_b000006.pt" and snapshot_name(6, 3) == "snap_e001_b000006.pt"


def test_a_reused_port_or_a_shared_restart_count_fails_the_rounds(tmp_path):
    same_port = run_with(tmp_path, log=lambda s: s.replace("master_port=57375", "master_port=56613"))
    assert held(same_port.rounds_claims()) == [True, False, True]
    counted = run_with(tmp_path, log=lambda s: s.replace("restart_count=1", "restart_count=0"))
    assert held(counted.rounds_claims()) == [True, True, False]
    one_round = run_with(tmp_path, log=lambda s: s.replace("Rendezvous complete for workers", "Rendezvous done", 1))
    assert held(one_round.rounds_claims()) == [False]
    assert "(node0 2, node1 1)" in one_round.rounds_claims()[0].text  # the counts it checked, on the visible line
    assert "(node0 2, node1 2)" in run_with(tmp_path).rounds_claims()[0].text
    assert "node0 counts 0 after its restart" in counted.rounds_claims()[2].text  # the counts read, not assumed


def test_swapped_ranks_fail_the_identities(tmp_path):
    swapped = run_with(tmp_path, log=lambda s: s.replace("| node rank 0 of 2", "| node rank 9 of 2"))
    assert False in held(swapped.identity_claims())
    local = run_with(tmp_path, log=lambda s: s.replace("RANK 1 | LOCAL_RANK 0", "RANK 1 | LOCAL_RANK 1"))
    assert held(local.identity_claims())[0] is False


@pytest.mark.parametrize(
    "node, factor, which",
    [
        ("node1/veth0", 1.2, 0),
        ("node1/veth0", 44 / 41, 0),  # a resume from the snapshot before the newest: 3 steps more than the 41
        ("node1/veth0", 0.9, 0),
        ("node0/veth0", 0.5, 1),
        ("node0/lo", 1e4, 2),
    ],
)
def test_bytes_off_the_count_fail_the_traffic(tmp_path, node, factor, which):
    def scale(r):
        r["traffic"][node]["tx_bytes"] = int(r["traffic"][node]["tx_bytes"] * factor)
        return r

    claims = run_with(tmp_path, record=scale).traffic_claims(PARAMS, STEPS)
    assert [i for i, c in enumerate(claims) if not c.holds] == [which]


def test_node1s_steps_are_printed_as_the_plan_not_claimed_as_counted(tmp_path):
    r = run_with(tmp_path)
    assert r.node1_allreduces(STEPS) == 41  # 7 before the kill, then 40 - 6 from the snapshot at step 6
    table = r.traffic_table(PARAMS, STEPS)
    assert "the plan: node1's rank makes 7 + (40 - 6) = 41 optimizer steps" in table and "counted" not in table
    assert not any("optimizer steps" in c.text for c in r.traffic_claims(PARAMS, STEPS))
    later = TwoNodeRun.read(tmp_path, 9)  # a kill after step 9: the snapshot at step 9, 9 + 31 = 40 planned
    assert later.node1_allreduces(STEPS) == 40 and "9 + (40 - 9) = 40" in later.traffic_table(PARAMS, STEPS)


def test_the_loopback_fallback_counts_no_interfaces(tmp_path):
    r = run_with(tmp_path, record=lambda r: {**r, "mode": "loopback"})
    assert r.traffic_claims(PARAMS, STEPS) == []
    assert len(r.identity_claims()) == 3  # no hosts or veth0 to check


def test_the_timeline_figure_draws_both_nodes(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from distrinews_course.two_node_run import plot_timeline

    fig = plot_timeline(run_with(tmp_path), save_to=tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 1000
    labels = {t.get_text() for t in fig.axes[0].get_yticklabels()}
    assert labels == {"node0", "node1"}


def test_the_timeline_draws_loading_apart_from_training(tmp_path):
    """Training starts where rank 0 says it found no snapshot (round 1) or loaded one (round 2), not when the ranks
    start: imports and the snapshot load are drawn as loading."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.colors import to_rgb

    from distrinews_course.two_node_run import plot_timeline

    def fresh_at_4(rec):
        rec["events"].append({"t": 4.0, "event": "node0 started fresh"})
        return rec

    fig = plot_timeline(run_with(tmp_path, record=fresh_at_4))
    starts = {
        c: sorted(round(p.get_x(), 3) for p in fig.axes[0].patches if p.get_facecolor()[:3] == to_rgb(c))
        for c in ("tab:blue", "tan")
    }
    assert starts["tab:blue"] == [4.0, 4.0, 16.499, 16.499]  # both nodes, from rank 0's "no snapshot" and "resumed"
    assert starts["tan"] == [2.427, 2.427, 12.612, 12.612]  # from each round's identity line


def one_machine_case(tmp_path, *, differ=False, untrained=False, accuracy=0.44, val_loss=1.21):
    """Checkpoints as train_ddp.py writes them: the two-node run's, and one machine's (equal, or one tensor apart)."""
    import torch

    from distrinews_course.one_machine import OneMachine
    from distrinews_lib.data.texts import AG_NEWS_LABELS
    from distrinews_lib.models.build import build_model
    from distrinews_lib.training.config import RunConfig

    init = build_model(RunConfig(model="tiny", seed=42), AG_NEWS_LABELS)[0].state_dict()
    trained = {k: v.clone() if untrained or not v.is_floating_point() else v + 0.01 for k, v in init.items()}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    torch.save({"state_dict": trained, "metadata": {"model": "tiny", "seed": 42}}, run_dir / "model.pt")
    ref = {k: v.clone() for k, v in trained.items()}
    if differ:
        k = next(k for k, v in ref.items() if v.is_floating_point())
        ref[k] = ref[k] + 1e-7
    torch.save({"state_dict": ref, "metadata": {"model": "tiny", "seed": 42}}, tmp_path / "ref.pt")
    epoch = {"val_accuracy": accuracy, "val_loss": val_loss, "val_examples": 256}
    (run_dir / "metrics.json").write_text(json.dumps({"epochs": [epoch]}))
    return OneMachine.compare(tmp_path / "ref.pt", run_dir, seconds=9.5)


def test_one_machine_equal_weights_that_moved_and_learned_pass(tmp_path):
    same = one_machine_case(tmp_path)
    assert same.same == same.tensors and all(held(same.claims()))
    assert f"{same.tensors}/{same.tensors} tensors bit-identical" in same.line()


@pytest.mark.parametrize(
    "change, failing",
    [
        ({"differ": True}, [2]),  # one tensor 1e-7 apart: not bit-identical
        ({"untrained": True}, [0]),  # equal, but training never moved them
        ({"accuracy": 0.30}, [1]),  # no better than chance by 10 points
        ({"val_loss": 1.37}, [1]),  # a loss no lower than a uniform guess's
    ],
)
def test_one_machine_claims_fail_on_a_wrong_figure(tmp_path, change, failing):
    claims = one_machine_case(tmp_path, **change).claims()
    assert [i for i, c in enumerate(claims) if not c.holds] == failing
