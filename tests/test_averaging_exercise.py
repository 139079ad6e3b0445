"""Chapter 00's exercise 1 (distrinews_course.averaging_exercise): the reference answer passes on a real 2-rank gloo
launch, and each mistake the checker claims to catch (one mutant per mistake, all in that same launch) is named in
one line. The stub is 'not written yet' without a launch."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

from distrinews_course import averaging_exercise as A
from distrinews_course.attempt import try_exercise

ROOT = Path(__file__).resolve().parent.parent

REFERENCE = (ROOT / "notebooks/answers/00_concepts.py").read_text()

# Each mutant: the learner's function with one mistake, and the words its one line must hold.
MUTANTS = {
    "sum_not_mean": (
        """
        def average_gradients(model, world):
            grads = [p.grad for p in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        """,
        "SUM over the 2 ranks, not their mean",
    ),
    "never_copied_back": (
        """
        def average_gradients(model, world):
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            dist.all_reduce(flat)
            flat /= world
        """,
        "did not change: the all-reduced buffer is a copy",
    ),
    "one_all_reduce_per_tensor": (
        """
        def average_gradients(model, world):
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        """,
        "in 4 all-reduces (one per tensor)",
    ),
    "slices_in_the_wrong_places": (
        """
        def average_gradients(model, world):
            grads = [p.grad for p in model.parameters()]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat /= world
            offset = 0
            for g in reversed(grads):
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        """,
        "DDP's values, in the wrong places",
    ),
    "weights_only": (
        """
        def average_gradients(model, world):
            grads = [p.grad for n, p in model.named_parameters() if n.endswith("weight")]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat /= world
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        """,
        "only 2 of the 4 parameters got the average",
    ),
    "no_collective": (
        """
        def average_gradients(model, world):
            for p in model.parameters():
                p.grad /= world
        """,
        "no dist.all_reduce call",
    ),
    "grad_set_to_none": (
        """
        def average_gradients(model, world):
            for p in model.parameters():
                p.grad = None
        """,
        ".grad became None",
    ),
    "raises": (
        """
        def average_gradients(model, world):
            flat = torch.cat([p.grad for p in model.parameters()])
        """,
        "your function raised RuntimeError",
    ),
}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One real launch over the reference answer and every mutant: {name: the 2 ranks' reports}."""
    folder = tmp_path_factory.mktemp("averaging")
    files = {"reference": folder / "reference.py"}
    files["reference"].write_text(REFERENCE)
    for name, (source, _) in MUTANTS.items():
        files[name] = folder / f"{name}.py"
        files[name].write_text(A.PREAMBLE + textwrap.dedent(source))
    res, report = A.run_solutions(list(files.values()), nproc=2, timeout=120, out=folder / "report.json")
    assert report is not None, res.output[-3000:]
    return dict(zip(files, report["reports"]))


def test_the_reference_answer_gives_ddps_gradients_in_one_all_reduce(launched):
    ranks = launched["reference"]
    assert A.judge(ranks) is None
    assert all(len(r["all_reduce_numels"]) == 1 and r["all_reduce_numels"][0] == r["total_numel"] for r in ranks)


@pytest.mark.parametrize("name", list(MUTANTS))
def test_each_mistake_is_named_in_one_line(launched, name):
    problem = A.judge(launched[name])
    assert problem is not None and MUTANTS[name][1] in problem, problem
    assert "\n" not in problem


def test_the_stub_is_not_attempted_yet_and_launches_nothing(tmp_path, capsys):
    (tmp_path / "cell.py").write_text(
        'def average_gradients(model, world):\n    """doc"""\n    ...  # your code here\n'
    )
    spec = importlib.util.spec_from_file_location("cell", tmp_path / "cell.py")
    cell = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cell)
    assert not try_exercise(A.averaging_test(2, 60, tmp_path / "out"), cell.average_gradients)
    assert "not written yet" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def test_a_world_of_one_is_refused_in_one_line(tmp_path):
    spec = importlib.util.spec_from_file_location("ref", ROOT / "notebooks/answers/00_concepts.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    with pytest.raises(AssertionError, match="2 or more ranks"):
        A.averaging_test(1, 60, tmp_path)(ref.average_gradients)


def test_judge_reads_a_report_without_a_launch():
    """The order of the verdicts: a right result in one all-reduce passes; the same values in many all-reduces
    do not."""
    right = dict(
        rank=0,
        error=None,
        none=0,
        all_reduce_numels=[10],
        vs_ddp=0.0,
        vs_sum=1.0,
        vs_local=1.0,
        each_vs_ddp=[0.0],
        each_vs_local=[1.0],
        sorted_vs_ddp=0.0,
        n_params=1,
    )
    assert A.judge([right, dict(right, rank=1)]) is None
    assert "in 3 all-reduces" in A.judge([dict(right, all_reduce_numels=[4, 4, 2])])
