"""The tree as the README and docs/layout.md describe it: one line per top folder and package, and in detail every
module and script with the first sentence of its docstring.

The files are those git tracks, so what a run leaves behind (runs/, outputs/, .venv) is not the layout, and a
commit's pages are what a clone of it generates. A package says what it is in its __init__'s docstring; one without
says which modules it holds. A top folder's line is FOLDERS' (a folder has no docstring): a new top folder without
one stops the generator, so the README never lists a folder it cannot describe.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from .. import ROOT

# One line per top folder that is not a Python package (packages describe themselves).
FOLDERS = {
    "notebooks": "the course, one notebook a chapter, without outputs; answers/ for the exercises",
    "scripts": "what the chapters write and launch, run_course.py, the benchmarks, pack.py",
    "configs": "the experiments' YAML files and Accelerate's launch config",
    "experiments": "one folder per experiment run (config, metrics, log) and their plots",
    "benchmarks": "records of real runs (JSON with their command and machine) and their plots",
    "docs": "everything past the README (listed below)",
    "tests": "pytest: unit, multi-process gloo, the API against a live server, the notebooks",
    "checkpoints": "where training writes its checkpoint (git keeps only the folder)",
}
PACKAGE_ROOTS = ("distrinews_lib", "distrinews_course")


class LayoutError(Exception):
    """The tree holds something the layout cannot describe."""


def tree_files(root: Path = ROOT) -> list[str]:
    """The files git tracks that the working tree has, as paths relative to root: what a fresh clone holds, so that
    the generated pages of a commit are those a clone of it generates (a file not yet added is not the layout)."""
    done = subprocess.run(["git", "ls-files", "-z", "--cached"], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise LayoutError(f"{root} is not a git checkout: {done.stderr.strip()}")
    return sorted({n for n in done.stdout.split("\0") if n and (root / n).exists()})


def first_sentence(text: str | None) -> str:
    """The first sentence of a docstring or comment block: up to the first '. ' or blank line, without a leading
    'name: ' that repeats the module's name."""
    if not text:
        return ""
    para = " ".join(re.split(r"\n\s*\n", text.strip())[0].split())
    m = re.search(r"(?<!e\.g)(?<!i\.e)(?<!\bvs)(?<!\betc)\.(?=\s+[A-Za-z`(\"]|$)", para)
    sentence = para[: m.start() + 1] if m else para
    # The docs name no issue: a reference in a docstring (its tracker's number) stays in the code.
    sentence = re.sub(r"\s*\([^()]*(?:\bissues? \d+|#\d+)[^()]*\)", "", sentence)
    sentence = re.sub(r"\s*\b(?:for |of )?issues? \d+(?:'s)?\b", "", sentence)
    return sentence.strip()


def one_line(text: str, width: int = 90) -> str:
    """text within `width` characters, cut at a clause (', ', ': ', ' (') where it is longer, lowercase first."""
    if text[:1].isupper() and not text[1:2].isupper():  # "The plumbing", "A process"; not "DDP", "GPU"
        text = text[0].lower() + text[1:]
    text = text.rstrip(".")
    if len(text) <= width:
        return text
    cut = max(text.rfind(sep, 0, width) for sep in (", ", ": ", " (", "; "))
    return (text[:cut] if cut > width // 3 else text[:width].rsplit(" ", 1)[0]).rstrip(",:;") + "…"


def docstring(path: Path) -> str:
    """A Python file's docstring, or a shell script's first comment block (after the #! line)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".py":
        try:
            return ast.get_docstring(ast.parse(text)) or ""
        except SyntaxError:
            return ""
    lines = []
    for line in text.splitlines():
        if line.startswith("#!"):
            continue
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return "\n".join(lines)


def packages(files: list[str]) -> list[str]:
    """Every package (a folder with __init__.py) under PACKAGE_ROOTS, as dotted-less paths: 'distrinews_lib/data'."""
    return sorted(str(Path(f).parent) for f in files if f.endswith("/__init__.py") and f.startswith(PACKAGE_ROOTS))


def package_line(pkg: str, files: list[str], root: Path = ROOT, short: bool = False) -> str:
    """What a package is: its docstring's first sentence (short: up to its first ': ', "the hang doctor"), else the
    modules it holds."""
    text = first_sentence(docstring(root / pkg / "__init__.py"))
    text = re.sub(rf"^{re.escape(Path(pkg).name)}:\s*", "", text)
    if short and ": " in text and len(text.split(": ", 1)[0].split()) >= 2:
        text = text.split(": ", 1)[0]
    if text:
        return text[0].upper() + text[1:]
    modules = sorted(
        Path(f).stem if f.endswith(".py") else Path(f).parent.name
        for f in files
        if Path(f).parent.as_posix() == pkg and f.endswith(".py") and not f.endswith("__init__.py")
    )
    return "Modules: " + ", ".join(modules) + "."


def top_folders(files: list[str]) -> list[str]:
    return sorted({f.split("/", 1)[0] for f in files if "/" in f and not f.startswith(".")})


def readme_layout(root: Path = ROOT) -> str:
    """The README's layout: a code block, one line per top folder and per package."""
    files = tree_files(root)
    pkgs = packages(files)
    lines = []
    for folder in top_folders(files):
        if folder in PACKAGE_ROOTS:
            for pkg in [p for p in pkgs if p == folder or p.startswith(folder + "/")]:
                lines.append((pkg + "/", one_line(package_line(pkg, files, root, short=True))))
        elif folder in FOLDERS:
            lines.append((folder + "/", one_line(FOLDERS[folder])))
        else:
            where = "distrinews_course/docgen/layout.py FOLDERS"
            raise LayoutError(f"top folder {folder}/ has no line in {where}: say what it holds there")
    width = max(len(name) for name, _ in lines) + 2
    return "```\n" + "\n".join(f"{name:<{width}}{text}" for name, text in lines) + "\n```"


def detailed_layout(root: Path = ROOT) -> str:
    """docs/layout.md's body: every package with its modules, every scripts/ folder with its scripts, each with
    the first sentence of its docstring."""
    files = tree_files(root)
    out = []
    for pkg in packages(files):
        out.append(f"\n### `{pkg}/`\n\n{package_line(pkg, files, root)}\n")
        for f in files:
            p = Path(f)
            if p.parent.as_posix() == pkg and p.suffix == ".py" and p.name != "__init__.py":
                out.append(f"- `{p.name}`: {first_sentence(docstring(root / f)) or '(no docstring)'}")
    script_dirs = sorted({Path(f).parent.as_posix() for f in files if f.startswith("scripts/")})
    for folder in script_dirs:
        entries = [Path(f) for f in files if Path(f).parent.as_posix() == folder and Path(f).suffix in (".py", ".sh")]
        if not entries:
            continue
        out.append(f"\n### `{folder}/`\n")
        for p in entries:
            out.append(f"- `{p.name}`: {first_sentence(docstring(root / p)) or '(no docstring)'}")
    return "\n".join(out).strip()
