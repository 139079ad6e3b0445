"""Test-wide settings, also inherited by the notebook kernels that nbval starts."""

import os
from pathlib import Path

import pytest

from distrinews_lib import quick_imports

# The tests' own processes (pytest and its workers) load torch, transformers and the rest with the garbage collector
# paused, as the course's ranks do (distrinews_lib/quick_imports.py).
quick_imports.install()

ROOT = Path(__file__).resolve().parent
SHARED_AG_NEWS = ROOT.parent / "shared" / "data" / "ag_news"

# The course's CPU smoke mode reads the real AG News subset when the machine has it (CI does).
if SHARED_AG_NEWS.is_dir():
    os.environ.setdefault("DISTRINEWS_DATA_DIR", str(SHARED_AG_NEWS))
# nbval runs every exercise's solution cell too (a learner's course run skips them unless asked).
os.environ.setdefault("DISTRINEWS_SOLUTIONS", "1")
# Tests must never wait on the Hugging Face hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Idle OpenMP threads sleep instead of spinning, so parallel test processes don't starve each other.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


try:
    import nbval  # noqa: F401  (pyproject's addopts run every notebook through it)
except ImportError:

    def pytest_addoption(parser):
        # Accept the nbval options that pyproject.toml's addopts name, so pytest can say what is missing.
        group = parser.getgroup("nbval (not installed)")
        group.addoption("--nbval-lax", action="store_true")
        group.addoption("--nbval-current-env", action="store_true")
        group.addoption("--nbval-cell-timeout", default=None)

    def pytest_configure(config):
        # Only when the nbval options are in force (pyproject's addopts): a run of named test files with
        # `-o addopts=` (scripts/gpu_check.py on a GPU image without Jupyter) needs no nbval.
        if not (config.getoption("--nbval-lax") or config.getoption("--nbval-current-env")):
            return
        raise pytest.UsageError(
            "nbval is not installed, and the test suite runs every notebook through it. Install the test tools "
            "with `bash scripts/setup_env.sh` (or `pip install -r requirements-dev.txt`), or run only the Python "
            "tests with `python -m pytest tests -p no:nbval -o addopts=''`."
        )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`pytest -n 2`: whole files to the workers, the chapters that time things last and alone (tests/quiet_last.py)."""
    from tests.quiet_last import QuietLast

    return QuietLast(config, log)
