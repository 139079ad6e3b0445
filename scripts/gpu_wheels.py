"""The wheels the GPU benchmark session carries: what the course needs that its GPU machine's image lacks, in .whl/.

    python scripts/gpu_wheels.py            # here, with pip's index: downloads into .whl/ (git-ignored), prints them
    # on the GPU machine, which has no package index, scripts/gpu_session.sh installs them before each part:
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl

The machine's image (scripts/images/gpu_session.txt: Python 3.12, torch 2.11 for CUDA 13, transformers, accelerate,
tensorboard, matplotlib) lacks papermill and a Jupyter kernel (run_course.py), FastAPI, uvicorn and pydantic
(chapter 10, the serving stage). `datasets` is left out: the benchmarks give Trainer a plain torch Dataset where it is
missing. A package the image has is not carried: a second copy earlier on the path would shadow the image's own.
distrinews_course/wheelhouse.py decides what is lacking and fetches it for the image's Python and platform.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distrinews_course import wheelhouse  # noqa: E402

IMAGE = "gpu_session"
SKIP = {"datasets": "not needed there: the benchmarks give Trainer a plain torch Dataset where it is missing"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", type=Path, default=ROOT / ".whl")
    p.add_argument("--limit_mb", type=float, default=40, help="fail above this size (a session part carries 64 MiB)")
    args = p.parse_args(argv)
    try:
        image = wheelhouse.load_image(IMAGE)
        reqs = wheelhouse.course_requirements()
        needs = wheelhouse.lacking(image, reqs, skip=SKIP)
        needs += wheelhouse.lacking(image, wheelhouse.extras_needs(image, reqs, image.python), skip=SKIP)
        if args.dest.exists():
            shutil.rmtree(args.dest)
        got = wheelhouse.fetch(needs, image, args.dest)
    except wheelhouse.WheelhouseError as err:
        print(f"gpu_wheels: {err}", file=sys.stderr)
        return 2
    size = sum(w.stat().st_size for w in got.wheels) / 2**20
    print(f"{len(got.wheels)} wheels, {size:.1f} MiB in {args.dest} for Python {image.python} on {image.platform}")
    print(f"  for: {', '.join(map(str, needs))}; the image has: {', '.join(sorted(set(got.dropped)))}")
    # git ignores the folder (so it is never committed), and the session carries it by name.
    git = subprocess.run(["git", "rev-parse", "--git-path", "info/exclude"], cwd=ROOT, capture_output=True, text=True)
    exclude = ROOT / git.stdout.strip() if git.returncode == 0 else None
    if exclude and "/.whl/" not in (exclude.read_text() if exclude.exists() else ""):
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with open(exclude, "a") as f:
            f.write("/.whl/\n")
    problems = wheelhouse.unmet(got.wheels, image, needs)
    if problems:
        print("not carried and not in the image:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print("every requirement of the carried wheels is carried or in the image")
    if size > args.limit_mb:
        print(f"too large: {size:.1f} MiB > {args.limit_mb} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
