"""Which wheels a machine's image lacks for the course, fetched for that image's Python and platform.

An image is the list of Python packages a machine already has: Kaggle's GPU notebooks, Colab's, the GPU benchmark
session's machine (scripts/images/<name>.txt, pip-freeze lines under a header that says where they were read, which
Python the image runs and its platform). What the course needs there is requirements.txt, less what a hosted
notebook already is (HOSTED_SKIP). What an image lacks is carried as wheels: downloaded for its Python and platform,
with their dependencies, less every package the image has at a version the wheels accept. A torch never travels:
the image's own build (CUDA on Kaggle and Colab) is what the course must use.

    image = load_image("kaggle")
    needs = lacking(image, course_requirements())
    got = fetch(needs, image, dest)                     # pip download, then what the image has is dropped
    assert not unmet(got.wheels, image, needs)          # every requirement of what travels is met there
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename
from packaging.version import InvalidVersion, Version

from . import ROOT

IMAGES = ROOT / "scripts" / "images"
# What a hosted notebook (Kaggle, Colab) already is, so the course never installs it there.
HOSTED_SKIP = {"jupyter": "the Jupyter metapackage: a hosted notebook is already a Jupyter server and kernel"}
# Never carried, whatever an image lists: a wheel of these would replace the image's own CUDA build.
NEVER_CARRIED = {"torch", "torchvision", "torchaudio", "triton"}


class WheelhouseError(Exception):
    """A problem a user fixes (an unknown image, a malformed list, pip unable to download): one message."""


def norm(name: str) -> str:
    """A project's name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Image:
    name: str
    python: str  # "3.12": the version the image runs, which binary wheels must be built for
    platform: str  # "manylinux_2_35_x86_64": the newest platform tag its C library accepts
    packages: dict  # {normalised name: version, or None where the list gives none}
    about: str  # the header's prose: where the list was read

    def version(self, name: str) -> Version | None:
        v = self.packages.get(norm(name))
        try:
            return Version(v) if v else None
        except InvalidVersion:
            return None

    def has(self, req: Requirement) -> bool:
        """True when the image holds req's project at a version req accepts (a listed name without a version is
        taken to: the image was built against its own requirements)."""
        name = norm(req.name)
        if name not in self.packages:
            return False
        v = self.version(name)
        return v is None or req.specifier.contains(v, prereleases=True)

    @property
    def platforms(self) -> list[str]:
        return platform_tags(self.platform)


def load_image(name: str, folder: Path = IMAGES) -> Image:
    """scripts/images/<name>.txt (or a path): '# python: X.Y' and '# platform: TAG' in its header, then one package a
    line ('name==version' or 'name')."""
    path = Path(name) if name.endswith(".txt") else folder / f"{name}.txt"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.txt")))
        raise WheelhouseError(f"no image list {path}. Known images: {known}.")
    header, packages = {}, {}
    about = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = re.match(r"#\s*(python|platform):\s*(\S+)\s*$", line)
            if m:
                header[m.group(1)] = m.group(2)
            else:
                about.append(line.lstrip("# "))
            continue
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)(?:==(\S+))?$", line)
        if not m:
            raise WheelhouseError(f"{path}:{n}: '{line}' is not 'name' or 'name==version'")
        packages[norm(m.group(1))] = m.group(2)
    for key in ("python", "platform"):
        if key not in header:
            raise WheelhouseError(f"{path}: its header has no '# {key}: ...' line")
    if not re.fullmatch(r"3\.\d+", header["python"]):
        raise WheelhouseError(f"{path}: '# python: {header['python']}' is not a Python version like 3.12")
    return Image(path.stem, header["python"], header["platform"], packages, " ".join(about))


def platform_tags(newest: str) -> list[str]:
    """The platform tags a machine whose newest is `newest` accepts: manylinux_2_35_x86_64 also takes wheels for
    every older glibc (2_17 is manylinux2014)."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", newest)
    if not m:
        return [newest]
    glibc, arch = int(m.group(1)), m.group(2)
    tags = [f"manylinux_2_{v}_{arch}" for v in range(glibc, 16, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]


def requirement_lines(path: Path) -> list[str]:
    """The requirement lines of a requirements file: comments, options (-e, -r, -c) and blank lines left out."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            out.append(line)
    return out


def course_requirements(path: Path = ROOT / "requirements.txt") -> list[Requirement]:
    """What the course needs on a hosted notebook: requirements.txt less HOSTED_SKIP."""
    return [r for r in map(Requirement, requirement_lines(path)) if norm(r.name) not in HOSTED_SKIP]


def lacking(image: Image, reqs: list[Requirement], skip: dict | None = None) -> list[Requirement]:
    """The requirements the image does not meet, less `skip` ({name: why}). A torch the image lacks is an error:
    the course is installed over a torch, never with one."""
    skip = {norm(k) for k in (skip or {})}
    out = []
    for r in reqs:
        if norm(r.name) in skip or image.has(r):
            continue
        if norm(r.name) in NEVER_CARRIED:
            raise WheelhouseError(f"image {image.name} has no {r} and the course never carries one: {r.name} must "
                                  "come with the machine (its own CUDA build)")  # fmt: skip
        out.append(r)
    return out


@dataclass
class Fetched:
    wheels: list[Path] = field(default_factory=list)  # what travels
    dropped: list[str] = field(default_factory=list)  # downloaded as a dependency, but the image has it


