"""User-facing errors: a clear paragraph and a non-zero exit instead of a traceback."""

from __future__ import annotations

import functools
import os
import sys
import textwrap

# Exit code for a user's mistake (bad flag, missing file...), as argparse uses.
USER_ERROR_EXIT = 2


class UserError(Exception):
    """A mistake the user can fix. The message says what is wrong and what to do."""


def format_user_error(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return "error: " + textwrap.fill(text, width=100, subsequent_indent="       ")


def main_guard(fn):
    """Run a script's main(): UserError becomes one paragraph on stderr and exit code 2.

    Under torchrun every rank may hit the same mistake; rank 0 prints it in full and the
    others print one short line, so the message is not repeated N times.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as err:
            rank = os.environ.get("RANK", "0")
            if rank in ("0", ""):
                print(format_user_error(err), file=sys.stderr, flush=True)
            else:
                print(f"[rank {rank}] stopped: {str(err).splitlines()[0][:120]}", file=sys.stderr, flush=True)
            sys.exit(USER_ERROR_EXIT)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)

    return wrapper
