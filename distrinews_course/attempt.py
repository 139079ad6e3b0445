"""Grading the code a learner writes in an exercise cell, and the predictions they write down before a run.

    from distrinews_course.attempt import grade, judge_prediction, try_exercise, NotYet

    def pick_snapshot(run_dir):          # the learner's cell (tagged `exercise`)
        raise NotImplementedError        # ... until they write it

    grade(pick_snapshot, [("two good snapshots", (folder,), lambda got: None if got == want else "..."), ...])

A learner's mistake gets one precise sentence (which case, what came back, what was expected), never a traceback
wall or a hang: an exception becomes its type, message and the learner's line that raised it; a call that runs
past its time limit is interrupted. A function still raising NotImplementedError is "not attempted yet", which is
not a failure: the notebook runs through before the learner has written anything.

Two ways to grade, one module: `grade(fn, cases)` when the cases are a list of inputs and judges;
`try_exercise(test, fn)` when one test function exercises the learner's code (raising AssertionError with the
precise message, or NotYet for the untouched stub), e.g. a check that needs a launch.
"""

from __future__ import annotations

import ast
import inspect
import signal
import textwrap
import threading
import traceback
from dataclasses import dataclass, field


class _TooSlow(Exception):
    pass


@dataclass
class Grade:
    name: str
    attempted: bool
    passed: list = field(default_factory=list)  # the cases that passed, in order
    failed: str | None = None  # the first failure, in one sentence

    @property
    def ok(self) -> bool:
        return self.attempted and self.failed is None


def _where(err: BaseException) -> str:
    # The innermost frame that is the learner's code (a notebook cell), else the innermost of all.
    frames = traceback.extract_tb(err.__traceback__)
    mine = [
        f
        for f in frames
        if f.filename.startswith("<ipython-input")
        or "ipykernel" in f.filename
        or f.filename.startswith("/tmp/ipykernel")
    ]
    f = (mine or frames or [None])[-1]
    return f" (at `{f.line}`)" if f is not None and f.line else ""


def is_stub(fn) -> bool:
    """True for a function whose body only raises NotImplementedError (comments and a docstring aside)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    body = [s for s in tree.body[0].body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or body[0].exc is None:
        return False
    exc = body[0].exc.func if isinstance(body[0].exc, ast.Call) else body[0].exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def call_with_limit(fn, args=(), timeout: float = 20):
    """fn(*args), interrupted after `timeout` seconds where a timer signal can do it (Unix, main thread)."""
    use_alarm = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not use_alarm:
        return fn(*args)

    def too_slow(signum, frame):
        raise _TooSlow()

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def grade(fn, cases, *, timeout: float = 20, quiet: bool = False) -> Grade:
    """Run `fn` on each case (what, args, judge); judge(value) returns None when right, else what is wrong.

    `cases` may be a function that builds the list, called only once `fn` is more than a stub (building cases can
    cost a model's forward pass or copies of files). Stops at the first failing case and says which, with what to fix.
    Prints one line per case.
    """
    name = getattr(fn, "__name__", "your function")
    say = (lambda *a: None) if quiet else print
    result = Grade(name, attempted=True)
    not_yet = (
        f"{name}: not attempted yet (it still raises NotImplementedError). Write it in the exercise cell "
        "above, run that cell, then this one."
    )
    if is_stub(fn):
        result.attempted = False
        say(not_yet)
        return result
    for what, args, judge in cases() if callable(cases) else cases:
        try:
            got = call_with_limit(fn, args, timeout)
        except NotImplementedError:
            result.attempted = False
            say(not_yet)
            return result
        except _TooSlow:
            result.failed = f"case '{what}': {name} did not return within {timeout:.0f} s (an endless loop?)"
        except Exception as err:  # the learner's bug, reported in one line
            first = (str(err).splitlines() or [""])[0][:200]
            result.failed = f"case '{what}': {name} raised {type(err).__name__}: {first}{_where(err)}"
        else:
            try:
                problem = judge(got)
            except Exception as err:  # a value of the wrong shape
                problem = f"it returned {got!r:.120}, which could not be checked ({type(err).__name__}: {err})"
            if problem:
                result.failed = f"case '{what}': {problem}"
        if result.failed:
            say(f"✗ {result.failed}")
            return result
        result.passed.append(what)
        say(f"✓ {what}")
    say(f"{name} passes all {len(result.passed)} cases")
    return result


def judge_prediction(name: str, predicted, actual, *, right: bool | None = None, why: str = "") -> bool | None:
    """Compare a prediction written down before a run with what the run did; None when none was written."""
    if predicted is None:
        print(f"{name}: no prediction written down (it is None). The run gave {actual!r}. {why}".rstrip())
        return None
    ok = (predicted == actual) if right is None else right
    print(
        f"{name}: you predicted {predicted!r}, the run gave {actual!r}: "
        f"{'right' if ok else 'not quite'}. {why}".rstrip()
    )
    return ok


class NotYet(Exception):
    """Raised by an exercise's test when the learner's function is still the stub (returns None / Ellipsis)."""


def try_exercise(test, fn, strict=False) -> bool:
    """Run an exercise's `test(fn)` on the learner's function and say, in a line or two, what is wrong.

    test(fn) raises AssertionError("precise message") for a wrong answer, NotYet for the untouched stub.
    A crash in the learner's code is reported as its error and the line of the learner's cell it came
    from, not as a traceback. strict=True (the solution cells, CI) fails the notebook when the test fails."""
    name = getattr(fn, "__name__", "your function")
    try:
        test(fn)
    except NotYet as why:
        print(
            f"'{name}' is not written yet{': ' + str(why) if str(why) else ''}. Write it in the cell above, "
            "run it, then run this cell again."
        )
        if strict:
            raise AssertionError(f"the solution of '{name}' is still a stub") from None
        return False
    except AssertionError as why:
        print(f"not yet: {why}")
        if strict:
            raise AssertionError(f"claim failed: the solution of '{name}' passes its test ({why})") from None
        return False
    except Exception as err:  # the learner's code crashed: say where, in one line
        frames = [
            f for f in traceback.extract_tb(err.__traceback__) if f.name == name or "ipykernel" in (f.filename or "")
        ]
        where = f" (line {frames[-1].lineno} of '{name}': {frames[-1].line})" if frames else ""
        print(f"'{name}' raised {type(err).__name__}: {err}{where}")
        if strict:
            raise AssertionError(f"the solution of '{name}' raised {type(err).__name__}: {err}") from None
        return False
    print(f"checked: '{name}' passes every case of its test")
    return True


def written_number(name: str, value, example: str, actual: str) -> float | None:
    """A number the learner wrote down before a run (the variable `name`), or None after one line that says what to
    write: nothing written (None) says what the run gave (`actual`); anything but a number asks for one."""
    if value is None:
        print(f"no prediction written ({name} is None); {actual}")
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        print(f"{name} = {value!r}: write a number, e.g. {example}")
        return None
    return float(value)
