"""The concept and pitfall scripts that notebooks 00 and 03 write: static checks, and the key
symptoms (broken vs fixed) measured with real 2-rank gloo launches."""

import ast
import json
import re

import pytest

from distrinews_lib.distributed import choose_backend
from distrinews_lib.errors import UserError
from distrinews_lib.launch import torchrun

from .helpers import ROOT

PITFALLS = ROOT / "scripts" / "pitfalls"
CONCEPTS = ROOT / "scripts" / "concepts"
SCRIPTS = sorted(PITFALLS.glob("*.py")) + sorted(CONCEPTS.glob("*.py"))


def test_there_are_ten_pitfalls_and_four_concepts():
    assert len([p for p in PITFALLS.glob("[0-9][0-9]_*.py")]) >= 10
    assert len(list(CONCEPTS.glob("[0-9][0-9]_*.py"))) >= 4


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_is_small_plain_torch_with_a_docstring(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    assert ast.get_docstring(tree), "each script starts by saying what it shows"
    imported = {(n.module or "") if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in (n.names if isinstance(n, ast.Import) else [n])}
    assert not any(m.split(".")[0] == "transformers" for m in imported), "keep them fast: no transformers"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_process_group_has_a_timeout(path):
    """So a deliberate (or accidental) hang ends as an error instead of blocking the notebook."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "init_process_group":
            assert any(k.arg == "timeout" for k in node.keywords), f"{path.name}:{node.lineno} init_process_group without timeout"


def test_nccl_is_refused_clearly_without_a_gpu_per_rank():
    with pytest.raises(UserError, match="gloo"):
        choose_backend("nccl", local_world_size=99)


def _run(script, *args, tmp_path, timeout=90, check=True):
    return torchrun(script, 2, [*map(str, args)], timeout=timeout, echo=False, check=check, cwd=ROOT)


@pytest.mark.slow
def test_eval_padding_broken_counts_duplicates_fixed_is_exact(tmp_path):
    out = tmp_path / "eval.json"
    _run(PITFALLS / "06_eval_padding.py", "--mode", "both", "--out", out, tmp_path=tmp_path)
    r = json.loads(out.read_text())
    assert r["broken"]["counted"] == r["padded_to"] == r["n"] + 1
    assert r["broken"]["accuracy"] != pytest.approx(r["truth_accuracy"])
    assert r["fixed"]["counted"] == r["n"]
    assert r["fixed"]["accuracy"] == pytest.approx(r["truth_accuracy"], abs=1e-12)
    assert r["library_evaluate_accuracy"] == pytest.approx(r["truth_accuracy"], abs=1e-12)


@pytest.mark.slow
def test_no_sync_cuts_allreduces_by_the_accumulation_factor(tmp_path):
    out = tmp_path / "nosync.json"
    _run(PITFALLS / "08_no_sync.py", "--mode", "both", "--steps", 2, "--width", 256, "--out", out, tmp_path=tmp_path)
    r = json.loads(out.read_text())
    assert r["broken"]["allreduce_per_step"] == r["accum"] * r["fixed"]["allreduce_per_step"]
    assert r["max_param_diff_broken_vs_fixed"] < 1e-5


@pytest.mark.slow
def test_uneven_inputs_hang_ends_by_itself_and_join_fixes_it(tmp_path):
    res = _run(PITFALLS / "07_uneven_inputs.py", "--mode", "broken", "--ddp_timeout", 2, tmp_path=tmp_path,
               timeout=60, check=False)
    assert not res.ok and not res.timed_out, "the broken run must fail on its own, well before the launcher's limit"
    assert re.search(r"(?i)timed out|timeout", res.output)
    out = str(tmp_path / "uneven_{mode}.json")
    _run(PITFALLS / "07_uneven_inputs.py", "--mode", "fixed", "--out", out, tmp_path=tmp_path)
    r = json.loads((tmp_path / "uneven_fixed.json").read_text())
    assert sorted(r["join"]["steps_per_rank"]) == [3, 4] and r["join"]["max_param_diff"] == 0.0
    assert r["even"]["batches_per_rank"] == [4, 4] and r["even"]["max_param_diff"] == 0.0


@pytest.mark.slow
def test_collective_on_one_rank_times_out_instead_of_hanging(tmp_path):
    res = _run(PITFALLS / "09_one_rank_collective.py", "--mode", "broken", "--ddp_timeout", 2, tmp_path=tmp_path,
               timeout=60, check=False)
    assert not res.ok and not res.timed_out
    waited = [float(w) for w in re.findall(r"waited_s=([\d.]+)", res.output)]
    assert len(waited) == 2 and all(w >= 1.5 for w in waited)
