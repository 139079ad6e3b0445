#!/usr/bin/env python
"""Keep the notebooks' `%%writefile` cells and the files they write byte-for-byte in step.

    python scripts/sync_notebooks.py --check    # list every %%writefile cell whose body differs from its file (exit 1)
    python scripts/sync_notebooks.py --write    # rewrite those cells from the files (the files are the source of truth)
    python scripts/sync_notebooks.py --check notebooks/02_ddp_training.ipynb     # only some notebooks

A cell `%%writefile PATH` writes its body to PATH relative to the project root (every chapter's setup()
changes into it first). IPython ends the body with a newline, so the file must equal `body + "\\n"`.
Targets that git ignores (outputs/, runs/, ...) are scratch files a notebook owns and writes every time
it runs: they are listed, not compared. Appending cells (`%%writefile -a`) are not compared either.
"""

from __future__ import annotations

import argparse
import difflib
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
MAGIC = "%%writefile"


@dataclass
class WritefileCell:
    notebook: Path
    index: int  # position of the cell in the notebook (0-based, markdown cells included)
    target: str  # the path as written after %%writefile
    append: bool
    body: str  # the cell's text after the magic line

    @property
    def expected_file_text(self) -> str:
        return self.body + "\n"


@dataclass
class Problem:
    cell: WritefileCell
    kind: str  # "differs", "missing", "no-final-newline"
    detail: str = ""

    def __str__(self) -> str:
        where = f"{_rel(self.cell.notebook)} cell {self.cell.index}: %%writefile {self.cell.target}"
        what = {
            "differs": f"differs from {self.cell.target}",
            "missing": f"{self.cell.target} does not exist (commit it, or remove the cell)",
            "no-final-newline": f"{self.cell.target} does not end with a newline, so no cell can reproduce it",
        }[self.kind]
        return f"{where} {what}" + (f"\n{self.detail}" if self.detail else "")


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def writefile_cells(notebook: Path) -> list[WritefileCell]:
    nb = nbformat.read(str(notebook), as_version=4)
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.startswith(MAGIC):
            continue
        first, _, body = cell.source.partition("\n")
        args = shlex.split(first[len(MAGIC) :])
        append = any(a in ("-a", "--append") for a in args)
        paths = [a for a in args if not a.startswith("-")]
        if not paths:
            continue
        found.append(WritefileCell(Path(notebook), i, paths[0], append, body))
    return found


def git_ignored(path: Path, root: Path = ROOT) -> bool:
    """True when git ignores `path` (False outside a git checkout or without git)."""
    try:
        return (
            subprocess.run(
                ["git", "check-ignore", "-q", str(path)], cwd=root, capture_output=True, timeout=10
            ).returncode
            == 0
        )
    except (OSError, subprocess.SubprocessError):
        return False


def check_cell(cell: WritefileCell, root: Path = ROOT) -> Problem | None:
    path = root / cell.target
    if not path.is_file():
        return Problem(cell, "missing")
    text = path.read_text(encoding="utf-8")
    if text == cell.expected_file_text:
        return None
    if not text.endswith("\n"):
        return Problem(cell, "no-final-newline")
    diff = difflib.unified_diff(
        cell.expected_file_text.splitlines(keepends=True),
        text.splitlines(keepends=True),
        f"{_rel(cell.notebook)} (cell {cell.index})",
        cell.target,
        n=1,
    )
    lines = list(diff)
    shown = "".join(lines[:30]) + (f"... ({len(lines) - 30} more diff lines)\n" if len(lines) > 30 else "")
    return Problem(cell, "differs", shown.rstrip("\n"))


def check_notebooks(notebooks, root: Path = ROOT, log=None) -> list[Problem]:
    """Every problem with a compared %%writefile cell of these notebooks."""
    problems = []
    for nb in notebooks:
        for cell in writefile_cells(Path(nb)):
            if cell.append:
                log and log(f"skip {_rel(cell.notebook)} cell {cell.index}: %%writefile -a {cell.target} (appends)")
                continue
            if git_ignored(root / cell.target, root):
                log and log(
                    f"skip {_rel(cell.notebook)} cell {cell.index}: "
                    f"{cell.target} is git-ignored scratch the notebook owns"
                )
                continue
            problem = check_cell(cell, root)
            if problem:
                problems.append(problem)
            elif log:
                log(f"ok   {_rel(cell.notebook)} cell {cell.index}: %%writefile {cell.target}")
    return problems


def write_notebooks(notebooks, root: Path = ROOT, log=print) -> int:
    """Rewrite every differing %%writefile cell from its file. Returns how many cells changed."""
    changed = 0
    for nb_path in notebooks:
        fixes = {p.cell.index: p for p in check_notebooks([nb_path], root) if p.kind == "differs"}
        if not fixes:
            continue
        nb = nbformat.read(str(nb_path), as_version=4)
        for index, problem in fixes.items():
            first = nb.cells[index].source.partition("\n")[0]
            text = (root / problem.cell.target).read_text(encoding="utf-8")
            nb.cells[index].source = first + "\n" + text[:-1]
            log(f"rewrote {_rel(Path(nb_path))} cell {index} from {problem.cell.target}")
            changed += 1
        nbformat.write(nb, str(nb_path))
    return changed


def default_notebooks(root: Path = ROOT) -> list[Path]:
    return sorted((root / "notebooks").glob("*.ipynb"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="report differing cells and exit 1 if any (the default)")
    mode.add_argument("--write", action="store_true", help="rewrite differing cells from the files")
    p.add_argument("-v", "--verbose", action="store_true", help="also list the cells that match or are skipped")
    p.add_argument("notebooks", nargs="*", type=Path, help="notebooks to look at (default: notebooks/*.ipynb)")
    args = p.parse_args(argv)
    notebooks = args.notebooks or default_notebooks()
    if args.write:
        changed = write_notebooks(notebooks)
        left = [q for q in check_notebooks(notebooks)]
        for q in left:
            print(q, file=sys.stderr)
        print(f"{changed} cell(s) rewritten; {len(left)} problem(s) left")
        return 1 if left else 0
    problems = check_notebooks(notebooks, log=print if args.verbose else None)
    for q in problems:
        print(q, file=sys.stderr)
    n_cells = sum(len(writefile_cells(nb)) for nb in notebooks)
    if problems:
        print(
            f"{len(problems)} of {n_cells} %%writefile cell(s) out of step. The files are the source of truth: "
            "python scripts/sync_notebooks.py --write",
            file=sys.stderr,
        )
        return 1
    print(f"all {n_cells} %%writefile cell(s) in {len(notebooks)} notebook(s) match their files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
