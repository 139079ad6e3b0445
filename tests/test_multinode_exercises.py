"""Chapter 08's exercises on launching across nodes (distrinews_course/multinode_exercises.py): the launch-line judge
against the reference answer and one wrong line per mistake it names, exercise 2's grader of the predicted seconds
against one wrong prediction per mistake it names, and exercise 3's checker of check_interface against one wrong
function per mistake. The runs themselves are the chapter's (its solution cells, under nbval) and
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


RUN = mx.NeverArrives("[launcher node0] failed: ... A node never arrived: start ...", 17.0, 2, 4.0)


def test_the_reference_prediction_of_the_wait_is_right():
    assert all(c.holds for c in RUN.claims())
    assert mx.grade_never_arrives(answers_08().never_arrives(mx.JOIN_TIMEOUT, RUN.startup_s), RUN) is None


@pytest.mark.parametrize(
    "mine, says",
    [
        (None, "write a number of seconds"),
        ("c", "write a number of seconds"),
        (600, "torchrun's default (600 s)"),
        (0, "does not fail at once"),
        (10, "the join timeout alone"),
        (40, "the start-up (4.0 s) plus the join timeout (10 s) is 14.0 s"),
    ],
)
def test_each_wrong_prediction_of_the_wait_is_named(mine, says):
    said = mx.grade_never_arrives(mine, RUN)
    assert said is not None and says in said and "\n" not in said, said


def test_never_arrives_claims_fail_on_a_slow_or_silent_run():
    slow = mx.NeverArrives("[launcher node0] failed: ... A node never arrived ...", 600.0, 2, 2.5)
    assert [c.holds for c in slow.claims()] == [True, False]
    crashed = mx.NeverArrives("(node0 said nothing on failing)", 5.0, 1, 2.5)
    assert [c.holds for c in crashed.claims()] == [False, True]


def test_the_wrong_interface_run_claim_fails_on_a_hang():
    out = "[launcher] refused: GLOO_SOCKET_IFNAME/--ifname 'eth7' names no network interface on this node (it has: lo)"
    assert mx.WrongInterface(out, 1.8, 2).claims()[0].holds
    assert not mx.WrongInterface("connect timeout", 61.0, 1).claims()[0].holds


def test_the_reference_check_interface_passes_every_case():
    g = mx.grade_check_interface(answers_08().check_interface, quiet=True)
    assert g.ok and len(g.passed) == 4, g.failed


def picks_another(ifname, interfaces):  # gloo's own fallback: any interface with an address
    return interfaces.get(ifname) or next(a for a in interfaces.values() if a)


def no_check(ifname, interfaces):
    return interfaces.get(ifname)


def key_error(ifname, interfaces):
    address = interfaces[ifname]
    if address is None:
        raise ValueError(f"'{ifname}' has no IPv4 address")
    return address


def lists_nothing(ifname, interfaces):
    if interfaces.get(ifname) is None:
        raise ValueError(f"no usable interface '{ifname}'")
    return interfaces[ifname]


def accepts_no_address(ifname, interfaces):
    if ifname not in interfaces:
        raise ValueError(f"'{ifname}' is not here (it has: {', '.join(interfaces)})")
    return interfaces[ifname]


def first_address(ifname, interfaces):
    if ifname not in interfaces:
        raise ValueError(f"'{ifname}' is not here (it has: {', '.join(interfaces)})")
    if interfaces[ifname] is None:
        raise ValueError(f"'{ifname}' has no IPv4 address")
    return next(a for n, a in interfaces.items() if a and n != "lo") if ifname != "lo" else interfaces["lo"]


def unnamed(ifname, interfaces):
    if interfaces.get(ifname) is None:
        raise ValueError(f"no such interface (it has: {', '.join(interfaces)})")
    return interfaces[ifname]


@pytest.mark.parametrize(
    "wrong, says",
    [
        (picks_another, "returned '127.0.0.1'; 'eth7' is not on the node"),
        (no_check, "returned None; 'eth7' is not on the node"),
        (key_error, "raised KeyError"),
        (lists_nothing, "must list the interfaces the node has"),
        (accepts_no_address, "'docker0' has no IPv4 address"),
        (first_address, "the address of 'ib0' itself, not another interface's"),
        (unnamed, "the refusal must name 'eth7'"),
    ],
)
def test_each_wrong_check_interface_is_named(wrong, says):
    wrong.__name__ = "check_interface"
    g = mx.grade_check_interface(wrong, quiet=True)
    assert not g.ok and says in g.failed and "\n" not in g.failed, g.failed


def test_an_untouched_check_interface_is_not_attempted():
    def check_interface(ifname, interfaces):
        raise NotImplementedError

    assert not mx.grade_check_interface(check_interface, quiet=True).attempted
