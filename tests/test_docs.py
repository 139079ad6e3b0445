"""The README and docs/: their generated parts are what scripts/make_docs.py makes now, every figure they state is
held by a record they cite, the README reads as a guide (its headings, its two commands, its size, no hash, no
issue number, no long paragraph), every link lands, and no page names a path of the machine that wrote it."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from distrinews_course.docgen import blocks, chapters, figures, layout, tables

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def outside_code(text: str) -> str:
    """Prose and tables of a page: fenced code blocks and inline code left out."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "``", text)


# --------------------------------------------------------------------------- generated, and traced to records


def test_every_generated_block_is_what_make_docs_makes_now():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_docs.py"), "--check"], capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    make = tables.generators()
    for page in PAGES:
        assert not blocks.stale(page.read_text(), make, rel(page)), rel(page)
    assert {"chapters", "layout", "docs-index"} <= set(blocks.names(README.read_text()))


def test_every_figure_on_the_readme_and_in_docs_is_held_by_a_record_it_cites():
    problems = [p for page in PAGES for p in figures.unbacked(page.read_text(), rel(page))]
    assert not problems, "\n".join(problems)


RECORD = "benchmarks/train_cpu2-intel-r-xeon-r.json"  # headline: ours over Trainer's defaults 2.1515x


@pytest.mark.parametrize(
    "page, problem",
    [
        ("## A\n\nIt took 812 s on the course's CPU.\n", "cites no record"),  # a figure with no record named
        (f"## A\n\nOurs ran 2.35x Trainer's speed ([r]({RECORD})).\n", "is in none of"),  # a figure the record lacks
        ("## A\n\nIt took 812 s, see `benchmarks/nosuch.json`.\n", "does not exist"),
        (f"## A\n\nOurs ran 2.15x Trainer's speed ([r]({RECORD})).\n\n## B\n\nAgain 2.15x.\n", "'2.15x' under 'B'"),
    ],
)
def test_the_figure_check_fails_a_figure_no_record_holds(page, problem):
    found = figures.unbacked(page, "page.md")
    assert len(found) == 1 and problem in found[0], found


def test_the_figure_check_takes_records_in_the_pages_units_and_leaves_settings_alone():
    page = (
        f"## A\n\nOurs ran 2.15x Trainer's speed, 2 processes 64% efficient at batch 64 ([r]({RECORD})).\n\n"
        "## B\n\nEach part runs at most 10 minutes, within 15%, on 2 cores; `--port 8000 --timeout 30 s`.\n"
        "```\npytest -n 2   # 5 s\n```\n"
    )
    assert figures.unbacked(page, "page.md") == []
    assert [f.text for f in figures.figures(page)] == ["2.15x", "64%"]


# --------------------------------------------------------------------------- the README as a guide


def test_the_readme_is_a_guide_a_newcomer_reads_in_two_minutes():
    text = README.read_text()
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[:4] == ["Run the course", "Run the tests", "On Kaggle (2x T4)", "On Colab"], headings
    assert {"The chapters", "Layout", "More"} <= set(headings)
    assert "bash scripts/setup_env.sh && .venv/bin/python scripts/run_course.py --html" in text
    assert "bash scripts/setup_env.sh && .venv/bin/python -m pytest -n 2" in text
    words = len(re.sub(r"<!--.*?-->", "", text, flags=re.S).split())
    assert words <= 1600, f"the README has {words} words; keep it near 1,500 (the rest goes to docs/)"
    for section in ("On Kaggle (2x T4)", "On Colab"):
        body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
        steps = re.findall(r"^(\d+)\. ", body, flags=re.M)
        assert steps == [str(i) for i in range(1, len(steps) + 1)] and 3 <= len(steps) <= 6, (section, steps)


def test_no_paragraph_runs_over_eight_lines():
    for page in PAGES:
        prose = re.sub(r"<!-- generated: ([\w-]+) -->.*?<!-- end: \1 -->", "", page.read_text(), flags=re.S)
        prose = re.sub(r"```.*?```", "", prose, flags=re.S)
        for para in re.split(r"\n\s*\n|\n(?=- |\d+\. )", prose):  # a list item is a paragraph of its own
            lines = [x for x in para.splitlines() if x.strip() and not x.lstrip().startswith("|")]
            assert len(lines) <= 8, f"{rel(page)}: a paragraph of {len(lines)} lines: {lines[0][:80]}"


