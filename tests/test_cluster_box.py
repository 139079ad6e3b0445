"""The cluster in a box (scripts/cluster/box.py): namespaces with shaped links, dialed from a rank, and nothing left
behind, whatever way a run ends."""

import os
import signal
import subprocess
import sys
import time

import pytest

from distrinews_course import link

from .helpers import ROOT

BOX = ROOT / "scripts" / "cluster" / "box.py"
USABLE, WHY = link.usable()
needs_box = pytest.mark.skipif(not USABLE, reason=f"no cluster in a box here: {WHY}")

PROBE = """
import time, torch, torch.distributed as dist
from distrinews_course import link
from distrinews_lib.distributed import end_process
dist.init_process_group("gloo")
x = torch.ones(2 * 2**20)   # 8 MiB
def seconds():
    dist.barrier()
    t = time.perf_counter()
    for _ in range(2):
        dist.all_reduce(x)
    return (time.perf_counter() - t) / 2
first = seconds()
dist.barrier()
if dist.get_rank() == 0:
    link.dial("200mbit")
dist.barrier()
second = seconds()
if dist.get_rank() == 0:
    print(f"RESULT nodes={dist.get_world_size()} first={first:.4f} second={second:.4f} rate={link.current_rate()}",
          flush=True)
dist.destroy_process_group()
end_process(0)
"""


# Two levels: 2 nodes x 2 ranks. Each rank says who it is; then an all-reduce inside each node and one across the nodes,
# each node's link counted around each (what the node's own /sys says): inside a node nothing crosses it.
TWO_LEVEL_PROBE = """
import os, socket, sys, torch, torch.distributed as dist
from distrinews_course import link
from distrinews_lib.distributed import end_process
dist.init_process_group("gloo")
r, g = dist.get_rank(), int(os.environ["LOCAL_WORLD_SIZE"])
intra = [dist.new_group(list(range(k * g, k * g + g))) for k in range(dist.get_world_size() // g)][r // g]
cross = [dist.new_group(list(range(l, dist.get_world_size(), g))) for l in range(g)][r % g]
x = torch.ones(2**20)   # 4 MiB
sent = {}
for name, group in (("intra", intra), ("cross", cross)):
    dist.all_reduce(x, group=group)
    # a node's ranks share its counter: every rank reads it before any sends and after all have sent (the barriers
    # add a few bytes), or a node-mate's read, late or early, would miss part of this all-reduce or count the next
    dist.barrier()
    before = link.link_bytes()
    dist.barrier()
    dist.all_reduce(x, group=group)
    dist.barrier()
    sent[name] = link.link_bytes()["tx"] - before["tx"]
    dist.barrier()
# a file per rank: four ranks printing at once after the barrier can interleave their lines in the box's pipe
with open(os.path.join(sys.argv[1], f"rank{r}.txt"), "w") as f:
    f.write(f"RESULT rank={r} local={os.environ['LOCAL_RANK']} node={os.environ['GROUP_RANK']} "
            f"host={socket.gethostname()} world={dist.get_world_size()} intra={sent['intra']} cross={sent['cross']}")
dist.destroy_process_group()
end_process(0)
"""


