"""Shared bits for the tests: paths, and running the project's scripts as a user would."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
AG_NEWS = ROOT.parent / "shared" / "data" / "ag_news"
# A pytest run inside a test, on a small suite of its own, loads only the plugins it uses: autoloading every installed
# one (nbval, schemathesis, hypothesis...) costs each of its processes 6 CPU-s, and a `pytest -n 2` is three processes.
NESTED_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
NESTED_PLUGINS = ["-p", "xdist.plugin"]


def run_script(args, timeout=180, env=None, cwd=None):
    """Run `python <args>` from the project root; returns CompletedProcess with text output."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env=full_env,
    )
