"""The course notebooks follow the shared conventions (fast, static checks; nbval executes them).

- every `%%writefile` cell is byte-identical to the file it writes (scripts/sync_notebooks.py);
- committed without outputs or execution counts;
- the first code cell is tagged `parameters` and sets PRESET and NPROC; the next one calls setup();
- torchrun is only ever launched through distrinews_course.launch (a bare `!torchrun` cannot fail a notebook);
- a chapter with reference answers (notebooks/answers/<chapter>.py) keeps them off its page: only its solution cells
  load them, through answer(), no cell defines them, and its solution cells are collapsed.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SYNC = ROOT / "scripts" / "sync_notebooks.py"


def _load_sync():
    spec = importlib.util.spec_from_file_location("sync_notebooks", SYNC)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


sync = _load_sync()
ids = [p.stem for p in NOTEBOOKS]


def _code_cells(path):
    return [c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"]


def test_the_course_has_its_chapters():
    names = {p.stem.split("_", 1)[0] for p in NOTEBOOKS}
    assert {"01", "02", "04", "05"} <= names, sorted(names)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_valid_notebook(path):
    nbformat.validate(nbformat.read(str(path), as_version=4))


@pytest.mark.parametrize(
    "path", NOTEBOOKS + sorted((ROOT / "notebooks" / "answers").glob("*.py")), ids=lambda p: p.name
)
def test_every_code_cell_is_valid_python(path):
    """A syntax error in a cell fails here in a second, not after the chapter's launches under nbval."""
    if path.suffix == ".py":
        compile(path.read_text(), str(path), "exec")
        return
    for i, cell in enumerate(_code_cells(path)):
        if cell.source.lstrip().startswith(("%%", "!")):
            continue  # a cell magic (%%writefile: its file is compiled as a script) or a shell line
        source = "\n".join(
            "pass" if line.lstrip().startswith(("%", "!")) else line for line in cell.source.splitlines()
        )
        try:
            compile(source, f"{path.name} code cell {i}", "exec")
        except SyntaxError as err:
            pytest.fail(f"{path.name}, code cell {i} (line {err.lineno}): {err.msg}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_writefile_cells_match_their_files(path):
    problems = sync.check_notebooks([path])
    assert not problems, "\n\n".join(map(str, problems)) + "\n\nfix: python scripts/sync_notebooks.py --write"


def test_training_scripts_are_written_by_their_chapters():
    targets = {c.target: c.notebook.stem for nb in NOTEBOOKS for c in sync.writefile_cells(nb)}
    assert targets.get("scripts/train_single.py", "").startswith("01_")
    assert targets.get("scripts/train_ddp.py", "").startswith("02_")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_committed_without_outputs(path):
    dirty = [i for i, c in enumerate(_code_cells(path)) if c.outputs or c.execution_count is not None]
    assert not dirty, f"{path.name}: code cells {dirty} have outputs or execution counts; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_first_code_cell_is_parameters_then_setup(path):
    cells = _code_cells(path)
    first = cells[0]
    assert "parameters" in first.metadata.get("tags", []), (
        f"{path.name}: the first code cell must be tagged 'parameters'"
    )
    assert re.search(r"^PRESET\s*=", first.source, re.M) and re.search(r"^NPROC\s*=", first.source, re.M), first.source
    assert re.search(r"setup\(PRESET, NPROC\b", cells[1].source), (
        f"{path.name}: the second code cell must call setup(PRESET, NPROC)"
    )
    tagged = [i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", [])]
    assert tagged == [0], f"{path.name}: exactly one parameters cell, the first"


BARE_LAUNCH = re.compile(r"(torchrun|torch\.distributed\.run|torch\.distributed\.launch)")


def bare_launches(source: str) -> list[str]:
    """Lines of a code cell that launch torchrun outside distrinews_course.launch."""
    if source.startswith("%%writefile"):
        return []  # a script's text (its docstring may show the torchrun command line)
    lines = source.splitlines()
    if lines and re.match(r"%%(bash|sh|script|system)\b", lines[0]):
        return [l for l in lines if BARE_LAUNCH.search(l)]
    bad = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith(("!", "%sx", "%system")) and BARE_LAUNCH.search(stripped):
            bad.append(line)
        elif re.search(r"(subprocess\.\w+|os\.system|os\.popen|Popen)\(", stripped) and BARE_LAUNCH.search(stripped):
            bad.append(line)
        elif re.search(r"=\s*!", stripped) and BARE_LAUNCH.search(stripped):
            bad.append(line)
    return bad


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_torchrun_only_through_the_library(path):
    bad = [(i, l) for i, c in enumerate(_code_cells(path)) for l in bare_launches(c.source)]
    assert not bad, (
        f"{path.name}: launch torchrun with distrinews_course.launch.torchrun(...), which fails the cell "
        f"when the script fails; found {bad}"
    )


def test_bare_launch_detector():
    assert bare_launches("!torchrun --nproc_per_node=2 scripts/train_ddp.py")
    assert bare_launches("x = 1\n!python -m torch.distributed.run --standalone scripts/train_ddp.py")
    assert bare_launches("%%bash\ntorchrun --nproc_per_node 2 x.py")
    assert bare_launches("subprocess.run(['torchrun', 'x.py'])")
    assert not bare_launches('torchrun("scripts/train_ddp.py", env.nproc, args, timeout=300)')
    assert not bare_launches('%%writefile scripts/x.py\n"""torchrun --nproc_per_node=2 x.py"""')


def test_sync_detects_and_repairs_a_difference(tmp_path):
    """A %%writefile cell that drifts from its file is reported (exit 1) and --write repairs it."""
    src = next(p for p in NOTEBOOKS if p.stem.startswith("01_"))
    copy = tmp_path / src.name
    nb = nbformat.read(str(src), as_version=4)
    (cell,) = [
        c for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%writefile scripts/train_single.py")
    ]
    cell.source = cell.source.replace("def main():", "def main():  # drifted", 1)
    nbformat.write(nb, str(copy))

    problems = sync.check_notebooks([copy])
    assert len(problems) == 1 and problems[0].kind == "differs" and "# drifted" in problems[0].detail
    run = subprocess.run([sys.executable, str(SYNC), "--check", str(copy)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "differs from scripts/train_single.py" in run.stderr, run.stderr

    assert sync.write_notebooks([copy], log=lambda *a: None) == 1
    assert sync.check_notebooks([copy]) == []
    run = subprocess.run([sys.executable, str(SYNC), "--check", str(copy)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_sync_reports_a_missing_target(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%%writefile scripts/no_such_script_here.py\nprint('hi')")]
    path = tmp_path / "99_x.ipynb"
    nbformat.write(nb, str(path))
    (problem,) = sync.check_notebooks([path])
    assert problem.kind == "missing"


def test_plain_pytest_without_nbval_says_what_to_install(tmp_path):
    import os
    import subprocess
    import sys

    (tmp_path / "nbval.py").write_text('raise ImportError("simulated: nbval is not installed")')
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:nbval", "tests/test_library.py", "-q"],
        env=dict(os.environ, PYTHONPATH=str(tmp_path)),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    assert "nbval is not installed" in r.stdout + r.stderr and "requirements-dev.txt" in r.stdout + r.stderr


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_every_chapter_ends_with_exercises_and_runnable_solutions(path):
    cells = nbformat.read(str(path), as_version=4).cells
    params = cells[[i for i, c in enumerate(cells) if c.cell_type == "code"][0]]
    assert "SOLUTIONS = False" in params.source, f"{path.name}: the parameters cell needs SOLUTIONS = False"
    heads = [i for i, c in enumerate(cells) if c.cell_type == "markdown" and "## Exercises" in c.source]
    assert heads, f"{path.name}: no '## Exercises' section"
    solutions = [c for c in cells[heads[-1] :] if c.cell_type == "code" and "solution" in c.metadata.get("tags", [])]
    assert len(solutions) >= 2, f"{path.name}: {len(solutions)} solution cell(s) after the exercises; at least 2"
    for c in solutions:
        checks = "check(" in c.source or "settle(" in c.source  # settle(): distrinews_course.claims, which checks
        assert "solution(" in c.source and checks, f"{path.name}: a solution must run and check something"


ANSWERS = ROOT / "notebooks" / "answers"
WITH_ANSWERS = [p for p in NOTEBOOKS if (ANSWERS / f"{p.stem}.py").is_file()]


def _defined_functions(source: str) -> set[str]:
    """The names of the functions a cell (or file) defines at any depth; cells with IPython magics define none."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _answer_calls(source: str) -> list[tuple[str, str, bool, str | None]]:
    """(chapter, name, inside a function, the name passed as its flag) for every answer("chapter", "name", ...) call
    with literal arguments."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    calls = []

    def visit(node, in_function):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "answer"
            and len(node.args) >= 2
            and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args[:2])
        ):
            # the third argument: the notebook's SOLUTIONS parameter, which run_course.py --solutions sets (CI sets
            # DISTRINEWS_SOLUTIONS instead, so a call without it passes under nbval and fails for the instructor)
            flag = (
                node.args[2] if len(node.args) > 2 else next((k.value for k in node.keywords if k.arg == "flag"), None)
            )
            calls.append((node.args[0].value, node.args[1].value, in_function, getattr(flag, "id", None)))
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return calls


@pytest.mark.parametrize("path", WITH_ANSWERS, ids=[p.stem for p in WITH_ANSWERS])
def test_answers_stay_off_the_page(path):
    """#31: a learner who writes nothing sees 'not attempted yet' and no answer. The code an exercise asks for lives in
    notebooks/answers/<chapter>.py; the chapter loads its answers with answer() only inside functions (the solutions,
    run by solution() when SOLUTIONS is on), only its own and only ones that exist; no cell but the exercise's own stub
    defines a function of an answer's name; solution cells are collapsed in Jupyter (metadata jupyter.source_hidden)."""
    tree = ast.parse((ANSWERS / f"{path.stem}.py").read_text())
    answers = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    defined = answers | {
        t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
    }
    loaded = []
    for i, c in enumerate(c for c in nbformat.read(str(path), as_version=4).cells if c.cell_type == "code"):
        tags = set(c.metadata.get("tags", []))
        for chapter, name, in_function, flag in _answer_calls(c.source):
            assert in_function, (
                f"{path.name} code cell {i} loads answer {name!r} outside a function: it would run for every learner"
            )
            assert flag == "SOLUTIONS", (
                f"{path.name} code cell {i} loads answer {name!r} without passing SOLUTIONS: run_course.py --solutions "
                "would stop there"
            )
            assert chapter == path.stem, f"{path.name} code cell {i} loads {chapter}'s answer {name!r}"
            loaded.append(name)
        if "exercise" not in tags:
            shown = _defined_functions(c.source) & answers
            assert not shown, (
                f"{path.name} code cell {i} defines {sorted(shown)}, whose reference is in notebooks/answers/"
            )
        if "solution" in tags:
            assert c.metadata.get("jupyter", {}).get("source_hidden") is True, (
                f"{path.name} code cell {i}: a solution cell not collapsed"
            )
    assert loaded, f"{path.name} has an answers file but never loads it"
    assert set(loaded) <= defined, (
        f"{path.name} loads {sorted(set(loaded) - defined)}, which notebooks/answers/{path.stem}.py lacks"
    )


def test_the_answers_check_finds_an_answer_on_the_page():
    """The checks above can fail: an answer defined in a cell, or loaded outside a function, is seen."""
    cell = "def exercise_1():\n    def average_gradients(model, world):\n        pass\n"
    assert _defined_functions(cell) == {"exercise_1", "average_gradients"}
    assert _defined_functions("%%writefile x.py\ndef f(): pass") == set()
    assert _answer_calls('f = answer("00_concepts", "f", SOLUTIONS)') == [("00_concepts", "f", False, "SOLUTIONS")]
    assert _answer_calls('def g():\n    return answer("00_concepts", "f")') == [("00_concepts", "f", True, None)]