def _box(*args, timeout=300, **kw):
    return subprocess.run(
        [sys.executable, BOX, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT, **kw
    )


def _netns() -> set:
    """The network namespaces, and the box's cables still in this machine's own namespace (a cable is made here, then
    moved into its node's: a box that died in between would leave it here)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    cables = {f"link {line.split(':')[1].strip().split('@')[0]}" for line in links.splitlines() if ": box" in line}
    return {line.split()[0] for line in out.splitlines() if line.strip()} | cables


@pytest.mark.parametrize(
    "text, bits",
    [("400mbit", 4e8), ("1gbit", 1e9), ("2.5gbit", 2.5e9), ("800kbit", 8e5), ("none", None), ("NONE", None)],
)
def test_a_rate_is_read_as_tc_writes_it(text, bits):
    assert link.bits_per_s(text) == bits


@pytest.mark.parametrize("bad", ["40", "400Mbps", "fast", "-5mbit", "0mbit", "500gbit", "1kbit"])
def test_a_bad_rate_is_one_clear_line_and_nothing_is_built(bad):
    before = _netns() if USABLE else set()
    p = _box(f"--link={bad}", "--", "x.py")
    assert p.returncode == 2 and p.stdout.startswith("[box] error: --link") and "Traceback" not in p.stderr
    assert ("not a rate" in p.stdout) or ("between 100kbit and 100gbit" in p.stdout)
    if USABLE:
        assert _netns() == before


def test_a_missing_tc_is_named():
    p = _box("--link", "400mbit", "--", "x.py", env=dict(os.environ, PATH="/nonexistent"))
    assert p.returncode == 3 and "the command(s) ip, tc, nsenter, unshare are missing" in p.stdout


@needs_box
@pytest.mark.slow
def test_links_are_shaped_dialed_from_a_rank_and_removed(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    before = _netns()
    p = _box("--nodes", 2, "--link", "400mbit", "--", probe)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    fields = dict(
        kv.split("=") for kv in next(line for line in p.stdout.splitlines() if line.startswith("RESULT")).split()[1:]
    )
    nbytes = 8 * 2**20  # 2 ranks: each sends 2(N-1)/N = 1x the message over its own link
    got_first, got_second = nbytes / float(fields["first"]), nbytes / float(fields["second"])
    want_first, want_second = 400e6 / 8 * link.PAYLOAD_SHARE, 200e6 / 8 * link.PAYLOAD_SHARE
    assert abs(got_first / want_first - 1) < 0.15, (got_first, want_first)
    assert abs(got_second / want_second - 1) < 0.15, (got_second, want_second)
    assert fields["rate"] == "400000000bit"
    assert _netns() == before  # every namespace, cable and filter is gone


@needs_box
@pytest.mark.slow
@pytest.mark.parametrize("layout", [(3, 1), (2, 2)], ids=["3 nodes", "2 nodes x 2 ranks"])
@pytest.mark.parametrize("how", ["a rank fails", "SIGTERM", "SIGINT"])
def test_nothing_is_left_behind_however_the_box_ends(tmp_path, how, layout):
    script = tmp_path / "sleeper.py"
    script.write_text(
        "import os, sys, time\nprint('up', os.environ['RANK'], flush=True)\n"
        "sys.exit(7) if os.environ['RANK'] == '1' and len(sys.argv) > 1 else time.sleep(120)\n"
    )
    before = _netns()
    args = [
        sys.executable,
        BOX,
        "--nodes",
        str(layout[0]),
        "--ranks-per-node",
        str(layout[1]),
        "--link",
        "1gbit",
        "--",
        script,
        *(["fail"] if how == "a rank fails" else []),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    if how != "a rank fails":
        deadline = time.time() + 120
        while time.time() < deadline and len(_netns() - before) < layout[0] + 1:
            time.sleep(0.2)
        time.sleep(1)
        proc.send_signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == (7 if how == "a rank fails" else 130), out
    assert "the box is removed" in out
    assert _netns() == before
    assert subprocess.run(["pgrep", "-f", str(script)], capture_output=True).returncode == 1  # no rank left


def test_a_bad_number_of_ranks_per_node_is_one_clear_line():
    p = _box("--nodes", 2, "--ranks-per-node", 0, "--", "x.py")
    assert p.returncode == 2 and p.stdout.startswith("[box] error: --ranks-per-node 0") and "Traceback" not in p.stderr


@needs_box
@pytest.mark.slow
def test_two_levels_ranks_of_a_node_share_its_loopback_and_nodes_their_links(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(TWO_LEVEL_PROBE)
    before = _netns()
    p = _box("--nodes", 2, "--ranks-per-node", 2, "--link", "1gbit", "--", probe, tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = [dict(kv.split("=") for kv in f.read_text().split()[1:]) for f in sorted(tmp_path.glob("rank*.txt"))]
    got = sorted((int(r["rank"]), r["local"], r["node"], r["host"], r["world"]) for r in rows)
    assert got == [
        (0, "0", "0", "node0", "4"),
        (1, "1", "0", "node0", "4"),
        (2, "0", "1", "node1", "4"),
        (3, "1", "1", "node1", "4"),
    ]
    for r in rows:
        assert int(r["intra"]) < 64 * 1024  # inside a node: its loopback, not its link (a few barrier bytes at most)
        # across: the node's 2 ranks each all-reduce 4 MiB with their peer on the other node: 2 x 4 MiB leave the node,
        # plus what the counter also counts: TCP/IP/Ethernet headers (1514/1448: +4.6%) and the acknowledgements
        assert 1 <= int(r["cross"]) / (2 * 4 * 2**20) < 1.10, r
    assert _netns() == before


@needs_box
@pytest.mark.slow
def test_a_box_killed_midway_is_removed_by_the_next_one(tmp_path):
    """SIGKILL gives the box no chance to clean up: its namespaces (and the ranks inside them) stay until the next box
    starts, which removes them first and says so."""
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    before = _netns()
    proc = subprocess.Popen(
        [sys.executable, BOX, "--nodes", "2", "--ranks-per-node", "2", "--link", "1gbit", "--", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    deadline = time.time() + 120
    while time.time() < deadline and len(_netns() - before) < 3:
        time.sleep(0.2)
    time.sleep(1)
    proc.kill()
    proc.communicate(timeout=60)
    left = {name for name in _netns() - before if f"box{proc.pid}" in name}  # this box's: another test's may run
    assert len(left) >= 3  # left behind: a switch and two nodes
    nothing = tmp_path / "nothing.py"
    nothing.write_text("print('ok')\n")
    p = _box("--nodes", 2, "--", nothing)
    assert p.returncode == 0 and "removed a box left behind by a killed run" in p.stdout, p.stdout
    assert not left & _netns(), left & _netns()  # the killed box's namespaces and cables are gone
    assert subprocess.run(["pgrep", "-f", str(script)], capture_output=True).returncode == 1  # no rank left


def test_the_link_rate_is_read_from_the_messages_the_link_sets():
    """Chapter 05's fit on a 400mbit box, measured under scripts/slow_machine.py (52% core speed, 084f7c6): the 64 KiB
    message rode the token bucket at the busy CPU's speed, and a fit over every size read back 440 Mbit/s of payload,
    more than the link can carry. Fitted on the messages at least 4x the bucket it reads the link's own rate."""
    from distrinews_course import perf_model as pm

    ms = {2**16: 3.32, 2**18: 4.79, 2**20: 21.2, 2**22: 86.76, 2**24: 351.51}
    rows = [{"op": "all_reduce", "bytes": b, "seconds": t / 1000} for b, t in ms.items()]
    bits = link.bits_per_s("400mbit")
    assert link.burst_bytes(bits) == 256 * 1024 and link.burst_bytes(link.bits_per_s("10gbit")) == 2_500_000
    kept = link.rate_bound(rows, bits)
    assert [r["bytes"] for r in kept] == [2**20, 2**22, 2**24]
    ceiling = bits * link.PAYLOAD_SHARE
    payload = lambda fit: pm.ring_bytes_per_rank(1, 2) * fit.bandwidth * 8  # noqa: E731
    assert payload(pm.fit_alpha_beta(rows)) > 1.1 * ceiling  # every size: the bucket's burst read as the link
    assert abs(payload(pm.fit_alpha_beta(kept)) / ceiling - 1) < 0.01  # the link's sizes: its rate, within 1%
