"""What each chapter teaches, read from its notebook, and how long it ran, read from the course's records.

A chapter's title and its "You will be able to" paragraph come from its first markdown cells, so a new chapter, or a
rewritten opening, reaches the README without an edit. Its minutes come from benchmarks/chapters_<machine>.json,
which record_run() writes from a run of scripts/run_course.py (its summary.json and executed copies): per chapter its
status, seconds and a digest of the notebook's cells, so a time measured on an earlier version of a chapter is
marked as such rather than passed off as the current one's.

    python scripts/make_docs.py --record-run runs/<timestamp>     # the run's times into benchmarks/, then the docs
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from .. import ROOT

NOTEBOOKS = ROOT / "notebooks"
BENCHMARKS = ROOT / "benchmarks"
RECORD_GLOB = "chapters_*.json"
ABLE = re.compile(r"(?:\*\*)?(?:What )?you will be able to(?: do)?[.:]?(?:\*\*)?[.:]?\s*", re.I)
SHORT_WORDS = 20  # the README's column: a clause or two of the chapter's own sentence


@dataclass
class Chapter:
    number: str  # "03"
    stem: str  # "03_ddp_by_hand"
    title: str  # "DDP by hand"
    able_to: str  # the chapter's "You will be able to" text, whole
    digest: str  # of its cells' sources: changes when the chapter does

    @property
    def short(self) -> str:
        return shorten(self.able_to)


def notebook_digest(nb: dict) -> str:
    """A digest of a notebook's cells (type and source), papermill's injected parameters left out: the same for a
    notebook and its executed copy."""
    h = hashlib.sha256()
    for cell in nb.get("cells", []):
        if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
            continue
        src = cell.get("source", "")
        h.update(json.dumps([cell.get("cell_type"), src if isinstance(src, str) else "".join(src)]).encode())
    return h.hexdigest()[:16]


def _markdown(nb: dict, first: int = 3) -> list[str]:
    cells = [c for c in nb.get("cells", []) if c.get("cell_type") == "markdown"][:first]
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells]


def able_to(markdown: str) -> str:
    """The text after "You will be able to" up to the end of its paragraph (or of the list that follows it)."""
    m = ABLE.search(markdown)
    if not m:
        return ""
    rest = markdown[m.end() :]
    paragraphs = re.split(r"\n\s*\n", rest.strip())
    text = paragraphs[0]
    if text.lstrip().startswith(("- ", "* ", "1. ")) or (not text.strip() and len(paragraphs) > 1):
        text = text if text.strip() else paragraphs[1]
        items = [re.sub(r"^\s*(?:[-*]|\d+\.)\s+", "", line) for line in text.splitlines()]
        text = "; ".join(i.strip().rstrip(";.") for i in items if i.strip())
    elif len(paragraphs) > 1 and paragraphs[1].lstrip().startswith(("- ", "* ")) and text.rstrip().endswith(":"):
        items = [re.sub(r"^\s*[-*]\s+", "", line) for line in paragraphs[1].splitlines()]
        text = text.rstrip(": ") + " " + "; ".join(i.strip().rstrip(";.") for i in items if i.strip())
    text = " ".join(text.split())
    return re.sub(r"\*\*([^*]+)\*\*", r"\1", text).strip()


# A word that starts a noun phrase, not a new clause: "say what a rank, the world size and ..." goes on after its comma.
NOT_A_CLAUSE = {
    "the",
    "a",
    "an",
    "its",
    "their",
    "this",
    "these",
    "those",
    "each",
    "every",
    "and",
    "or",
    "which",
    "who",
}


def _clauses(text: str) -> list[str]:
    """text split where a new clause starts: after a top-level ', ' or '; ' (not inside parentheses or backticks)
    followed by a lowercase word that does not start a noun phrase; separators kept."""
    out, depth, code, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == "`":
            code = not code
        elif not code and ch == "(":
            depth += 1
        elif not code and ch == ")":
            depth = max(0, depth - 1)
        elif not code and depth == 0 and ch in ",;" and text[i + 1 : i + 2] == " ":
            following = text[i + 2 :].split(" ", 1)[0]
            if ch == ";" or (following[:1].islower() and following not in NOT_A_CLAUSE):
                out.append(text[start : i + 1])
                start = i + 1
    out.append(text[start:])
    merged = []  # a clause of one or two words ("show,") is the start of the next one, not a clause of its own
    for clause in out:
        if merged and len(merged[-1].split()) < 3:
            merged[-1] += clause
        else:
            merged.append(clause)
    return merged


def shorten(text: str, words: int = SHORT_WORDS) -> str:
    """The first clauses of `text` within `words` words (at least one), its exercise references left out, and an
    ellipsis where something was cut."""
    text = re.sub(r"\s*\((?:exercises?|see) [^)]*\)", "", text).rstrip(" .")
    kept, count = [], 0
    for clause in _clauses(text):
        n = len(clause.split())
        if kept and count + n > words:
            break
        kept.append(clause)
        count += n
    short = "".join(kept).strip().rstrip(",;")
    if len(short.split()) > words:
        short = " ".join(short.split()[:words]).rstrip(",;")
    short = re.sub(r"\s+(?:and|or|the|a|to)$", "", short)
    if short[:1].isupper() and short[1:2].islower():  # "Read a script ..." reads on from "you will be able to"
        short = short[0].lower() + short[1:]
    return short + ("…" if short.lower() != text.lower() else "")


def read_chapter(path: Path) -> Chapter:
    nb = json.loads(path.read_text())
    cells = _markdown(nb)
    if not cells:
        raise ValueError(f"{path.name}: no markdown cell to read the chapter's title from")
    first = cells[0].strip().splitlines()[0]
    m = re.match(r"#\s*(\d\d)\s*[·:.\-–]\s*(.+)$", first)
    number = path.name[:2]
    title = m.group(2).strip() if m else first.lstrip("# ").strip()
    text = next((able_to(c) for c in cells if able_to(c)), "")
    return Chapter(number, path.stem, title, text, notebook_digest(nb))


def chapters(folder: Path = NOTEBOOKS) -> list[Chapter]:
    """The course's chapters in order: notebooks/NN_*.ipynb, as scripts/run_course.py finds them; in the checkout,
    those git tracks (what a clone of the commit holds)."""
    from .layout import tree_files

    paths = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if folder.resolve().is_relative_to(ROOT):
        tracked = set(tree_files(ROOT))
        paths = [p for p in paths if p.resolve().relative_to(ROOT).as_posix() in tracked]
    return [read_chapter(p) for p in paths]


# --------------------------------------------------------------------------- the course's per-chapter times


def records(folder: Path = BENCHMARKS) -> list[tuple[Path, dict]]:
    out = []
    for path in sorted(folder.glob(RECORD_GLOB)):
        data = json.loads(path.read_text())
        if data.get("benchmark") == "chapters":
            out.append((path, data))
    return out


@dataclass
class Timing:
    seconds: float
    current: bool  # measured on the chapter as it is now (its digest matches)
    record: Path


def timings(chapter_list: list[Chapter], kind: str, folder: Path = BENCHMARKS) -> tuple[dict, list[Path]]:
    """{stem: Timing} from the newest record of `kind` ('cpu' or 'gpu') that holds the chapter run ok, and the
    records used."""
    found, used = {}, []
    ranked = sorted((r for r in records(folder) if r[1].get("kind") == kind), key=lambda r: r[1].get("updated", ""))
    for path, data in reversed(ranked):
        for ch in chapter_list:
            row = next((c for c in data.get("chapters", []) if c["chapter"] == ch.stem), None)
            if ch.stem in found or not row or row.get("status") != "ok":
                continue
            found[ch.stem] = Timing(row["seconds"], row.get("digest") == ch.digest, path)
            if path not in used:
                used.append(path)
    return found, used


def record_run(run_dir: Path, folder: Path = BENCHMARKS, out: Path | None = None) -> Path:
    """A run_course.py run's per-chapter times into benchmarks/chapters_<machine>.json (or `out`), merged with the
    chapters that record already holds from other runs. Returns the record's path."""
    from ..bench.provenance import slug_of

    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{run_dir}: no summary.json (a folder scripts/run_course.py wrote, runs/<time>/)")
    summary = json.loads(summary_path.read_text())
    machine = summary.get("machine", {})
    slug = slug_of(machine)
    path = out or folder / f"chapters_{slug}.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    rows = {c["chapter"]: c for c in old.get("chapters", [])}
    for nb in summary.get("notebooks", []):
        executed = run_dir / f"{nb['name']}.ipynb"
        if nb.get("status") is None or nb.get("seconds") is None:
            continue
        rows[nb["name"]] = {
            "chapter": nb["name"],
            "status": nb["status"],
            "seconds": round(nb["seconds"], 1),
            "digest": notebook_digest(json.loads(executed.read_text())) if executed.is_file() else None,
            "run_started": summary.get("started"),
            "git_commit": machine.get("git_commit"),
            "headline": nb.get("headline") or "",
        }
    gpus = machine.get("gpus")
    presets = sorted({(nb.get("record") or {}).get("preset") for nb in summary.get("notebooks", [])} - {None})
    record = {
        "benchmark": "chapters",
        "note": "per-chapter wall time of scripts/run_course.py (written by scripts/make_docs.py --record-run); a "
        "chapter's digest is of its cells, so a time from an earlier version of it is told apart",
        "kind": "gpu" if gpus else "cpu",
        "machine": slug,
        "device": f"{len(gpus)}x {gpus[0]}"
        if gpus
        else f"{machine.get('cpu_count')} CPU cores, {machine.get('processor')}",
        "preset": summary.get("preset") if summary.get("preset") != "auto" or not presets else "/".join(presets),
        "nproc": summary.get("nproc"),
        "versions": {k: machine.get(k) for k in ("python", "torch", "cuda", "transformers")},
        "updated": time.strftime("%Y-%m-%d %H:%M:%S", time.strptime(summary["started"][:19], "%Y-%m-%d %H:%M:%S"))
        if summary.get("started")
        else time.strftime("%Y-%m-%d %H:%M:%S"),
        "chapters": [rows[k] for k in sorted(rows)],
    }
    record["seconds_ok"] = round(sum(c["seconds"] for c in record["chapters"] if c["status"] == "ok"), 1)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path
