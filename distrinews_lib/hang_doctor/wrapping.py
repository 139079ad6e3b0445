"""Running a script under a wrapper (python -m distrinews_lib.hang_doctor, and the course's debug-server wrapper):
the wrapper's own options first, then the script, run as __main__ as `python SCRIPT` or `python -m MODULE` would."""

from __future__ import annotations

import os
import runpy
import sys


def split_target(argv: list, valued: tuple) -> tuple:
    """(the wrapper's options, the target and its arguments): the options come first, `--name value` or
    `--name=value`; the target starts at the first word that is not one (argparse would take the target's own
    `-m` for an option of the wrapper)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
        i += 2 if argv[i] in valued else 1
    return argv[:i], argv[i:]


def target_problem(target: list) -> str | None:
    if not target or target[:1] == ["-m"] and len(target) < 2:
        return "name the script to run (SCRIPT ARGS... or -m MODULE ARGS...)"
    return None


def run_target(target: list) -> None:
    """Run `SCRIPT ARGS...` or `-m MODULE ARGS...` as __main__, with its own sys.argv."""
    if target[0] == "-m":
        sys.argv = target[1:]
        runpy.run_module(target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(target)
        sys.path.insert(0, os.path.dirname(os.path.abspath(target[0])))
        runpy.run_path(target[0], run_name="__main__")
