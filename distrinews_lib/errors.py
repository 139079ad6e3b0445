"""User-facing errors: a clear paragraph and a non-zero exit instead of a traceback."""

from __future__ import annotations

import functools
import os
import sys
import textwrap
import traceback

USER_ERROR_EXIT = 2  # a user's mistake (bad flag, missing file...), as argparse uses
COLLECTIVE_TIMEOUT_EXIT = 3  # a collective timed out (another rank died, hangs, or skipped a collective)
_TIMEOUT_SIGNS = ("timed out", "timeout", "connection closed by peer", "connection reset by peer")


class UserError(Exception):
    """A mistake the user can fix. The message says what is wrong and what to do."""


def first_line(err: BaseException, limit: int) -> str:
    """An error's first line, at most `limit` characters, cut at a sentence or word boundary and marked "…" when cut:
    a quoted library error must not end mid-word ("caused by a remo")."""
    line = (str(err).splitlines() or [""])[0].strip()
    if len(line) <= limit:
        return line
    cut = line[:limit]
    end = cut.rfind(". ")
    cut = cut[: end + 1] if end >= limit // 2 else cut[: cut.rfind(" ")] if " " in cut else cut
    return cut.rstrip() + " …"


def format_user_error(err: BaseException) -> str:
    text = " ".join(str(err).split())
    # Lines break at spaces only: a path or a flag (/tmp/pytest-of-root/x.pt, --max-queue) stays whole, to be copied.
    return "error: " + textwrap.fill(
        text, width=100, subsequent_indent="       ", break_on_hyphens=False, break_long_words=False
    )


def _say(text: str) -> None:
    """One write of the whole paragraph and its newline: the ranks share one pipe, and a line written in two
    pieces can have another rank's line land in the middle of it."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def tell_hang_doctor(err: BaseException) -> None:
    """The hang doctor (--debug_hangs), when this run armed it, hears of the error first and names the culprit rank.
    Looked up, not imported: a run without it loads none of it."""
    doctor = sys.modules.get("distrinews_lib.hang_doctor")
    if doctor is not None:
        doctor.on_error(err)


def main_guard(fn):
    """Run a script's main(): UserError becomes one paragraph on stderr and exit code 2, in full on rank 0
    only (every rank may hit the same mistake; the others print one short line)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as err:
            rank = os.environ.get("RANK", "0")
            if rank in ("0", ""):
                _say(format_user_error(err))
            else:
                _say(f"[rank {rank}] stopped: {first_line(err, 120)}")
            sys.exit(USER_ERROR_EXIT)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)
        except RuntimeError as err:  # DistBackendError is a RuntimeError too
            if getattr(err, "from_children", False) or not any(s in str(err).lower() for s in _TIMEOUT_SIGNS):
                raise  # a launcher's error quoting its children's output is their failure, not this rank's timeout
            tell_hang_doctor(err)
            rank = os.environ.get("RANK", "0")
            _say(
                format_user_error(
                    f"[rank {rank}] a collective operation could not complete: it waited longer than the process "
                    f"group's timeout (--ddp_timeout), or a peer's connection dropped. "
                    f"Likely cause: another rank died, "
                    f"hangs, or skipped a collective "
                    f"(uneven numbers of batches per rank, a collective inside `if rank == 0:`, a rank stuck in I/O). "
                    f"Look above for the first rank that failed. ({first_line(err, 160)})"
                )
            )
            sys.exit(COLLECTIVE_TIMEOUT_EXIT)

    return wrapper


def exit_code_of(fn) -> int:
    """Run fn() and return the exit code Python would have ended with. fn's return value is the code when it is
    an int (None is 0); any other value is a result (bench_train's main returns its JSON), not a failure, so 0,
    as `main()` in a script ends. A SystemExit follows sys.exit's rules (anything but None or an int is printed
    and is 1), and an uncaught exception is 1 after its traceback is printed."""
    try:
        returned = fn()
    except SystemExit as exit_:
        code = exit_.code
    except BaseException as err:  # noqa: BLE001  (printed like Python's own handler; the caller exits non-zero)
        tell_hang_doctor(err)
        traceback.print_exc()
        return 1
    else:
        return returned if isinstance(returned, int) and not isinstance(returned, bool) else 0
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1
