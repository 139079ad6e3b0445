"""Rewrite the generated parts of README.md and docs/*.md from the notebooks, the tree and benchmarks/*.json.

    python scripts/make_docs.py                            # rewrite every generated block
    python scripts/make_docs.py --check                    # exit 1 naming the blocks that are stale (CI's test does)
    python scripts/make_docs.py --record-run runs/<time>   # a course run's chapter times into benchmarks/, then rewrite

A block is the text between `<!-- generated: NAME -->` and `<!-- end: NAME -->`; the rest of a page is written by
hand and never touched. distrinews_course/docgen/tables.py says what each NAME holds. After a course run
(scripts/run_course.py), --record-run keeps its per-chapter times in benchmarks/chapters_<machine>.json, where the
README's chapter table reads its minutes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distrinews_course.docgen import blocks, chapters, tables  # noqa: E402


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md that holds a generated block."""
    found = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [p for p in found if p.is_file() and blocks.names(p.read_text())]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a generated block is stale")
    p.add_argument("--record-run", type=Path, metavar="RUN_DIR", help="keep a course run's chapter times first")
    p.add_argument("--record-out", type=Path, default=None, help="with --record-run: write the record here instead")
    args = p.parse_args(argv)
    if args.record_run:
        try:
            path = chapters.record_run(args.record_run.resolve(), out=args.record_out)
        except (FileNotFoundError, KeyError, ValueError) as err:
            print(f"make_docs: {err}", file=sys.stderr)
            return 2
        print(f"make_docs: chapter times of {args.record_run} in {path}")
        if args.record_out:
            return 0
    make = tables.generators()
    stale = []
    try:
        for page in pages():
            text = page.read_text()
            rel = page.relative_to(ROOT).as_posix()
            if args.check:
                stale += [f"{rel}: {name}" for name in blocks.stale(text, make, rel)]
                continue
            new = blocks.rewrite(text, make, rel)
            if new != text:
                page.write_text(new)
                print(f"make_docs: rewrote {rel}")
    except (blocks.BlockError, tables.layout.LayoutError) as err:
        print(f"make_docs: {err}", file=sys.stderr)
        return 2
    if stale:
        print("make_docs: stale generated blocks (run python scripts/make_docs.py):\n  " + "\n  ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
