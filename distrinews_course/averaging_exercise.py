"""Chapter 00's exercise 1: the learner averages the gradients across ranks by hand, with ONE all-reduce for the
whole model (what a DDP bucket does), and a real launch compares the result with DDP's.

    test = averaging_test(nproc=2, timeout=120, folder="outputs/concepts/exercises")
    try_exercise(test, average_gradients)         # 'checked: ...' or one line naming the mistake

The learner's function is written to a file with its imports and run on every rank by
scripts/concepts/05_average_by_hand.py, which counts its dist.all_reduce calls and measures how far the .grad it
leaves is from DDP's, from each rank's own local gradient and from the plain sum. judge() turns that report into
one sentence.
"""

from __future__ import annotations

import inspect
import json
import textwrap
from pathlib import Path

from .attempt import NotYet

SCRIPT = "scripts/concepts/05_average_by_hand.py"
PREAMBLE = "import torch\nimport torch.distributed as dist\n\n"
EXACT = 1e-6  # float32 sums of a handful of numbers: DDP's all-reduce and the learner's agree to ~1e-7
UNCHANGED = 1e-7  # a .grad that still equals the local gradient to this is one the averages never reached


def judge(ranks: list[dict]) -> str | None:
    """None when every rank's .grad equals DDP's after one all-reduce; else the first mistake, in one line."""
    world = len(ranks)
    for r in ranks:
        where = f"rank {r['rank']}: "
        if r["error"]:
            return where + f"your function raised {r['error']}"
        if r["none"]:
            return where + f"{r['none']} .grad became None: write the averages into the existing .grad tensors"
        calls = r["all_reduce_numels"]
        if r["vs_ddp"] < EXACT:
            if len(calls) > 1:
                return (
                    where + f"the right averages, but in {len(calls)} all-reduces (one per tensor): put every "
                    "gradient in one flat buffer and all-reduce it once, as a DDP bucket does"
                )
            continue
        if not calls:
            return where + "no dist.all_reduce call: the ranks never exchanged their gradients"
        if r["vs_local"] < UNCHANGED:
            return (
                where + "the .grad tensors did not change: the all-reduced buffer is a copy, so copy each slice of it "
                "back into its parameter's .grad"
            )
        if r["vs_sum"] < EXACT:
            return where + f"these are the SUM over the {world} ranks, not their mean: divide by world"
        averaged = [d < EXACT for d in r["each_vs_ddp"]]
        untouched = [d < UNCHANGED for d in r["each_vs_local"]]
        if any(averaged) and all(a or u for a, u in zip(averaged, untouched)):
            return (
                where + f"only {sum(averaged)} of the {r['n_params']} parameters got the average: the buffer "
                "must hold every parameter's gradient"
            )
        if r["sorted_vs_ddp"] < EXACT:
            return (
                where + "DDP's values, in the wrong places: copy each slice back into the parameter it came "
                "from, in the same order and shape"
            )
        return where + f"not the mean of the ranks' gradients (off DDP's by up to {r['vs_ddp']:.2e})"
    return None


def write_solution(fn, path: Path) -> None:
    """The learner's function, as source, in a file the launch can run (with the imports the exercise cell has)."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise AssertionError(
            "its source cannot be read: define average_gradients with `def` in a notebook cell"
        ) from None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PREAMBLE + source)


def is_untouched(fn) -> bool:
    """The stub as the notebook gives it: a docstring and `...  # your code here`."""
    try:
        return textwrap.dedent(inspect.getsource(fn)).rstrip().endswith("...  # your code here")
    except (OSError, TypeError):
        return False


def run_solutions(paths, nproc: int, timeout: float, out: Path):
    """One launch of the checking script over every solution file; (the launch's result, the report or None)."""
    from .launch import torchrun

    out = Path(out)
    out.unlink(missing_ok=True)
    argv = [a for p in paths for a in ("--solution", str(p))] + ["--out", str(out)]
    res = torchrun(SCRIPT, nproc, argv, timeout=timeout, echo=False, check=False)
    return res, (json.loads(out.read_text()) if res.ok and out.is_file() else None)


def averaging_test(nproc: int, timeout: float, folder="outputs/concepts/exercises"):
    """The test try_exercise runs on the learner's average_gradients: NotYet for the stub, AssertionError with one
    line for a mistake (a launch that fails, e.g. a collective only one rank calls, says what happened)."""
    folder = Path(folder)

    def test(fn) -> None:
        if is_untouched(fn):
            raise NotYet()
        if nproc < 2:
            raise AssertionError("averaging needs 2 or more ranks to average over: run with NPROC >= 2")
        write_solution(fn, folder / "average_gradients.py")
        res, report = run_solutions([folder / "average_gradients.py"], nproc, timeout, folder / "average_by_hand.json")
        if report is None:
            from .demo import failure_story

            story = failure_story(res).splitlines()[0]
            raise AssertionError(
                f"the launch failed (a collective only some ranks call hangs until its timeout): {story}"
            )
        problem = judge(report["reports"][0])
        if problem:
            raise AssertionError(problem)

    return test