def test_no_commit_hash_no_issue_number_and_no_path_of_the_machine_that_wrote_it():
    hash_ = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![\w-])")
    for page in PAGES:
        text = re.sub(r"\]\([^)]*\)", "]()", outside_code(page.read_text()))  # link targets may hold numbers
        assert not hash_.findall(text), f"{rel(page)}: commit hash(es) {hash_.findall(text)}"
        assert not re.findall(r"(?<![\w&])#\d+|\bissues? \d+", text), f"{rel(page)}: an issue number"
    for path in [*PAGES, ROOT / "scripts" / "gpu_session.sh", ROOT / "scripts" / "gpu_wheels.py",
                 ROOT / "scripts" / "pack.py", ROOT / "scripts" / "pack_install.sh"]:  # fmt: skip
        text = path.read_text()
        for local in ("/work/", "/root/", "/tmp/pytest", ".library"):
            assert local not in text, f"{rel(path)} names {local}, a path of the machine that wrote it"
    for path in (ROOT / "scripts" / "gpu_session.sh", ROOT / "scripts" / "gpu_wheels.py", ROOT / "docs" / "gpu.md"):
        text = path.read_text().lower()
        assert not re.search(r"\blent\b|device calls?\b", text), f"{rel(path)}: say what the session runs"


def test_every_relative_link_lands_on_a_file():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://", "#", "mailto:")):
                continue
            assert (page.parent / target.split("#")[0]).exists(), f"{rel(page)} links {target}, which is not there"


def test_the_readmes_commands_are_true():
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_course_for_docs", ROOT / "scripts" / "run_course.py")
    runner = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = runner  # its dataclasses look their module up while it loads
    spec.loader.exec_module(runner)
    assert runner.parse_args(["--html"]).html and runner.parse_args(["--only", "02"]).only == "02"
    import xdist  # noqa: F401  pytest -n 2 needs it, from requirements-dev.txt

    assert (ROOT / "scripts" / "setup_env.sh").is_file() and (ROOT / "scripts" / "pack.py").is_file()


# --------------------------------------------------------------------------- generated from the notebooks and the tree


def notebook(cells: list[tuple[str, str]]) -> dict:
    return {"cells": [{"cell_type": t, "metadata": {}, "source": s} for t, s in cells], "metadata": {}}


def test_a_new_chapter_appears_in_the_table_and_a_changed_one_is_marked(tmp_path):
    nbs, bench = tmp_path / "notebooks", tmp_path / "benchmarks"
    nbs.mkdir(), bench.mkdir()
    intro = (
        "# {n} · {t}\n\n**You will be able to** find the rank that hangs, name its collective, and fix it (exercise 1)."
    )
    for n, t in (("00", "Concepts"), ("12", "Hangs: when a collective never returns")):
        (nbs / f"{n}_x.ipynb").write_text(json.dumps(notebook([("markdown", intro.format(n=n, t=t)), ("code", "1")])))
    digest = chapters.read_chapter(nbs / "00_x.ipynb").digest
    rows = [{"chapter": "00_x", "status": "ok", "seconds": 90.0, "digest": digest},
            {"chapter": "12_x", "status": "ok", "seconds": 30.0, "digest": "old"}]  # fmt: skip
    record = {"benchmark": "chapters", "kind": "cpu", "device": "2 CPU cores, X", "preset": "cpu_smoke",
              "updated": "2026-12-07", "chapters": rows}  # fmt: skip
    (bench / "chapters_x.json").write_text(json.dumps(record))
    table = tables.chapter_table("", nbs, bench)
    row00, row12 = [line for line in table.splitlines() if line.startswith(("| 00 ", "| 12 "))]
    assert "**Concepts**: find the rank that hangs, name its collective, and fix it |" in row00
    assert row00.endswith("| 1.5 min | – |") and row12.endswith("| 0.5 min† | – |")
    assert "**Hangs**" in row12 and "(exercise" not in table


