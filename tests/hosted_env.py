"""A machine image for the tests, built here: a fresh virtual environment that already sees an image's packages.

Kaggle's and Colab's images are a Python with torch, transformers and much else installed, over which the course is
installed. Here the image is this checkout's own environment (.venv: the CPU torch and transformers setup_env.sh
installed) seen through a filter: a folder of links to exactly the distributions the image's list names
(scripts/images/<name>.txt), nothing else. A fresh venv made without pip adds that folder to its path after its own
site-packages, as --system-site-packages adds the base interpreter's (which for a venv is not another venv's), so
pip, setuptools, torch and transformers come from the "image" and what the course installs lands in the fresh venv.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from packaging.requirements import Requirement

from distrinews_course.wheelhouse import Image, norm


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _owned_paths(site: Path) -> tuple[dict, dict]:
    """({distribution: [its paths inside site, as tuples of parts]} from each RECORD, {distribution: what it
    requires, extras left out})."""
    owned, needs = {}, {}
    for dist in importlib.metadata.distributions(path=[str(site)]):
        name = norm(dist.metadata["Name"])
        files = dist.files or []
        owned.setdefault(name, []).extend(p for p in (Path(f).parts for f in files if not str(f).startswith("..")) if p)
        for line in dist.requires or []:
            req = Requirement(line)
            if not req.marker or req.marker.evaluate({"extra": ""}):
                needs.setdefault(name, set()).add(norm(req.name))
    return owned, needs


def _link(tree: dict, src: Path, dest: Path) -> None:
    """Link every entry of `tree` ({part: (wanted, subtree)}) into dest: an entry only wanted distributions own is one
    link; an entry shared with unwanted ones (a namespace package) becomes a folder, filled the same way."""
    for part, (owners_ok, owners_other, sub) in tree.items():
        if not owners_ok:
            continue
        if not owners_other or not sub:
            (dest / part).symlink_to(src / part)
        else:
            (dest / part).mkdir()
            _link(sub, src / part, dest / part)


def image_view(image: Image, dest: Path, site: Path | None = None) -> list[str]:
    """dest filled with links to the distributions of `site` (default this interpreter's) that the image lists,
    and to what they require (an image holds what its packages need: this transformers may need more than the one
    the list was read with); returns their names."""
    site = site or site_packages()
    owned, needs = _owned_paths(site)
    wanted, todo = set(), [name for name in owned if name in image.packages]
    while todo:
        name = todo.pop()
        if name in owned and name not in wanted:
            wanted.add(name)
            todo += needs.get(name, ())
    tree: dict = {}
    for name, paths in owned.items():
        for parts in paths:
            node = tree
            for i, part in enumerate(parts):
                ok, other, sub = node.setdefault(part, (set(), set(), {}))
                (ok if name in wanted else other).add(name)
                if i == len(parts) - 1:
                    break
                node = sub
    dest.mkdir(parents=True)
    _link(tree, site, dest)
    return sorted(wanted)


def fresh_venv(path: Path, view: Path) -> Path:
    """A venv without pip of its own whose path ends with `view`; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    (Path(site) / "_the_image.pth").write_text(f"import site; site.addsitedir({str(view)!r})\n")
    return python


def clean_env(home: Path, venv: Path) -> dict:
    """The environment of a fresh machine: no pip configuration (this machine's points at local wheels and
    indexes), no Python path of this checkout, the venv first on PATH, a home of its own (no user kernels)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV", "JUPYTER"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", HOME=str(home))
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    home.mkdir(parents=True, exist_ok=True)
    return env
