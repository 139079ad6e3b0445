"""python -m distrinews_lib.hang_doctor [--after SECONDS] [--out DIR] SCRIPT ARGS... (or -m MODULE ARGS...)

Runs SCRIPT as __main__ with the hang doctor armed, for a script that has no --debug_hangs of its own. SCRIPT keeps
its own process-group timeout: give it one longer than --after (by grace_s(after)), or the group times out before
the doctor reports.
"""

import argparse
import sys

from . import arm
from .wrapping import run_target, split_target, target_problem


def main(argv: list) -> None:
    p = argparse.ArgumentParser(prog="python -m distrinews_lib.hang_doctor", description=__doc__.split("\n\n")[1])
    p.add_argument("--after", type=float, default=60.0, help="seconds a collective may wait before the doctor reports")
    p.add_argument("--out", default=None, help="folder for the verdict and every rank's state (hang.json)")
    own, target = split_target(argv, ("--after", "--out"))
    args = p.parse_args(own)
    if target_problem(target):
        p.error(target_problem(target))
    if args.after <= 0:
        p.error(f"--after must be a positive number of seconds, not {args.after}")
    arm(args.after, args.out)
    run_target(target)


if __name__ == "__main__":
    main(sys.argv[1:])
