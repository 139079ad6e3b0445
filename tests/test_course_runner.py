"""scripts/run_course.py: a failure inside a launched script fails the notebook AND the runner, clearly.

Runs the real runner (papermill, a real kernel) on a tiny temporary course of three notebooks:
01 succeeds and writes its record, 02 launches a script that exits with code 3 through
distrinews_course.launch.run_python, 03 must never run. About 10-20 s on a 2-core CPU.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "scripts" / "run_course.py"

PARAMS = 'PRESET = "auto"\nNPROC = "auto"'
RECORD = """import json, os
from pathlib import Path
Path(os.environ["DISTRINEWS_COURSE_RECORDS"], "01_ok.json").write_text(json.dumps({"headline": f"all good with {PRESET}"}))"""  # noqa: E501
FAILING_LAUNCH = """import sys, tempfile
from pathlib import Path
from distrinews_course.launch import run_python
script = Path(tempfile.mkdtemp()) / "broken_train.py"
script.write_text("print('training step 1', flush=True)\\nraise SystemExit(3)\\n")
run_python(script, timeout=60)
print("the notebook must not get here")"""


def _notebook(path: Path, *codes: str) -> None:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = new_code_cell(PARAMS, metadata={"tags": ["parameters"]})
    nb.cells = [new_markdown_cell(f"# {path.stem}"), params, *[new_code_cell(c) for c in codes]]
    nbformat.write(nb, str(path))


def _load_runner():
    spec = importlib.util.spec_from_file_location("run_course", RUNNER)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _run(args, timeout=180):
    return subprocess.run(
        [sys.executable, str(RUNNER), "--no-progress", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def tiny_course(tmp_path_factory):
    folder = tmp_path_factory.mktemp("course")
    _notebook(folder / "01_ok.ipynb", "x = 1 + 1", RECORD)
    _notebook(folder / "02_launch_fails.ipynb", "print('before the launch')", FAILING_LAUNCH)
    _notebook(folder / "03_never.ipynb", "raise RuntimeError('03 must not run after 02 failed')")
    return folder


@pytest.mark.slow
def test_a_failing_launch_stops_the_course_with_a_clear_message(tiny_course, tmp_path):
    runs = tmp_path / "runs"
    proc = _run(["--notebooks-dir", tiny_course, "--runs-dir", runs, "--preset", "cpu_smoke"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    # which notebook, which cell (index in the source notebook + its first line), which error
    assert "02_launch_fails.ipynb failed at cell 3 (`import sys, tempfile`)" in out, out
    assert "LaunchError" in out and "python broken_train.py exited with code 3" in out, out
    assert "training step 1" in out, "the launched script's last lines are shown"
    assert "the notebook must not get here" not in out
    # the kernels' own log stays out of the learner's console (ipykernel warns about unencrypted local TCP)
    assert "IPKernelApp" not in out and "without encryption" not in out, out
    # progress lines and the summary table
    assert "[1/3] 01_ok.ipynb started" in out and "[1/3] 01_ok.ipynb ok" in out, out
    summary = out[out.index("course summary") :]
    assert "01_ok" in summary and "all good with cpu_smoke" in summary, summary
    assert "02_launch_fails  FAILED" in summary, summary
    assert "03_never" in summary and "not run" in summary, summary
    # executed copies and the machine-readable summary
    (run_dir,) = list(runs.iterdir())
    assert (run_dir / "01_ok.ipynb").is_file() and (run_dir / "02_launch_fails.ipynb").is_file()
    assert not (run_dir / "03_never.ipynb").exists()
    data = json.loads((run_dir / "summary.json").read_text())
    assert [n["status"] for n in data["notebooks"]] == ["ok", "FAILED", "not run"]
    assert data["notebooks"][0]["record"] == {"headline": "all good with cpu_smoke"}


@pytest.mark.slow
def test_only_runs_the_chosen_chapters(tiny_course, tmp_path):
    proc = _run(["--notebooks-dir", tiny_course, "--runs-dir", tmp_path, "--only", "01"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "[1/1] 01_ok.ipynb ok" in out and "02_launch_fails" not in out, out
    assert "1/1 notebooks ran" in out


def test_only_accepts_numbers_and_names(tmp_path):
    runner = _load_runner()
    nbs = [tmp_path / n for n in ("00_concepts.ipynb", "01_single_gpu_baseline.ipynb", "02_ddp_training.ipynb")]
    for p in nbs:
        p.touch()
    found = runner.course_notebooks(tmp_path)
    assert [p.name for p in runner.select(found, "02,1")] == ["01_single_gpu_baseline.ipynb", "02_ddp_training.ipynb"]
    assert [p.name for p in runner.select(found, "00_concepts.ipynb")] == ["00_concepts.ipynb"]
    assert runner.select(found, None) == found
    with pytest.raises(SystemExit, match="no such notebook"):
        runner.select(found, "07")


def test_the_course_notebooks_are_found_in_order():
    runner = _load_runner()
    names = [p.name for p in runner.course_notebooks(ROOT / "notebooks")]
    assert names == sorted(names) and names, names
    assert all(n[:2].isdigit() for n in names)


def test_the_readme_table_lists_the_chapters_the_runner_runs():
    # the course's arc in one place each: the notebooks' numbered names; the README's table must follow them
    runner = _load_runner()
    stems = [p.stem for p in runner.course_notebooks(ROOT / "notebooks")]
    rows = re.findall(r"^\| (\d\d) \| `(\d\d_\w+)` \|", (ROOT / "README.md").read_text(), flags=re.M)
    assert [stem for _, stem in rows] == stems, "README.md's chapter table differs from notebooks/"
    assert all(stem.startswith(number + "_") for number, stem in rows), rows


def test_the_presets_are_the_training_configs():
    from distrinews_lib.training.config import CONFIG_DIR, PRESETS

    runner = _load_runner()
    assert runner.parse_args(["--preset", PRESETS[0]]).preset == PRESETS[0]
    with pytest.raises(SystemExit):
        runner.parse_args(["--preset", "no_such_preset"])
    assert all((CONFIG_DIR / f"{name}.yaml").is_file() for name in PRESETS), sorted(CONFIG_DIR.glob("*.yaml"))