def test_record_run_keeps_each_chapters_time_and_digest(tmp_path):
    run = tmp_path / "runs" / "20261207-000000"
    run.mkdir(parents=True)
    nb = notebook([("markdown", "# 00 · A"), ("code", "x = 1")])
    executed = {**nb, "cells": [{"cell_type": "code", "metadata": {"tags": ["injected-parameters"]}, "source": "P=1"},
                                *nb["cells"]]}  # fmt: skip
    (run / "00_a.ipynb").write_text(json.dumps(executed))
    summary = {"preset": "auto", "nproc": "auto", "seconds": 12.0, "started": "2026-12-07 00:00:00 UTC",
               "machine": {"cpu_count": 2, "processor": "AMD EPYC", "git_commit": "abc1234"},
               "notebooks": [{"name": "00_a", "status": "ok", "seconds": 12.04, "headline": "fine",
                              "record": {"preset": "cpu_smoke"}}]}  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    path = chapters.record_run(run, folder=tmp_path)
    data = json.loads(path.read_text())
    assert path.name == "chapters_cpu2-amd-epyc.json" and data["kind"] == "cpu" and data["preset"] == "cpu_smoke"
    assert data["chapters"] == [{**data["chapters"][0], "chapter": "00_a", "seconds": 12.0, "status": "ok"}]
    assert data["chapters"][0]["digest"] == chapters.notebook_digest(nb)  # papermill's parameters cell left out
    with pytest.raises(FileNotFoundError, match="no summary.json"):
        chapters.record_run(tmp_path, folder=tmp_path)


def test_shorten_keeps_whole_clauses():
    text = "say what a rank, the world size and an all-reduce are, predict how DDP shards data, explain why it waits"
    assert chapters.shorten(text, 12) == "say what a rank, the world size and an all-reduce are…"
    assert chapters.shorten("read the diff (exercise 2)", 12) == "read the diff"


def test_the_readme_layout_names_every_top_folder_and_package_and_refuses_an_unknown_folder(monkeypatch):
    text = layout.readme_layout()
    files = layout.tree_files()
    for folder in layout.top_folders(files):
        assert f"\n{folder}/ " in text, folder
    for pkg in layout.packages(files):
        assert f"\n{pkg}/ " in text, pkg
    monkeypatch.setattr(layout, "tree_files", lambda root=ROOT: [*files, "newfolder/thing.txt"])
    with pytest.raises(layout.LayoutError, match="newfolder/ has no line"):
        layout.readme_layout()


def test_a_broken_marker_or_unknown_block_is_refused():
    with pytest.raises(blocks.BlockError, match="without its"):
        blocks.rewrite("<!-- generated: a -->\ntext\n", {"a": lambda: "x"})
    with pytest.raises(blocks.BlockError, match="no generator for block"):
        blocks.rewrite("<!-- generated: b -->\n<!-- end: b -->\n", {"a": lambda: "x"})
    page = "intro\n<!-- generated: a -->\nold\n<!-- end: a -->\nkept\n"
    assert blocks.rewrite(page, {"a": lambda: "new"}) == "intro\n<!-- generated: a -->\nnew\n<!-- end: a -->\nkept\n"
    assert blocks.stale(page, {"a": lambda: "new"}) == ["a"] and blocks.stale(page, {"a": lambda: "old"}) == []


def test_the_readmes_kaggle_and_colab_cells_name_what_pack_py_builds():
    import importlib.util

    spec = importlib.util.spec_from_file_location("pack_for_docs", ROOT / "scripts" / "pack.py")
    pack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pack)
    text = README.read_text()
    kaggle = text.split("## On Kaggle (2x T4)\n", 1)[1].split("\n## ", 1)[0]
    colab = text.split("## On Colab\n", 1)[1].split("\n## ", 1)[0]
    out = pack.main.__globals__["ROOT"] / "outputs" / "distrinews_course.zip"
    assert f"`{out.relative_to(ROOT).as_posix()}`" in kaggle and f"{out.name}" in colab
    assert f'glob.glob("/kaggle/input/**/{pack.INSTALL}"' in kaggle
    assert f"/content/pack/{pack.TOP}/{pack.INSTALL} /content/distrinews" in colab
    for section, dest in ((kaggle, "/kaggle/working/distrinews"), (colab, "/content/distrinews")):
        assert f'sys.path.insert(0, "{dest}")' in section and f"cd {dest} && python scripts/run_course.py" in section
        assert "PYTHON={sys.executable} bash" in section  # the kernel's own Python, whatever python3 is
