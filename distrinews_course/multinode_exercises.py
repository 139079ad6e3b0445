"""Chapter 08's exercises on launching a job across nodes: the judge of a learner's torchrun line, and the runs that
grade a prediction written before them (a node that never arrives, an interface that does not exist).

    grade(launch_line, launch_line_cases())             # exercise 1: torchrun's own parser reads the learner's line
    r = never_arrives(workdir, train_args, timeout=240)   # exercise 2: only node0 starts, --join-timeout 10
    print(r.line()); print(grade_never_arrives(MY_NEVER_ARRIVES, r) or "exercise 2: right")
    r = wrong_interface()                                # exercise 3: node.py --ifname eth7
    print(grade_wrong_interface(MY_WRONG_INTERFACE, r) or "exercise 3: right")

A grader returns None for a right prediction, else the one mistake in one line; each is tested with a wrong answer
per mistake it names (tests/test_multinode_exercises.py).
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

# Exercise 2's and 3's choices, each a thing a learner might expect
NEVER_ARRIVES = {
    "a": "node0 trains alone, in a world of 1",
    "b": "node0 waits torchrun's default (600 s), then fails",
    "c": "node0 gives up after about --join-timeout, naming the nodes that did arrive",
}
WRONG_INTERFACE = {
    "a": "the rank starts and hangs until the connect timeout (60 s)",
    "b": "gloo quietly picks another interface and training runs",
    "c": "node.py refuses at once, listing the interfaces the node does have",
}


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

    def outcome(self) -> str | None:
        """Which of NEVER_ARRIVES the run did (None: none of them, e.g. a crash)."""
        if self.returncode == 0:
            return "a"
        if self.seconds >= 600:
            return "b"
        return "c" if "A node never arrived" in self.said else None

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


def grade_never_arrives(mine: dict, run: NeverArrives) -> str | None:
    """None when the choice is right and the seconds within a factor of 1.5 of the run's; else the mistake."""
    choice, seconds = mine.get("choice"), mine.get("seconds")
    if choice not in NEVER_ARRIVES:
        return f"choice {choice!r}: pick one of {', '.join(NEVER_ARRIVES)}"
    if choice != run.outcome():
        return (
            f"not {choice!r} ({NEVER_ARRIVES[choice]}): after {run.seconds:.0f} s: {run.said.split('] ', 1)[-1][:160]}"
        )
    if not isinstance(seconds, (int, float)) or not run.seconds / 1.5 <= seconds <= run.seconds * 1.5:
        return (
            f"the right outcome, but {seconds!r} s: node0 gave up after {run.seconds:.0f} s, the join timeout "
            f"({JOIN_TIMEOUT} s) plus the agent's start-up"
        )
    return None


# ---------------------------------------------------------------------------------- exercise 3: wrong interface


@dataclass
class WrongInterface:
    output: str
    seconds: float
    returncode: int

    def outcome(self) -> str | None:
        """Which of WRONG_INTERFACE the run did (None: none of them)."""
        if self.returncode == 0:
            return "b"
        if self.seconds >= 60:
            return "a"
        return "c" if "names no network interface on this node" in self.output else None

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


def grade_wrong_interface(mine, run: WrongInterface) -> str | None:
    """None when the choice is what the run did, else the mistake in one line."""
    if mine not in WRONG_INTERFACE:
        return f"choice {mine!r}: pick one of {', '.join(WRONG_INTERFACE)}"
    if mine != run.outcome():
        did = f"node.py exited with code {run.returncode} after {run.seconds:.1f} s"
        return f"not {mine!r} ({WRONG_INTERFACE[mine]}): {did}"
    return None