def pip_download(specs: list[str], image: Image, python: str, dest: Path, deps: bool = True) -> None:
    """`pip download` of binary wheels for (python, the image's platform), into dest."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", python,
           "--implementation", "cp", "--abi", f"cp{python.replace('.', '')}", "--abi", "abi3", "--abi", "none",
           *(x for tag in [*image.platforms, "any"] for x in ("--platform", tag)), "-d", str(dest)]  # fmt: skip
    if not deps:
        cmd.append("--no-deps")
    done = subprocess.run([*cmd, *specs], capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise WheelhouseError(
            f"pip could not download {' '.join(specs)} for Python {python} on {image.platform}:\n{tail}"
        )


def metadata(wheel: Path) -> list[str]:
    """A wheel's METADATA lines."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return z.read(name).decode("utf-8", "replace").splitlines()


def requires(wheel: Path, python: str, extras: set[str] = frozenset()) -> list[Requirement]:
    """What a wheel requires on Linux x86-64 under `python`, with `extras` asked for."""
    env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
           "os_name": "posix", "platform_system": "Linux", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}  # fmt: skip
    out = []
    for line in metadata(wheel):
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if not req.marker or any(req.marker.evaluate({**env, "extra": e}) for e in ({""} | set(extras))):
                out.append(req)
    return out


def project(wheel: Path) -> str:
    return norm(str(parse_wheel_filename(wheel.name)[0]))


def extras_needs(image: Image, reqs: list[Requirement], python: str) -> list[Requirement]:
    """Requirements with extras whose project the image has (uvicorn[standard]): what those extras pull in, read
    from the wheel of the version the image has (downloaded without its dependencies)."""
    out = []
    for r in reqs:
        if not r.extras or not image.has(r):
            continue
        v = image.version(r.name)
        with tempfile.TemporaryDirectory() as tmp:
            pip_download([f"{r.name}=={v}" if v else r.name], image, python, Path(tmp), deps=False)
            wheel = next(Path(tmp).glob("*.whl"))
            plain = {str(q) for q in requires(wheel, python)}
            out += [q for q in requires(wheel, python, set(r.extras)) if str(q) not in plain]
    return out


def fetch(needs: list[Requirement], image: Image, dest: Path, python: str | None = None) -> Fetched:
    """Download `needs` with their dependencies for the image's platform and `python` (default the image's) into
    dest, then drop every wheel whose project the image has at a version all the downloaded wheels accept."""
    python = python or image.python
    dest.mkdir(parents=True, exist_ok=True)
    got = Fetched()
    if not needs:
        return got
    with tempfile.TemporaryDirectory() as tmp:
        pip_download([str(r) for r in needs], image, python, Path(tmp))
        wheels = sorted(Path(tmp).glob("*.whl"))
        asked = {}
        for w in wheels:
            for q in requires(w, python):
                asked.setdefault(norm(q.name), []).append(q)
        for r in needs:
            asked.setdefault(norm(r.name), []).append(r)
        for w in wheels:
            name = project(w)
            if name in NEVER_CARRIED:
                raise WheelhouseError(f"{w.name} came as a dependency of {', '.join(map(str, needs))}: the course "
                                      "never carries a torch (the machine's own build must stay)")  # fmt: skip
            if all(image.has(q) for q in asked.get(name, [])) and name in image.packages:
                got.dropped.append(name)
                continue
            target = dest / w.name
            if not target.exists():
                shutil.copy2(w, target)
            got.wheels.append(target)
    return got


def unmet(wheels: list[Path], image: Image, needs: list[Requirement], python: str | None = None) -> list[str]:
    """What neither the carried wheels nor the image provide, as 'requirement (wanted by X)' lines: empty when an
    offline install (pip --no-index) of `needs` can succeed on the image."""
    python = python or image.python
    have = {}
    for w in wheels:
        have[project(w)] = Version(str(parse_wheel_filename(w.name)[1]))
    problems = []

    def met(q: Requirement) -> bool:
        name = norm(q.name)
        if name in have:
            return q.specifier.contains(have[name], prereleases=True)
        return image.has(q)

    extras = {norm(r.name): set(r.extras) for r in needs}
    for r in needs:
        if not met(r):
            problems.append(f"{r} (wanted by the course)")
    for w in wheels:
        for q in requires(w, python, extras.get(project(w), set())):
            if not met(q):
                problems.append(f"{q} (wanted by {w.name})")
    return sorted(set(problems))


def tags_of(wheel: Path) -> list[str]:
    """A wheel's tags as 'python-abi-platform' strings."""
    return sorted(str(t) for t in parse_wheel_filename(wheel.name)[3])


def serves(wheel: Path, python: str, platform: str) -> bool:
    """True when the wheel installs on CPython `python` (3.12) on a machine whose newest platform tag is `platform`."""
    cp = f"cp{python.replace('.', '')}"
    pys = {cp, f"py{python.replace('.', '')}", "py3", f"py{python[0]}"}
    abis = {cp, "abi3", "none"}
    plats = set(platform_tags(platform)) | {"any"}
    for t in parse_wheel_filename(wheel.name)[3]:
        abi3_ok = t.abi != "abi3" or (t.interpreter.startswith("cp") and int(t.interpreter[3:]) <= int(cp[3:]))
        if (t.interpreter in pys or (t.abi == "abi3" and abi3_ok)) and t.abi in abis and t.platform in plats:
            return True
    return False
