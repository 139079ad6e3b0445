"""python -m distrinews_lib.hang_doctor [--after SECONDS] [--out DIR] SCRIPT ARGS... (or -m MODULE ARGS...)

Runs SCRIPT as __main__ with the hang doctor armed, for a script that has no --debug_hangs of its own. SCRIPT keeps
its own process-group timeout: give it one longer than --after (by grace_s(after)), or the group times out before
the doctor reports.
"""

import argparse
import os
import runpy
import sys

from . import arm


def main(argv: list) -> None:
    p = argparse.ArgumentParser(prog="python -m distrinews_lib.hang_doctor", description=__doc__.split("\n\n")[1])
    p.add_argument("--after", type=float, default=60.0, help="seconds a collective may wait before the doctor reports")
    p.add_argument("--out", default=None, help="folder for the verdict and every rank's state (hang.json)")
    p.add_argument("target", nargs=argparse.REMAINDER, help="SCRIPT ARGS... or -m MODULE ARGS...")
    args = p.parse_args(argv)
    if not args.target or args.target[:1] == ["-m"] and len(args.target) < 2:
        p.error("name the script to run (SCRIPT ARGS... or -m MODULE ARGS...)")
    if args.after <= 0:
        p.error(f"--after must be a positive number of seconds, not {args.after}")
    arm(args.after, args.out)
    if args.target[0] == "-m":
        sys.argv = args.target[1:]
        runpy.run_module(args.target[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args.target)
        sys.path.insert(0, os.path.dirname(os.path.abspath(args.target[0])))
        runpy.run_path(args.target[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
