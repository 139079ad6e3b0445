"""Pack the course into one archive for Kaggle and Colab: the course, the library, the wheels their images lack.

    python scripts/pack.py                  # outputs/distrinews_course.zip, for Kaggle's and Colab's GPU images
    python scripts/pack.py --image kaggle --out my.zip

Upload the archive as a Kaggle dataset (Kaggle unpacks it into /kaggle/input/<dataset>/distrinews/), or put it on
Colab, and run its one-cell install there: distrinews_install.sh copies the course to a writable folder and installs
it with pip's index off, so it works with Internet off. The archive holds

    distrinews/distrinews_install.sh      the install (scripts/pack_install.sh)
    distrinews/requirements-hosted.txt    what the course needs on a hosted notebook (requirements.txt less Jupyter)
    distrinews/wheels/                    what each image lacks, for its Python and platform (never a torch)
    distrinews/course/                    the course's files (git's, ignored ones left out), less its tests and CI
    distrinews/MANIFEST.json              the commit, each image's Python and platform, each wheel's tags

What an image has is read from scripts/images/<image>.txt; what it lacks, and the wheels for it, from
distrinews_course/wheelhouse.py. --python adds a Python version to build wheels for (a local test's).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

try:
    from distrinews_course import wheelhouse  # noqa: E402
except ImportError as err:  # a bare Python: packaging is all pack.py needs beyond pip and git
    raise SystemExit(f"pack: {err.name or err} is missing: pip install packaging, then run this again") from None

TOP = "distrinews"
INSTALL = "distrinews_install.sh"
# Left out of the course's copy: what only develops the course (its tests, CI), not what a learner runs.
LEFT_OUT = ("tests/", ".ci/", "conftest.py", ".gitignore")


def course_files(root: Path = ROOT) -> list[str]:
    """The working tree's files that git tracks or would (untracked, not ignored), less LEFT_OUT."""
    cmd = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"pack: {root} is not a git checkout (git ls-files: {done.stderr.strip()}); clone the course")
    names = sorted({n for n in done.stdout.split("\0") if n})
    return [n for n in names if not n.startswith(LEFT_OUT) and (root / n).is_file()]


def source_commit(root: Path = ROOT) -> dict:
    def git(*args):
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    return {"commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "--porcelain", "-uno"))}


def wheels_for(images: list, pythons: list[str], dest: Path) -> tuple[dict, list[dict]]:
    """Every image's lacking requirements fetched into dest for its own Python and each of `pythons`."""
    reqs = wheelhouse.course_requirements()
    summary, wheels = {}, {}
    for image in images:
        needs = wheelhouse.lacking(image, reqs)
        needs += wheelhouse.lacking(image, wheelhouse.extras_needs(image, reqs, image.python))
        targets = sorted({image.python, *pythons}, key=lambda v: tuple(map(int, v.split("."))))
        for python in targets:
            got = wheelhouse.fetch(needs, image, dest, python)
            problems = wheelhouse.unmet(got.wheels, image, needs, python)
            if problems:
                raise SystemExit(
                    f"pack: on {image.name} (Python {python}) nothing would provide:\n  " + "\n  ".join(problems)
                )
            for w in got.wheels:
                wheels.setdefault(w.name, set()).add(f"{image.name} (Python {python})")
        summary[image.name] = {"python": image.python, "platform": image.platform, "about": image.about,
                               "lacks": [str(r) for r in needs]}  # fmt: skip
    listed = [{"file": n, "tags": wheelhouse.tags_of(dest / n), "for": sorted(f)} for n, f in sorted(wheels.items())]
    return summary, listed


def build(out: Path, image_names: list[str], pythons: list[str]) -> dict:
    images = [wheelhouse.load_image(n) for n in image_names]
    files = course_files()
    with tempfile.TemporaryDirectory() as tmp:
        top = Path(tmp) / TOP
        (top / "wheels").mkdir(parents=True)
        images_summary, wheels = wheels_for(images, pythons, top / "wheels")
        for name in files:
            target = top / "course" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target)
        lines = [str(r) for r in wheelhouse.course_requirements()]
        (top / "requirements-hosted.txt").write_text(
            "# What the course needs on a hosted notebook: requirements.txt less "
            + ", ".join(wheelhouse.HOSTED_SKIP)
            + " (the notebook already is one).\n"
            + "\n".join(lines)
            + "\n"
        )
        shutil.copy2(ROOT / "scripts" / "pack_install.sh", top / INSTALL)
        manifest = {
            "course": {**source_commit(), "files": len(files), "packed": time.strftime("%Y-%m-%d")},
            "images": images_summary,
            "wheels": wheels,
            "install": f"bash {INSTALL} [DEST]",
        }
        (top / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
            for path in sorted(top.rglob("*")):
                if path.is_file():
                    z.write(path, path.relative_to(Path(tmp)).as_posix())
        partial.replace(out)
    return manifest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "outputs" / "distrinews_course.zip")
    p.add_argument("--image", action="append", help="an image of scripts/images/ (default: kaggle and colab)")
    p.add_argument("--python", action="append", default=[], help="also carry wheels for this Python, e.g. 3.11")
    args = p.parse_args(argv)
    try:
        manifest = build(args.out.resolve(), args.image or ["kaggle", "colab"], args.python)
    except wheelhouse.WheelhouseError as err:
        print(f"pack: {err}", file=sys.stderr)
        return 2
    size = args.out.stat().st_size / 2**20
    files, wheels = manifest["course"]["files"], len(manifest["wheels"])
    print(f"pack: {args.out} ({size:.1f} MiB): {files} course files, {wheels} wheels")
    for name, image in manifest["images"].items():
        lacks = ", ".join(image["lacks"]) or "nothing"
        print(f"  {name}: Python {image['python']}, {image['platform']}; lacks {lacks}")
    for w in manifest["wheels"]:
        print(f"  {w['file']}  for {', '.join(w['for'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
