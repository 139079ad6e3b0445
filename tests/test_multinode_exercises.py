"""Chapter 08's exercises on launching across nodes (distrinews_course/multinode_exercises.py): the launch-line judge
against the reference answer and one wrong line per mistake it names, and the prediction graders of exercises 2 and 3
against each wrong choice. The runs themselves are the chapter's (its solution cells, under nbval) and
tests/test_multinode.py's."""

import importlib.util

import pytest

from distrinews_course import ROOT
from distrinews_course import multinode_exercises as mx
from distrinews_course.attempt import grade


def answers_08():
    spec = importlib.util.spec_from_file_location("answers_08", ROOT / "notebooks" / "answers" / "08_several_nodes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_launch_line_passes_on_both_nodes():
    g = grade(answers_08().launch_line, mx.launch_line_cases(), quiet=True)
    assert g.ok and len(g.passed) == 2


def swap(flag, value):
    """The reference line with one flag changed (value None: dropped)."""

    def line(node_addr):
        out = [a for a in answers_08().launch_line(node_addr) if not a.startswith(f"--{flag}=")]
        return out if value is None else out[:1] + [f"--{flag}={value(node_addr)}"] + out[1:]

    return line


def standalone(node_addr):  # chapter 02's single-machine line
    return ["torchrun", "--standalone", "--nproc_per_node=1", "scripts/train_ddp.py"]


def unknown_flag(node_addr):
    return ["torchrun", "--nnodes=2", "--bogus-flag"]


def one_string(node_addr):
    return "torchrun --nnodes=2"


@pytest.mark.parametrize(
    "wrong, says",
    [
        (standalone, "--standalone"),
        (swap("nnodes", None), "--nnodes is '1:1', expected '2'"),
        (swap("rdzv_endpoint", lambda addr: f"{addr}:29500"), "every node meets at node0's address"),
        (swap("rdzv_id", lambda addr: f"news42-{addr}"), "the same on every node"),
        (swap("local_addr", lambda addr: "10.0.0.1"), "this node's own address"),
        (swap("rdzv_backend", lambda addr: "static"), "c10d"),
        (unknown_flag, "torchrun would refuse it"),
        (one_string, "return a list of strings"),
    ],
)
def test_each_wrong_launch_line_is_named(wrong, says):
    wrong.__name__ = "launch_line"
    g = grade(wrong, mx.launch_line_cases(), quiet=True)
    assert not g.ok and says in g.failed, g.failed


def test_never_arrives_right_and_each_wrong_prediction():
    run = mx.NeverArrives("[launcher node0] failed: ... A node never arrived: start ...", 17.0, 2, 2.5)
    assert run.outcome() == "c" and all(c.holds for c in run.claims())
    assert mx.grade_never_arrives({"choice": "c", "seconds": 15}, run) is None
    assert "not 'a'" in mx.grade_never_arrives({"choice": "a", "seconds": 17}, run)
    assert "not 'b'" in mx.grade_never_arrives({"choice": "b", "seconds": 600}, run)
    assert "after 17 s" in mx.grade_never_arrives({"choice": "c", "seconds": 600}, run)  # the default, not the timeout
    assert "after 17 s" in mx.grade_never_arrives({"choice": "c", "seconds": None}, run)
    assert "pick one of" in mx.grade_never_arrives({"choice": "d", "seconds": 17}, run)


def test_never_arrives_claims_fail_on_a_slow_or_silent_run():
    slow = mx.NeverArrives("[launcher node0] failed: ... A node never arrived ...", 600.0, 2, 2.5)
    assert [c.holds for c in slow.claims()] == [True, False] and slow.outcome() == "b"
    crashed = mx.NeverArrives("(node0 said nothing on failing)", 5.0, 1, 2.5)
    assert [c.holds for c in crashed.claims()] == [False, True] and crashed.outcome() is None


def test_wrong_interface_right_and_each_wrong_prediction():
    out = "[launcher] refused: GLOO_SOCKET_IFNAME/--ifname 'eth7' names no network interface on this node (it has: lo)"
    run = mx.WrongInterface(out, 1.8, 2)
    assert run.outcome() == "c" and all(c.holds for c in run.claims())
    assert mx.grade_wrong_interface("c", run) is None
    for wrong in ("a", "b"):
        assert f"not {wrong!r}" in mx.grade_wrong_interface(wrong, run)
    assert "pick one of" in mx.grade_wrong_interface(None, run)
    hung = mx.WrongInterface("connect timeout", 61.0, 1)
    assert hung.outcome() == "a" and not hung.claims()[0].holds and mx.grade_wrong_interface("c", hung)
