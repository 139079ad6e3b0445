"""Chapter 08's exercises on launching a job across nodes: the judge of a learner's torchrun line, the seconds a node
that never arrives costs (a prediction written before the run), and the interface check node.py makes.

    grade(launch_line, launch_line_cases())               # exercise 1: torchrun's own parser reads the learner's line
    r = never_arrives(workdir, train_args, startup_s=run.startup_s(), timeout=240)  # exercise 2: node0 alone
    print(r.line()); print(grade_never_arrives(MY_NEVER_ARRIVES_S, r) or "exercise 2: right")
    grade_check_interface(check_interface)                # exercise 3: this node's interfaces and a made-up node's
    print(wrong_interface().output)                       # ... then node.py --ifname eth7, the real refusal

A grader returns None (or passes) for a right answer, else the one mistake in one line; each is tested with a wrong
answer per mistake it names (tests/test_multinode_exercises.py).
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass

from . import ROOT
from .claims import Claim

MULTINODE = ROOT / "scripts" / "multinode"
JOB = {"10.0.0.1": 0, "10.0.0.2": 1}  # exercise 1's cluster: address -> node rank; node0 hosts the rendezvous
JOIN_TIMEOUT = 10  # exercise 2's --join-timeout, in seconds


def _node():
    sys.path.insert(0, str(MULTINODE))
    import node  # scripts/multinode/node.py: what each node of this chapter really ran

    return node


def parse_torchrun(argv):
    """torchrun's own parser on argv: (its namespace, None), or (None, its complaint) where argparse would exit."""
    from torch.distributed.run import get_args_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return get_args_parser().parse_args(argv), None
    except SystemExit:
        return None, (err.getvalue().strip().splitlines() or ["argparse refused it"])[-1]


# What must agree with node.py's line, and why, in the order checked
LAUNCH_FIELDS = [
    ("nnodes", "every node passes the total number of nodes"),
    ("nproc_per_node", "one rank per node here (one GPU each)"),
    ("rdzv_backend", "c10d: torchrun's own store, hosted by node0"),
    ("rdzv_endpoint", "every node meets at node0's address and the rendezvous port"),
    ("rdzv_id", "the job's id, the same on every node"),
    ("local_addr", "this node's own address: the rendezvous orders the nodes by it"),
]


def launch_line_judge(addr: str):
    """judge(line) -> None or the first mistake: the learner's line for the node at `addr`, parsed by torchrun,
    against the line scripts/multinode/node.py starts for that node."""
    node = _node()
    a = node.parse(
        ["--nnodes", "2", "--nproc", "1", "--master-addr", "10.0.0.1", "--master-port", "29500"]
        + ["--rdzv-id", "news42", "--node-rank", str(JOB[addr]), "scripts/train_ddp.py"]
    )
    want, _ = parse_torchrun(node.torchrun_command(a, addr)[3:])  # without "python -m torch.distributed.run"

    def judge(line):
        if (
            not isinstance(line, (list, tuple))
            or not line
            or line[0] != "torchrun"
            or not all(isinstance(x, str) for x in line)
        ):
            return f"returned {line!r:.80}; return a list of strings that starts with 'torchrun'"
        got, complaint = parse_torchrun(list(line[1:]))
        if got is None:
            return f"torchrun would refuse it: {complaint}"
        if got.standalone:
            return "--standalone starts a private rendezvous on this machine alone: the two nodes would never meet"
        for field, why in LAUNCH_FIELDS:
            if str(getattr(got, field)) != str(getattr(want, field)):
                return f"--{field} is {getattr(got, field)!r}, expected {getattr(want, field)!r}: {why}"
        if got.training_script != want.training_script_args[0]:
            return f"it runs {got.training_script!r}; the job trains {want.training_script_args[0]}"
        return None

    return judge


def launch_line_cases() -> list:
    """Exercise 1's cases for attempt.grade: each node's line."""
    return [(f"node{rank}'s line ({addr})", (addr,), launch_line_judge(addr)) for addr, rank in JOB.items()]


# ------------------------------------------------------------------------------------- exercise 2: never arrives


@dataclass
class NeverArrives:
    said: str  # node0's launcher line on failing
    seconds: float  # from the start to node0 giving up
    returncode: int
    startup_s: float  # this machine's start-up to a rank (the chapter's two-node run), to bound the wait

    def line(self) -> str:
        return f"{self.said}\nafter {self.seconds:.0f} s, exit code {self.returncode}"

    def claims(self) -> list[Claim]:
        """node0 gave up with the rendezvous's own message, exit code 2, within the join timeout plus its start-up
        (three times this machine's start-up to a rank, then 10 s of slack), far from torchrun's default 600 s."""
        bound = JOIN_TIMEOUT + 3 * self.startup_s + 10
        return [
            Claim(
                "node0 waited for --join-timeout, then said which nodes arrived (only itself) and what to check",
                self.returncode == 2 and "A node never arrived" in self.said and "node0" in self.said,
            ),
            Claim(
                f"it gave up after {self.seconds:.0f} s, within the join timeout plus start-up ({bound:.0f} s here), "
                "not after torchrun's default 600 s",
                self.seconds < bound,
            ),
        ]


def never_arrives(workdir, train_args, *, startup_s: float, timeout: float) -> NeverArrives:
    """Start node0 alone (two_nodes.py --only-node0) with --join-timeout JOIN_TIMEOUT and time how long it waits."""
    from .launch import run

    r = run(
        [sys.executable, MULTINODE / "two_nodes.py", "--workdir", workdir, "--only-node0"]
        + ["--join-timeout", JOIN_TIMEOUT, "--", *train_args],
        timeout=timeout,
        echo=False,
        check=False,
    )
    said = [l for l in r.output.splitlines() if "[launcher" in l and "failed" in l]
    return NeverArrives(said[0] if said else "(node0 said nothing on failing)", r.seconds, r.returncode, startup_s)


