"""The hang doctor: when a collective waits too long or fails, one rank prints which rank is the culprit, at which
collective (its operation, shapes and sequence number) and where that rank's code is; and a rank the others keep
waiting for is named as a straggler.

Opt-in, and imported only then: `--debug_hangs` on the training scripts (distrinews_lib/training/config.py arms it),
or `python -m distrinews_lib.hang_doctor --after SECONDS SCRIPT ARGS...` around any script (chapter 12 runs its
scenarios so). A run without it imports none of this.

    timeout = hang_doctor.arm(after_s=60)     # before init_process_group; returns the group's timeout (60 + grace)
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))

watch.py does the work in each rank (the Flight Recorder, a small HTTP server per rank, the report); verdict.py
decides from the ranks' states, with no process group, so its rules are tested on states written by hand.
"""

from .watch import arm, armed, grace_s, on_error

__all__ = ["arm", "armed", "grace_s", "on_error"]
