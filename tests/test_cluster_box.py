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


def _box(*args, timeout=300, **kw):
    return subprocess.run(
        [sys.executable, BOX, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT, **kw
    )


def _netns() -> set:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


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
@pytest.mark.parametrize("how", ["a rank fails", "SIGTERM", "SIGINT"])
def test_nothing_is_left_behind_however_the_box_ends(tmp_path, how):
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
        "3",
        "--link",
        "1gbit",
        "--",
        script,
        *(["fail"] if how == "a rank fails" else []),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    if how != "a rank fails":
        deadline = time.time() + 120
        while time.time() < deadline and len(_netns() - before) < 4:
            time.sleep(0.2)
        time.sleep(1)
        proc.send_signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == (7 if how == "a rank fails" else 130), out
    assert "the box is removed" in out
    assert _netns() == before
    assert subprocess.run(["pgrep", "-f", str(script)], capture_output=True).returncode == 1  # no rank left
