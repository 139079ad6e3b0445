"""The concept and pitfall scripts that notebooks 00 and 04 write, and the plumbing they share
(distrinews_course.demo): static checks, and the key symptoms (broken vs fixed) measured with real
2-rank gloo launches."""

import ast
import json
import re
from pathlib import Path

import pytest

from distrinews_course import demo as demo_module
from distrinews_course.demo import SharedLaunch, failure_story, sections, show_fix
from distrinews_course.launch import LaunchResult, torchrun
from distrinews_lib.distributed import choose_backend
from distrinews_lib.errors import UserError

from .helpers import ROOT

PITFALLS = ROOT / "scripts" / "pitfalls"
CONCEPTS = ROOT / "scripts" / "concepts"
SCRIPTS = sorted(PITFALLS.glob("*.py")) + sorted(CONCEPTS.glob("*.py"))
DEMO = ROOT / "distrinews_course" / "demo.py"


def test_there_are_thirteen_pitfalls_and_five_concepts():
    assert len([p for p in PITFALLS.glob("[0-9][0-9]_*.py")]) == 13
    assert len(list(CONCEPTS.glob("[0-9][0-9]_*.py"))) == 5


@pytest.mark.parametrize(
    "path",
    [*sorted(CONCEPTS.glob("0[2-9]_*.py")), *sorted(PITFALLS.glob("[0-9][0-9]_*.py"))],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_demo_scripts_share_the_plumbing(path):
    """Concepts 02+ and every pitfall start their group through distrinews_course.demo.

    Concept 01 shows it by hand.
    """
    text = path.read_text()
    assert "from distrinews_course.demo import" in text
    assert "init_process_group" not in text or path.name == "10_nccl_backend.py"  # 10's bug IS a hard-coded init


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_is_small_plain_torch_with_a_docstring(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    assert ast.get_docstring(tree), "each script starts by saying what it shows"
    imported = {
        (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in (n.names if isinstance(n, ast.Import) else [n])
    }
    assert not any(m.split(".")[0] == "transformers" for m in imported), "keep them fast: no transformers"


@pytest.mark.parametrize("path", [*SCRIPTS, DEMO], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_process_group_has_a_timeout(path):
    """So a deliberate (or accidental) hang ends as an error instead of blocking the notebook."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "init_process_group"
        ):
            assert any(k.arg == "timeout" for k in node.keywords), (
                f"{path.name}:{node.lineno} init_process_group without timeout"
            )


def test_chapter_04_shows_each_pitfalls_fix_read_from_its_script():
    """The notebook shows the BUG / FIX lines of every script through show_fix, which reads the file itself:
    what the learner reads is what runs (no copy of the scripts to drift)."""
    import nbformat

    nb = nbformat.read(str(ROOT / "notebooks" / "04_pitfalls.ipynb"), as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "%%writefile" not in code
    for path in sorted(PITFALLS.glob("[0-9][0-9]_*.py")):
        assert f'show_fix(PITFALLS / "{path.name}")' in code, f"04 does not show {path.name}'s fix"
        lines = show_fix(path, echo=False).splitlines()
        assert any(line.startswith("+") for line in lines), f"{path.name}: no line marked FIX"
        assert len(lines) <= 16, f"{path.name}: the fix should read as a few lines, not {len(lines)}"
    for script, n in (("06_eval_padding.py", 1), ("08_no_sync.py", 2)):  # an exercise's answer is not on the page
        lesson = f'show_fix(PITFALLS / "{script}", exercise="exercise {n}")'
        assert lesson in code, f"04 shows {script}'s fix code, which is exercise {n}'s answer"
        solutions = "\n".join(c.source for c in nb.cells if "solution" in c.metadata.get("tags", []))
        assert f'show_fix(PITFALLS / "{script}")' in solutions, f"exercise {n}'s solution does not show {script}'s fix"
        shown = show_fix(PITFALLS / script, echo=False, exercise=f"exercise {n}")
        assert "gather(" not in shown and "no_sync() if" not in shown
        assert script != "08_no_sync.py" or "(loss / args.accum).backward()" in shown  # the loop around the fix


def test_show_fix_for_an_exercise_shows_the_bug_and_only_the_fixs_comment(tmp_path):
    script = tmp_path / "x.py"
    script.write_text("x = 1\ny = 2  # BUG: wrong\nz = 3  # BOTH MODES\n    w = f(x)  # THE FIX: call f\n")
    assert show_fix(script, echo=False, exercise="exercise 9").splitlines()[1:] == [
        "-   2 y = 2  # BUG: wrong",
        "    3 z = 3  # BOTH MODES",
        "+   4     ... (exercise 9)  # THE FIX: call f",
    ]


def test_chapter_04s_set_up_builds_both_launchers_and_starts_nothing():
    from distrinews_course.demo import pitfall_launches

    np_, folder, out, finished, failing = pitfall_launches(1, None, 3)
    assert np_ == 2 and folder == PITFALLS.relative_to(ROOT) and out.name == "pitfalls"
    assert len(finished.runs) == 13 and finished.timeout == 600 and not finished.done and finished.nproc == 2
    assert [s for s, _ in failing.runs] == [
        "07_uneven_inputs.py",
        "09_one_rank_collective.py",
        "10_nccl_backend.py",
        "11_unused_parameters.py",
    ]
    assert pitfall_launches(4, 90, 3)[0] == 4 and pitfall_launches(4, 90, 3)[3].timeout == 90


def test_show_fix_marks_bug_and_fix_lines_with_their_numbers(tmp_path):
    script = tmp_path / "x.py"
    script.write_text(
        '"""BUG and FIX in a docstring are not marks."""\nx = 1\ny = 2  # BUG: wrong\nz = 3\nw = 4\ny = 5  # THE FIX\n'
    )
    assert show_fix(script, echo=False).splitlines()[1:] == [
        "    2 x = 1",
        "-   3 y = 2  # BUG: wrong",
        "     ...",
        "    5 w = 4",
        "+   6 y = 5  # THE FIX",
    ]
    script.write_text("a = 1\nb = 2  # THE FIX\nc = 3  # BOTH MODES: the fix is around it\n")
    assert show_fix(script, echo=False).splitlines()[1:] == [
        "    1 a = 1",
        "+   2 b = 2  # THE FIX",
        "    3 c = 3  # BOTH MODES: the fix is around it",
    ]


def test_nccl_is_refused_clearly_without_a_gpu_per_rank():
    with pytest.raises(UserError, match="gloo"):
        choose_backend("nccl", local_world_size=99)


def _run(script, *args, tmp_path, timeout=90, check=True):
    return torchrun(script, 2, [*map(str, args)], timeout=timeout, echo=False, check=check, cwd=ROOT)


@pytest.mark.also_in_notebook
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


@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_no_sync_cuts_allreduces_by_the_accumulation_factor(tmp_path):
    out = tmp_path / "nosync.json"
    _run(PITFALLS / "08_no_sync.py", "--mode", "both", "--steps", 2, "--width", 256, "--out", out, tmp_path=tmp_path)
    r = json.loads(out.read_text())
    assert r["broken"]["allreduce_per_step"] == r["accum"] * r["fixed"]["allreduce_per_step"]
    assert r["max_param_diff_broken_vs_fixed"] < 1e-5


@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_uneven_inputs_hang_ends_by_itself_and_join_fixes_it(tmp_path):
    res = _run(
        PITFALLS / "07_uneven_inputs.py",
        "--mode",
        "broken",
        "--ddp_timeout",
        2,
        tmp_path=tmp_path,
        timeout=60,
        check=False,
    )
    assert not res.ok and not res.timed_out, "the broken run must fail on its own, well before the launcher's limit"
    assert re.search(r"(?i)timed out|timeout", res.output)
    out = str(tmp_path / "uneven_{mode}.json")
    _run(PITFALLS / "07_uneven_inputs.py", "--mode", "fixed", "--out", out, tmp_path=tmp_path)
    r = json.loads((tmp_path / "uneven_fixed.json").read_text())
    assert sorted(r["join"]["steps_per_rank"]) == [3, 4] and r["join"]["max_param_diff"] == 0.0
    assert r["even"]["batches_per_rank"] == [4, 4] and r["even"]["max_param_diff"] == 0.0


@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_collective_on_one_rank_times_out_instead_of_hanging(tmp_path):
    res = _run(
        PITFALLS / "09_one_rank_collective.py",
        "--mode",
        "broken",
        "--ddp_timeout",
        2,
        tmp_path=tmp_path,
        timeout=60,
        check=False,
    )
    assert not res.ok and not res.timed_out
    waited = [float(w) for w in re.findall(r"waited_s=([\d.]+)", res.output)]
    # the first rank to time out exits, and torchrun may stop the other before it reports: 1 or 2 reports
    assert 1 <= len(waited) <= 2 and all(w >= 1.5 for w in waited)


def _result(output, seconds=4.0, returncode=1):
    return LaunchResult([], returncode, output, seconds, False, output.splitlines())


def test_failure_story_tells_rank_error_wait_and_exit_code_in_a_few_lines():
    tb = "\n".join(f'[rank{r}]:   File "x.py", line {i}, in <module>' for r in (0, 1) for i in range(15))
    output = "\n".join(
        [
            "RESULT rank=0 mode=broken error=RuntimeError waited_s=3.1",
            "[rank 0] RuntimeError: [/__w/pytorch/third_party/gloo/unbound_buffer.cc:78] Timed out waiting 3000ms for recv",  # noqa: E501
            tb,
            "[rank1]: ValueError: SyncBatchNorm layers only work with GPU modules",
            "Failures:",
            "[1]:",
            "  rank      : 0 (local_rank: 0)",
            "  exitcode  : -15 (pid: 124)  (SIGTERM)",
            "Root Cause (first observed failure):",
            "[0]:",
            "  rank      : 1 (local_rank: 1)",
            "  exitcode  : 1 (pid: 123) ",
            "  traceback : To enable traceback see: https://pytorch.org",
        ]
    )
    story = failure_story(_result(output)).splitlines()
    assert story == [
        "rank 0: RuntimeError: Timed out waiting 3000ms for recv  [waited_s=3.1]",
        "rank 1: ValueError: SyncBatchNorm layers only work with GPU modules",
        "torchrun: rank 0 exit code -15 (SIGTERM), rank 1 exit code 1 (torchrun's Root Cause)",
        "launch ended by itself after 4.0 s with exit code 1",
    ]
    assert failure_story(_result("something else\nentirely")).splitlines()[0] == "something else"


def test_sections_split_a_shared_launch_per_script():
    out = (
        "noise\n=== demo: a.py --mode x\nA1\nA2\n=== demo: done in 0.1 s\n"
        "=== demo: b.py\r\nB1\n=== demo: done in 0.2 s\n"
    )
    assert sections(out) == {"a.py": "A1\nA2\n", "b.py": "B1\n"}


def test_shared_launch_runs_everything_once_then_only_an_edited_script(tmp_path, monkeypatch):
    scripts = {name: tmp_path / name for name in ("a.py", "b.py")}
    for name, path in scripts.items():
        path.write_text(f"# {name}\n")
    (tmp_path / "a.json").write_text("{}")
    launches = []

    def fake_torchrun(script, nproc, args, **kwargs):
        assert script == "distrinews_course.demo" and kwargs["module"] is True
        names = [Path(a).name for i, a in enumerate(args) if i == 0 or args[i - 1] == "--"]
        launches.append(names)
        (tmp_path / "a.json").write_text(json.dumps({"run": len(launches)}))
        output = "".join(f"=== demo: {n}\nout of {n} #{len(launches)}\n=== demo: done in 0.1 s\n" for n in names)
        return LaunchResult([], 0, output, 1.0)

    monkeypatch.setattr(demo_module, "torchrun", fake_torchrun)
    run = SharedLaunch([(scripts["a.py"], ["--x", 1], tmp_path / "a.json"), (scripts["b.py"], [], None)], 2, 60)
    assert run("b.py", echo=False) == ("out of b.py #1\n", None)
    assert run("a.py", echo=False) == ("out of a.py #1\n", {"run": 1})  # kept from the one launch
    assert launches == [["a.py", "b.py"]]
    scripts["a.py"].write_text("# a.py, edited\n")
    assert run("a.py", echo=False) == ("out of a.py #2\n", {"run": 2})
    assert run("b.py", echo=False)[0] == "out of b.py #1\n"
    assert launches == [["a.py", "b.py"], ["a.py"]]


@pytest.fixture(scope="module")
def shared_launch(tmp_path_factory):
    """ONE launch (python -m distrinews_course.demo) running the new pitfalls' fixed runs and concept 02."""
    tmp = tmp_path_factory.mktemp("shared")
    run = SharedLaunch(
        [
            (
                PITFALLS / "11_unused_parameters.py",
                ["--mode", "fixed", "--out", tmp / "unused_{mode}.json"],
                tmp / "unused_fixed.json",
            ),
            (PITFALLS / "12_batchnorm.py", ["--out", tmp / "bn.json"], tmp / "bn.json"),
            (PITFALLS / "13_lr_scaling.py", ["--out", tmp / "lr.json"], tmp / "lr.json"),
            (
                CONCEPTS / "02_ddp_backward.py",
                ["--bucket_cap_mb", 1, "--out", tmp / "backward.json"],
                tmp / "backward.json",
            ),
        ],
        2,
        180,
    )
    results = {
        key: run(name, echo=False)
        for key, name in [
            ("unused", "11_unused_parameters.py"),
            ("bn", "12_batchnorm.py"),
            ("lr", "13_lr_scaling.py"),
            ("backward", "02_ddp_backward.py"),
        ]
    }
    return {key: data for key, (_, data) in results.items()}, {key: output for key, (output, _) in results.items()}


@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_one_launch_runs_several_scripts_in_one_process_group(shared_launch):
    outputs = shared_launch[1]
    assert "RESULT rank=0 mode=fixed" in outputs["unused"] and "RESULT rank=1 mode=fixed" in outputs["bn"]
    assert "2 bucket all-reduces" in outputs["backward"]


@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_unused_parameter_breaks_plain_ddp_and_both_fixes_train(shared_launch, tmp_path):
    res = _run(PITFALLS / "11_unused_parameters.py", "--mode", "broken", tmp_path=tmp_path, timeout=60, check=False)
    assert not res.ok and not res.timed_out
    assert "Expected to have finished reduction in the prior iteration" in res.output
    assert set(re.findall(r"failed_at_step=(\d+)", res.output)) == {
        "1"
    }  # each rank that reported before torchrun stopped it
    assert len(failure_story(res).splitlines()) <= 4
    r = shared_launch[0]["unused"]
    skipped = [s for s, used in enumerate(r["aux_used"]) if not used]
    assert r["find_unused"]["max_param_diff"] == 0.0 and r["static_graph"]["max_param_diff"] == 0.0
    assert all(r["find_unused"]["no_grad"][s] == ["aux.weight", "aux.bias"] for s in skipped)
    assert set(r["find_unused"]["numbers_per_step"]) == {r["n_params"]}  # the unused head's zeros travel too


@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_batchnorm_per_rank_statistics_differ_and_sync_matches_the_global_batch(shared_launch):
    r = shared_launch[0]["bn"]
    assert r["broken"]["mean_diff_between_ranks"] > 1e-3 and r["broken"]["mean_diff_to_global"] > 1e-3
    assert r["fixed"]["mean_diff_between_ranks"] == 0.0
    assert (
        max(r["fixed"]["mean_diff_to_global"], r["fixed"]["var_diff_to_global"], r["fixed"]["weight_diff_to_global"])
        < 1e-5
    )


@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_linear_lr_scaling_recovers_what_the_same_lr_loses(shared_launch):
    r = shared_launch[0]["lr"]
    one, broken, fixed = (c[-1] for c in (r["one_process"], r["broken"]["curve"], r["fixed"]["curve"]))
    assert one[0] == broken[0] == fixed[0] == r["n_train"]
    assert broken[1] - one[1] > 0.1 and one[2] - broken[2] > 0.05
    assert abs(fixed[1] - one[1]) < 0.02 and abs(fixed[2] - one[2]) < 0.02


@pytest.mark.also_in_notebook
@pytest.mark.slow
def test_bucket_timeline_records_launch_and_completion(shared_launch):
    for rank in shared_launch[0]["backward"]["ranks"]:
        step = rank["steps"][-1]
        assert len(step["buckets"]) == 2  # 6 layers of 256x256 (+bias) at 1 MiB: 4 layers fill the first bucket
        assert all(b["launched"] <= b["done"] <= step["backward_s"] for b in step["buckets"])
        assert step["buckets"][0]["launched"] < step["grad_ready"][-1][0]  # communication overlapped backward
        assert [i for _, i in step["grad_ready"]] == list(range(rank["n_tensors"]))[::-1]