def grade_never_arrives(mine, run: NeverArrives) -> str | None:
    """None when the predicted seconds are within a factor of 1.5 of the run's, else the mistake in one line: not a
    number, torchrun's default join timeout, failing at once, the join timeout without the start-up, or far off."""
    gave_up = f"node0 gave up after {run.seconds:.0f} s"
    if isinstance(mine, bool) or not isinstance(mine, (int, float)):
        return f"{mine!r}: write a number of seconds, from --join-timeout and the start-up the two-node run measured"
    if mine >= 300:
        return f"{mine:g} s is torchrun's default (600 s), which --join-timeout {JOIN_TIMEOUT} replaces: {gave_up}"
    if mine < JOIN_TIMEOUT / 2:
        return f"{mine:g} s: node0 does not fail at once, its rendezvous waits --join-timeout for node1: {gave_up}"
    if abs(mine - JOIN_TIMEOUT) <= 1 and run.startup_s >= 1.5:
        return (
            f"{mine:g} s is the join timeout alone; the agent starts first ({run.startup_s:.1f} s, the two-node run's "
            f"start-up): {gave_up}"
        )
    if not run.seconds / 1.5 <= mine <= run.seconds * 1.5:
        formula = f"the start-up ({run.startup_s:.1f} s) plus the join timeout ({JOIN_TIMEOUT} s)"
        return f"{mine:g} s: {gave_up}; {formula} is {run.startup_s + JOIN_TIMEOUT:.1f} s"
    return None


# ---------------------------------------------------------------------------------- exercise 3: wrong interface


@dataclass
class WrongInterface:
    output: str
    seconds: float
    returncode: int

    def claims(self) -> list[Claim]:
        """Refused with exit code 2 and the message naming the missing interface, before any connection attempt could
        time out (60 s)."""
        return [
            Claim(
                f"node.py refused in {self.seconds:.1f} s, before any connection attempt could time out (60 s), "
                "listing the interfaces the node does have",
                self.returncode == 2 and "names no network interface on this node" in self.output and self.seconds < 60,
            )
        ]


def wrong_interface(ifname: str = "eth7") -> WrongInterface:
    """node.py on this machine with --ifname naming an interface it does not have."""
    from .launch import run

    r = run(
        [sys.executable, MULTINODE / "node.py", "--master-addr", "127.0.0.1", "--ifname", ifname]
        + ["--connect-timeout", 60, "scripts/train_ddp.py"],
        timeout=120,
        echo=False,
        check=False,
    )
    return WrongInterface(r.output.strip(), r.seconds, r.returncode)


# A made-up node with three interfaces, one of them without an IPv4 address (a bridge nobody configured)
MADE_UP_NODE = {"lo": "127.0.0.1", "eth0": "10.0.0.2", "ib0": "192.168.7.2", "docker0": None}


class Refusal(str):
    """What check_interface raised (a ValueError's message), as its grader sees it."""


def node_interfaces() -> dict:
    """This node's interfaces: {name: its IPv4 address, or None}, as node.py reads them."""
    import socket

    hook = _node().HERE / "rank_hook.py"
    sys.path.insert(0, str(hook.parent))
    from rank_hook import interface_address

    return {name: interface_address(name) for _, name in sorted(socket.if_nameindex())}


def _address(ifname, interfaces, want):
    def judge(got):
        if isinstance(got, Refusal):
            return f"refused '{ifname}', which has the address {want}: {got[:120]}"
        if got != want:
            return f"returned {got!r}, expected {want!r}: the address of '{ifname}' itself, not another interface's"
        return None

    where = "a made-up node" if interfaces is MADE_UP_NODE else "this node"
    return f"'{ifname}' on {where}: its address", (ifname, interfaces), judge


def _refusal(ifname, interfaces, why):
    listed = ifname not in interfaces  # a missing name: the refusal lists what the node has, so the user can pick

    def judge(got):
        if not isinstance(got, Refusal):
            return f"returned {got!r}; {why}: raise ValueError"
        if ifname not in got:
            return f"the refusal must name '{ifname}'; it said {got[:120]!r}"
        if listed and not all(name in got for name in interfaces):
            return f"the refusal must list the interfaces the node has ({', '.join(interfaces)}); it said {got[:120]!r}"
        return None

    return (
        f"'{ifname}': refused, naming it" + (" and listing the node's" if listed else ""),
        (ifname, interfaces),
        judge,
    )


def interface_cases() -> list:
    """Exercise 3's cases for attempt.grade: (ifname, interfaces) -> the address, or a refusal."""
    here = node_interfaces()
    return [
        _address("lo", here, here.get("lo") or "127.0.0.1"),
        _address("ib0", MADE_UP_NODE, MADE_UP_NODE["ib0"]),
        _refusal("eth7", MADE_UP_NODE, "'eth7' is not on the node: refuse it before torchrun starts"),
        _refusal("docker0", MADE_UP_NODE, "'docker0' has no IPv4 address: the ranks would have nothing to bind"),
    ]  # fmt: skip


def grade_check_interface(fn, quiet: bool = False):
    """attempt.grade of the learner's check_interface(ifname, interfaces) on interface_cases(): a ValueError it raises
    is its refusal, any other error the learner's bug."""
    from .attempt import grade, is_stub

    if is_stub(fn):
        return grade(fn, [], quiet=quiet)

    def refused_or_address(ifname, interfaces):
        try:
            return fn(ifname, dict(interfaces))
        except ValueError as err:
            return Refusal(str(err))

    refused_or_address.__name__ = getattr(fn, "__name__", "check_interface")
    return grade(refused_or_address, interface_cases, quiet=quiet)
