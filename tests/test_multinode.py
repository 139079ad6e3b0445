"""Two nodes on one machine, for real: two network namespaces joined by a veth pair, one torchrun agent in each,
a c10d rendezvous between them (scripts/multinode/). Also: a node killed and replaced, a node that joins an
elastic (--nnodes 1:2) run, and the mistakes that used to mean an endless wait.

Where namespaces cannot be created (not root, a locked-down container), the tests that need them skip with the
reason, and the loopback fallback is tested instead. Every run tears its namespaces down; the fixture checks it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from distrinews_course.launch import run, torchrun

from .helpers import ROOT, SCRIPTS

MULTINODE = SCRIPTS / "multinode"
TWO_NODES = MULTINODE / "two_nodes.py"
NODE = MULTINODE / "node.py"
sys.path.insert(0, str(MULTINODE))
from two_nodes import namespaces_usable  # noqa: E402

NETNS_OK, NETNS_WHY = namespaces_usable()
needs_netns = pytest.mark.skipif(not NETNS_OK, reason=f"network namespaces unavailable: {NETNS_WHY}")

# 320 real AG News texts, 2 ranks, batch 16: 10 optimizer steps per epoch; a snapshot every 3 steps.
TRAIN = [
    "--config",
    "cpu_smoke",
    "--data",
    "embedded",
    "--epochs",
    "2",
    "--num_samples",
    "320",
    "--eval_samples",
    "64",
    "--batch_size",
    "16",
    "--snapshot_every",
    "3",
    "--resume",
    "auto",
    "--no-progress",
    "--threads",
    "1",
    "--ddp_timeout",
    "60",
]
TIMINGS = {}  # filled as the tests run; printed at the end of the module (pytest -s shows them)


def _state(path):
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]


def _identical(a, b) -> bool:
    sa, sb = _state(a), _state(b)
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _netns_names() -> set:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _two_nodes(workdir, *options, train=TRAIN, timeout=300):
    """Run scripts/multinode/two_nodes.py; return (LaunchResult, cluster.json as a dict). Checks the teardown."""
    before = _netns_names() if NETNS_OK else set()
    res = run(
        [sys.executable, TWO_NODES, "--workdir", workdir, *map(str, options), "--", *map(str, train)],
        timeout=timeout,
        echo=False,
        check=False,
        cwd=ROOT,
    )
    record = json.loads((workdir / "cluster.json").read_text())
    if NETNS_OK:
        left = {n for n in _netns_names() - before if n.startswith(record["prefix"])}
        assert not left, f"namespaces left behind: {left}"
    assert not res.timed_out, res.output[-3000:]
    return res, record


def _lines(output: str, node: str) -> list[str]:
    return [line.split(" | ", 1)[1] for line in output.splitlines() if line.startswith(f"{node} | ")]


def _identities(output: str) -> list[dict]:
    pat = re.compile(
        r"^(node\d) \| \[identity\] RANK (\d+) \| LOCAL_RANK (\d+) \| node (\S+) (\S+)(?: \((\S+)\))? \| "
        r"WORLD_SIZE (\d+) \| node rank (\S+) of (\S+) \| store (\S+) \| attempt (\d+)"
    )
    keys = (
        "launcher",
        "rank",
        "local_rank",
        "host",
        "addr",
        "ifname",
        "world_size",
        "group_rank",
        "groups",
        "store",
        "attempt",
    )
    return [dict(zip(keys, m.groups())) for m in map(pat.match, output.splitlines()) if m]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """The reference: one machine, `torchrun --standalone --nproc_per_node=2`, the same data and flags."""
    out = tmp_path_factory.mktemp("standalone")
    t = time.time()
    torchrun(
        SCRIPTS / "train_ddp.py",
        2,
        [*TRAIN, "--output", out, "--checkpoint", out / "model.pt"],
        timeout=240,
        echo=False,
        cwd=ROOT,
    )
    TIMINGS["standalone 2 processes (s)"] = round(time.time() - t, 1)
    return out


@pytest.fixture(scope="module", autouse=True)
def report_timings():
    yield
    if TIMINGS:
        print("\nmulti-node timings:", json.dumps(TIMINGS, indent=1))


# ------------------------------------------------------------------------------------------ fast: refused at once
@pytest.mark.parametrize(
    "options, words",
    [
        (["--master-addr", "no-such-host.invalid"], "does not resolve"),
        (["--master-addr", "127.0.0.1", "--ifname", "nosuchif0"], "names no network interface"),
        (["--master-addr", "192.0.2.55", "--node-rank", "0"], "MASTER_ADDR must be one of its own addresses"),
        (["--master-addr", "127.0.0.1", "--nnodes", "2:1"], "MIN:MAX"),
    ],
)
def test_node_launcher_refuses_a_bad_setup_at_once(options, words):
    t = time.time()
    r = subprocess.run(
        [sys.executable, NODE, *options, SCRIPTS / "train_ddp.py"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "refused: " in r.stdout and words in " ".join(r.stdout.split()), r.stdout
    assert "Traceback" not in r.stdout + r.stderr and time.time() - t < 20


# ------------------------------------------------------------------------------------------ the real thing
# Chapter 08 asserts all of it under nbval, on its run that also loses a node: the ranks' identities, hosts, addresses
# and store (code cell 4, with the plan decided on node0), a copy of the gradients per step over each node's veth0
# (cell 6) and the weights of one machine with two processes, bit for bit (cell 8)
@pytest.mark.also_in_notebook
@needs_netns
@pytest.mark.slow
def test_two_nodes_over_veth_end_like_one_machine(tmp_path, standalone):
    res, rec = _two_nodes(tmp_path)
    assert res.ok, res.output[-4000:]
    TIMINGS["2 nodes x 1 process (s)"] = round(res.seconds, 1)
    assert rec["mode"] == "netns" and rec["ifname"] == "veth0"
    ids = sorted(_identities(res.output), key=lambda d: int(d["rank"]))
    assert [(d["rank"], d["local_rank"], d["host"], d["addr"], d["ifname"], d["world_size"]) for d in ids] == [
        ("0", "0", "node0", "10.77.0.1", "veth0", "2"),
        ("1", "0", "node1", "10.77.0.2", "veth0", "2"),
    ], ids
    assert {d["launcher"] for d in ids} == {"node0", "node1"} and len({d["store"] for d in ids}) == 1
    assert ids[0]["store"].startswith("10.77.0.1:"), "rank 0's store, on node0's veth address"
    # RANK 1 with LOCAL_RANK 0: the rank counts across nodes, the local rank within one
    # every gradient all-reduce crossed the cable: megabytes each way on veth0
    for node in ("node0", "node1"):
        assert rec["traffic"][f"{node}/veth0"]["tx_bytes"] > 20e6, rec["traffic"]
    assert "plan (decided on node0)" in res.output
    assert _identical(standalone / "model.pt", tmp_path / "shared" / "run" / "model.pt"), (
        "2 nodes x 1 process must end with the same weights as 1 machine x 2 processes"
    )


@pytest.mark.also_in_notebook
@needs_netns
@pytest.mark.slow
def test_a_killed_node_is_replaced_and_the_run_ends_bit_identical(tmp_path, standalone):
    res, rec = _two_nodes(tmp_path, "--max-restarts", 1, "--kill-node", 1, "--kill-at-step", 7, "--relaunch")
    assert res.ok, res.output[-4000:]
    out = res.output
    assert "pulling the plug after step 7" in out and "killed by signal 9" in out
    assert "A replacement node1 starts" in out
    node0 = _lines(out, "node0")
    assert any("resumed from" in l and "snap_e001_b000006.pt" in l for l in node0), "\n".join(node0[-30:])
    ids = _identities(out)
    attempts = [(d["launcher"], d["attempt"]) for d in ids]
    # node0's agent restarted its rank (attempt 1); node1 is a fresh agent (attempt 0): counts are per agent
    assert attempts.count(("node0", "0")) == 1 and ("node0", "1") in attempts and attempts.count(("node1", "0")) == 2
    assert _identical(standalone / "model.pt", tmp_path / "shared" / "run" / "model.pt"), (
        "the run that lost a node must end bit-identical to the uninterrupted one"
    )
    ma, mb = (json.loads((d / "metrics.json").read_text())["epochs"] for d in (standalone, tmp_path / "shared" / "run"))
    untimed = lambda e: {
        k: v
        for k, v in e.items()
        if k not in ("epoch_time_s", "samples_per_s", "tokens_per_s", "resumed", "step_losses")  # a launch's own steps
    }
    assert [untimed(e) for e in ma] == [untimed(e) for e in mb]
    killed = next(e["t"] for e in rec["events"] if e["event"] == "node1 killed")
    resumed = next(e["t"] for e in rec["events"] if e["event"] == "node0 resumed")
    TIMINGS["kill a node: run total (s)"] = round(res.seconds, 1)
    TIMINGS["kill a node: kill -> resumed from snapshot (s)"] = round(resumed - killed, 1)
    assert resumed - killed < 120


@needs_netns
@pytest.mark.slow
def test_elastic_run_starts_on_one_node_and_a_second_joins(tmp_path):
    train = [*TRAIN[: TRAIN.index("--num_samples")], "--num_samples", "960", *TRAIN[TRAIN.index("--num_samples") + 2 :]]
    train[train.index("--epochs") + 1] = "4"  # 240 steps alone: node0 is still training when node1 arrives
    res, rec = _two_nodes(tmp_path, "--nnodes", "1:2", "--join-later", train=train)
    assert res.ok, res.output[-4000:]
    sizes = [(d["launcher"], d["world_size"]) for d in _identities(res.output)]
    assert sizes[0] == ("node0", "1"), sizes  # alone at first
    assert ("node0", "2") in sizes and ("node1", "2") in sizes, sizes  # then both, after the second node joined
    text = " ".join(res.output.split())
    assert "taken with 1 process(es), this run has 2" in text and "resumed from" in text
    m = json.loads((tmp_path / "shared" / "run" / "metrics.json").read_text())
    assert len(m["epochs"]) == 4
    TIMINGS["--nnodes 1:2 join run (s)"] = round(res.seconds, 1)


# ------------------------------------------------------------------------------------------ bad input, bounded
CONNECT, JOIN = 15, 20  # seconds: the least timeouts of the runs that wait for another node (fast, quiet machine)
QUICK = 5  # seconds: both timeouts where no node can arrive (wrong address or port): nothing legitimate waits on them


def node_startup_seconds(concurrent: int) -> float:
    """How long a node's launcher needs, here and now, to reach the rendezvous: what dominates is importing torch (its
    preflight's TCPStore, its torchrun agent), timed once and scaled by how many processes import it at the same time
    on this machine's cores. The join and connect timeouts of the bad setups are derived from it: on a machine 3x
    slower, or busy, a node that takes longer to start than --join-timeout is not a bad setup."""
    import os

    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch.distributed"], check=True, timeout=600)
    return (time.perf_counter() - t) * max(1.0, concurrent / (os.cpu_count() or 1))


def bad_setup_timeouts(concurrent: int) -> dict:
    """Each case's --connect-timeout and --join-timeout, sized for what it must wait for: another node's start (twice
    the start-up, and the floors), node0's own preflight joining its store (the preflight imports torch once node0's
    torchrun listens: one start-up), or nothing at all (QUICK). The timeouts a case only waits out cost it seconds."""
    startup = node_startup_seconds(concurrent)
    other = (max(CONNECT, round(2 * startup)), max(JOIN, round(2 * startup + 10)))
    own = (other[0], round(startup + 10))
    timeouts = {
        "wrong MASTER_ADDR": (QUICK, QUICK),
        "wrong MASTER_PORT": (QUICK, QUICK),
        "a node that never arrives": own,
        "mismatched --nnodes": other,
        "loopback": other,
    }
    # The hard upper bound of a bad setup: both timeouts, the nodes' start and the namespaces' set-up and teardown.
    return {
        "startup": startup,
        **{c: {"connect": t[0], "join": t[1], "bound": t[1] + t[0] + 2 * startup + 30} for c, t in timeouts.items()},
    }


TINY = [
    "--config",
    "cpu_smoke",
    "--data",
    "embedded",
    "--epochs",
    "1",
    "--num_samples",
    "64",
    "--eval_samples",
    "32",
    "--no-progress",
    "--threads",
    "1",
]
BAD = {
    "wrong MASTER_ADDR": (
        ["--node1-master-addr", "10.77.0.9"],
        {
            "node1": "could not reach the rendezvous at MASTER_ADDR:MASTER_PORT = 10.77.0.9:29500",
            "node0": "A node never arrived",
        },
    ),
    "wrong MASTER_PORT": (
        ["--node1-master-port", "29511"],
        {
            "node1": "the connection was refused: that machine answers, but nothing listens on that port",
            "node0": "did not complete within --join-timeout",
        },
    ),
    "a node that never arrives": (
        ["--only-node0"],
        {"node0": "the nodes that arrived were: node0 (10.77.0.1). A node never arrived"},
    ),
    "mismatched --nnodes": (
        ["--node1-nnodes", "3"],
        {"node0": "the nodes disagree on --nnodes", "node1": "the nodes disagree on --nnodes"},
    ),
}


LOCAL_SNAPSHOTS_DDP_TIMEOUT = 300  # seconds: --ddp_timeout of the node-local snapshots run


@pytest.fixture(scope="module")
def bad_timeouts():
    # Every case below starts two launchers, each importing torch twice (preflight, torchrun agent), side by side.
    return bad_setup_timeouts(concurrent=4 * (len(BAD) + 2))


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory, bad_timeouts):
    """The bad setups, plus a loopback run, side by side (they mostly wait): {case: (result, record, seconds)}."""
    from concurrent.futures import ThreadPoolExecutor

    cases = ["node-local snapshots", *BAD, "loopback"]
    # Made here, not in the threads: pytest creates its base temp folder lazily, and two threads racing to do so fail.
    works = {case: tmp_path_factory.mktemp("bad") for case in cases}

    def one(case):
        if case != "loopback" and not NETNS_OK:
            return case, None
        work = works[case]
        t = time.time()
        if case == "node-local snapshots":
            # A collective timeout far beyond the check's time: the refusal cannot be mistaken for one, on any machine.
            res, rec = _two_nodes(
                work,
                "--local-output",
                "--max-restarts",
                1,
                "--kill-at-step",
                7,
                "--relaunch",
                train=[*TRAIN[:-1], str(LOCAL_SNAPSHOTS_DDP_TIMEOUT)],
                timeout=600,
            )
        else:
            options = ["--loopback"] if case == "loopback" else BAD[case][0]
            mine = bad_timeouts[case]
            res, rec = _two_nodes(
                work,
                *options,
                "--connect-timeout",
                mine["connect"],
                "--join-timeout",
                mine["join"],
                train=TINY,
                timeout=3 * mine["bound"],
            )
        return case, (res, rec, time.time() - t, work)

    with ThreadPoolExecutor(len(BAD) + 2) as pool:
        return dict(pool.map(one, cases))


@needs_netns
@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD))
def test_bad_setups_fail_with_a_message_in_bounded_time(bad_runs, bad_timeouts, case):
    res, rec, took, _ = bad_runs[case]
    assert res.returncode == 2, res.output[-3000:]
    for node, words in BAD[case][1].items():
        said = " ".join(" ".join(l for l in _lines(res.output, node) if l.startswith("[launcher")).split())
        assert words in said, f"{node} should say '{words}'; it said: {said}"
    assert "Traceback" not in " ".join(l for l in res.output.splitlines() if "[launcher" in l)
    mine = bad_timeouts[case]
    assert took < mine["bound"], f"{case}: {took:.0f} s, bound {mine}, node start-up {bad_timeouts['startup']:.1f} s"
    TIMINGS[f"bad input, {case} (s, run side by side; connect, join timeouts)"] = (
        round(took, 1),
        mine["connect"],
        mine["join"],
    )
    TIMINGS["bad input: node start-up (s)"] = round(bad_timeouts["startup"], 1)


@needs_netns
@pytest.mark.slow
def test_snapshots_on_node_local_disks_stop_the_restart_with_a_message(bad_runs):
    """--output on each node's own disk: after a node dies, the replacement cannot read rank 0's snapshot. Every rank
    stops with a message about shared storage, within seconds of the restart, never a hang."""
    res, rec, took, work = bad_runs["node-local snapshots"]
    assert res.returncode != 0
    text = " ".join(res.output.split())
    assert "cannot find the snapshot run/snapshots/snap_e001_b000006.pt" in text and "shared filesystem" in text, text[
        -3000:
    ]
    assert (work / "node0" / "run" / "snapshots" / "snap_e001_b000006.pt").is_file()
    assert not (work / "node1" / "run" / "snapshots").exists()
    second = [e["t"] for e in rec["events"] if e["event"] == "node1 identity"][-1]
    stopped = next(e["t"] for e in rec["events"] if e["event"] in ("node0 error", "node1 stopped") and e["t"] > second)
    assert stopped - second < LOCAL_SNAPSHOTS_DDP_TIMEOUT, (
        "the refusal must come from the check, not from a collective timeout"
    )
    TIMINGS["node-local snapshots: restart -> refused (s, run side by side)"] = round(stopped - second, 1)


# ------------------------------------------------------------------------------------------ without namespaces
@pytest.mark.slow
def test_loopback_fallback_trains_with_two_agents(bad_runs):
    res, rec, _, _ = bad_runs["loopback"]
    assert res.ok, res.output[-3000:]
    assert rec["mode"] == "loopback" and "FALLBACK: both agents on loopback" in res.output
    ids = _identities(res.output)
    assert sorted((d["rank"], d["addr"]) for d in ids) == [("0", "127.0.0.1"), ("1", "127.0.0.1")]
    assert json.loads(Path(rec["train_args"][-1]).parent.joinpath("metrics.json").read_text())["epochs"]
