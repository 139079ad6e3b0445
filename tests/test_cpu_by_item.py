"""tests/cpu_by_item.py on a small suite of its own, in a real `pytest -n 2`: a test whose child process burns CPU is
charged for it, a test that sleeps is not, and the report names both parts and the costliest file."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.cpu_by_item import read_items, summary
from tests.helpers import NESTED_ENV, NESTED_PLUGINS

ROOT = Path(__file__).resolve().parent.parent
BURN_S = 1.0  # CPU-seconds the child of test_burns spends


def test_a_childs_cpu_counts_for_the_test_that_started_it_and_a_sleep_does_not(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_burn.py").write_text(
        textwrap.dedent(f"""
        import subprocess, sys, time

        def test_burns():
            # a child that spins until it has used {BURN_S} s of CPU, then ends: waited for, as a launch is
            subprocess.run([sys.executable, "-c", "import time\\nwhile time.process_time() < {BURN_S}: pass"],
                           check=True)

        def test_sleeps():
            time.sleep(0.5)
        """)
    )
    (suite / "test_other.py").write_text("def test_nothing():\n    pass\n")
    out = tmp_path / "cpu"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", *NESTED_PLUGINS,
         "-p", "tests.cpu_by_item", "--cpu-out", str(out), "-o", "addopts=", "--rootdir", str(suite), str(suite)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ, **NESTED_ENV),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {nodeid.split("::")[-1]: (wall, cpu) for _, wall, cpu, nodeid in read_items(out)}
    assert set(rows) == {"test_burns", "test_sleeps", "test_nothing"}, rows
    assert len(list(out.glob("items_gw*.tsv"))) >= 1  # written by the workers, read by the controller
    burn_cpu, sleep_cpu = rows["test_burns"][1], rows["test_sleeps"][1]
    assert burn_cpu >= 0.9 * BURN_S, rows  # the child's CPU, counted once it was waited for
    assert sleep_cpu < 0.25 and rows["test_sleeps"][0] >= 0.5, rows  # half a second of wall, next to no CPU
    said = proc.stdout
    assert "CPU-seconds by test" in said and "shared part:" in said and "test_burn.py" in said, said[-2000:]
    assert "cores" in said and "% busy" in said, said[-2000:]  # /proc/stat is there on the Linux CI


def test_the_report_splits_the_quiet_files_from_the_rest_and_ranks_files_by_cpu():
    rows = [
        (100.0, 10.0, 18.0, "tests/test_a.py::test_1"),
        (100.0, 4.0, 2.0, "tests/test_b.py::test_1"),
        (110.0, 5.0, 3.0, "tests/test_a.py::test_2"),
        (120.0, 30.0, 50.0, "notebooks/03_ddp_by_hand.ipynb::Cell 0"),
    ]
    lines = summary(rows, ("notebooks/03_ddp_by_hand.ipynb",), busy=lambda start, end: 0.5 if start == 100.0 else 0.75)
    assert lines[0] == "shared part: 23 CPU-s in 15 s, the cores 50% busy"
    assert lines[1] == "quiet files: 50 CPU-s in 30 s, the cores 75% busy"
    ranked = [line.split()[-1] for line in lines[3:]]
    assert ranked == ["notebooks/03_ddp_by_hand.ipynb", "tests/test_a.py", "tests/test_b.py"]
    assert lines[4].split()[:2] == ["21.0", "15.0"]  # test_a's two tests: CPU and wall added
    assert summary([], ()) == ["cpu_by_item: no test ran"]


def test_an_output_folder_outside_the_run_that_would_move_pytests_root_is_refused_with_the_fix(tmp_path):
    """`--cpu-out DIR`, DIR an existing folder outside where pytest runs: pytest took it for a test path and moved its
    root above both, losing pyproject.toml (a whole suite ran without its notebooks). Refused in one line; `=` works."""
    suite, out = tmp_path / "suite", tmp_path / "cpu"
    suite.mkdir()
    out.mkdir()
    (suite / "test_one.py").write_text("def test_one():\n    pass\n")
    env = dict(os.environ, **NESTED_ENV, PYTHONPATH=str(ROOT))

    def run(*cpu_out):
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.cpu_by_item", *cpu_out]
        return subprocess.run(cmd, cwd=suite, capture_output=True, text=True, timeout=300, env=env)

    refused = run("--cpu-out", str(out))
    said = refused.stdout + refused.stderr
    assert refused.returncode == 4 and f"write --cpu-out={out}, with '='" in said, said[-2000:]
    assert "Traceback" not in said and not list(out.glob("items_*.tsv")), said[-2000:]
    ok = run(f"--cpu-out={out}")
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    assert [nodeid for *_, nodeid in read_items(out)] == ["test_one.py::test_one"]
