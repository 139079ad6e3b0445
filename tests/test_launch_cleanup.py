"""No rank outlives its launch: not when the launcher is killed (a kernel restart), not when torchrun
itself is killed, not on an interrupt, a timeout or a normal exit."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distrinews_course.launch import LaunchError, torchrun

from .helpers import ROOT

SLEEPER = ROOT / "tests" / "workers" / "sleeper.py"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _children(pid: int) -> list:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(entry))
    return out


def _start_launcher(pid_dir: Path, *extra):
    """A parent process (standing in for a notebook kernel) that launches 2 sleeping ranks through the library."""
    code = (
        "import sys; from distrinews_course.launch import torchrun; "
        f"torchrun({str(SLEEPER)!r}, 2, [{str(pid_dir)!r}, *sys.argv[1:]], timeout=300, echo=False)"
    )
    started = time.time()
    parent = subprocess.Popen([sys.executable, "-c", code, *extra], cwd=ROOT)
    deadline = time.time() + 180  # a hard bound: a launch that never starts fails here, not in CI's timeout
    while len(ranks := _pids(pid_dir)) < 2:
        assert time.time() < deadline and parent.poll() is None, "the ranks never started"
        time.sleep(0.1)
    return parent, ranks, time.time() - started


def _pids(pid_dir: Path) -> list:
    """The ranks' PIDs, each once its file holds a whole one (a file is created before it is written)."""
    pids = []
    for path in pid_dir.glob("rank*.pid"):
        text = path.read_text()
        if text.isdigit() and _alive(int(text)):
            pids.append(int(text))
    return pids


def _wait_all_gone(pids, seconds=20) -> list:
    deadline = time.time() + seconds
    while time.time() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def _reap(proc):
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and prctl (Linux)")
def test_killing_the_launcher_leaves_no_rank_behind(tmp_path):
    parent, ranks, _ = _start_launcher(tmp_path)
    agents = [p for p in _children(parent.pid)]  # torchrun (the launcher's only child)
    parent.send_signal(signal.SIGKILL)  # like a kernel that dies: no cleanup code of ours runs in it
    _reap(parent)
    left = _wait_all_gone(ranks + agents)
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"processes still running after their launcher was killed: {left}"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and prctl (Linux)")
def test_killing_torchrun_itself_takes_its_library_ranks_along(tmp_path):
    parent, ranks, _ = _start_launcher(tmp_path, "--library")
    agents = _children(parent.pid)
    assert agents, "torchrun should be running under the launcher"
    for a in agents:
        os.kill(a, signal.SIGKILL)  # no chance for torchrun to stop its workers
    left = _wait_all_gone(ranks)
    for p in left:
        os.kill(p, signal.SIGKILL)
    _reap(parent)
    assert not left, f"ranks survived their torchrun agent: {left}"


@pytest.mark.slow
def test_an_interrupt_or_a_timeout_leaves_no_rank_behind(tmp_path):
    parent, ranks, launch_s = _start_launcher(tmp_path / "interrupt")
    parent.send_signal(signal.SIGINT)  # the notebook's stop button
    _reap(parent)
    assert not _wait_all_gone(ranks), "ranks survived an interrupted launch"

    # The timeout must fire after both ranks started (they sleep forever): three times what starting them
    # took on this machine just now, so a slow or busy machine still gets its ranks up before it fires.
    pid_dir = tmp_path / "timeout"
    with pytest.raises(LaunchError, match="timed out"):
        torchrun(SLEEPER, 2, [pid_dir], timeout=3 * launch_s, echo=False)
    ranks = [int(p.read_text()) for p in pid_dir.glob("rank*.pid")]
    assert len(ranks) == 2 and not _wait_all_gone(ranks, 5), "ranks survived a launch that timed out"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torchrun's process-group signal, Linux's tee")
def test_what_a_rank_writes_as_torchrun_stops_it_reaches_the_launcher(tmp_path):
    # torchrun signals a rank's whole process group, where the rank's tee lives: it must outlive the signal
    result = torchrun(ROOT / "tests" / "workers" / "last_words.py", 2, [tmp_path], timeout=120, echo=False, check=False)
    assert not result.ok and not result.timed_out, result.output[-2000:]
    said = [line for line in result.lines if line.startswith("last word ")]
    assert len(said) == 4000 and said[-1] == "last word 3999 of rank 0", f"{len(said)} of 4000 lines arrived"
