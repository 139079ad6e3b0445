"""The suite's scheduler on two workers (tests/quiet_last.py), on a small suite of its own in a real `pytest -n 2`:
every file runs whole on one worker, the chain's files (the chapters) one after another on one worker in their order,
and the quiet files run last, one at a time, after every other test ended."""

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import NESTED_ENV, NESTED_PLUGINS

ROOT = Path(__file__).resolve().parent.parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
import pytest
from tests.quiet_last import QuietLast

class Scheduler(QuietLast):
    quiet_files = ("tests/test_q1.py", "tests/test_q2.py")
    chain_dir = "tests/chain/"

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return Scheduler(config, log)
"""

TEST = """
import json, os, time, pytest

@pytest.mark.parametrize("i", range(3))
def test_step(i):
    start = time.time()
    time.sleep(0.2)
    with open(os.environ["LOG"], "a") as f:
        f.write(json.dumps([__name__, os.environ["PYTEST_XDIST_WORKER"], start, time.time()]) + "\\n")
"""


def test_quiet_files_run_last_and_alone_and_every_file_on_one_worker(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "conftest.py").write_text(CONFTEST)
    names = ["test_a", "test_b", "test_c", "test_d", "test_q1", "test_q2"]
    for name in names:
        (tmp_path / "tests" / f"{name}.py").write_text(TEST)
    chain = ["test_k1", "test_k2", "test_k3"]  # written in reverse, so that neither file time nor size gives the order
    (tmp_path / "tests" / "chain").mkdir()
    for name in reversed(chain):
        (tmp_path / "tests" / "chain" / f"{name}.py").write_text(TEST)
    names += chain
    log = tmp_path / "log.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", *NESTED_PLUGINS, "tests"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "LOG": str(log), "PYTHONPATH": str(ROOT), **NESTED_ENV},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == 3 * len(names)
    workers = {name: {w for m, w, *_ in runs if m.endswith(name)} for name in names}
    assert all(len(w) == 1 for w in workers.values()), workers  # a file stays on one worker
    quiet = [r for r in runs if r[0].endswith(("test_q1", "test_q2"))]
    rest = [r for r in runs if r not in quiet]
    assert min(r[2] for r in quiet) >= max(r[3] for r in rest), "a quiet file started before the others had ended"
    q1, q2 = ([r for r in quiet if r[0].endswith(n)] for n in ("test_q1", "test_q2"))
    assert min(r[2] for r in q2) >= max(r[3] for r in q1), "the quiet files ran side by side"
    assert len({r[1] for r in rest}) == 2  # the rest did share both workers
    links = [[r for r in runs if r[0].endswith(n)] for n in chain]
    assert len({r[1] for link in links for r in link}) == 1, "the chain's files ran on two workers"
    for before, after in zip(links, links[1:]):
        assert min(r[2] for r in after) >= max(r[3] for r in before), (
            "a chain file started before the one before it ended"
        )
