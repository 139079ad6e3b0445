"""The Kaggle/Colab archive (scripts/pack.py) installed as a learner installs it: unpacked read-only (as Kaggle mounts
a dataset under /kaggle/input), into a fresh environment that already has torch and transformers (the image:
tests/hosted_env.py), with pip's index off; then chapters 00-02 run on the CPU from the copied folder, and the
kaggle_t4x2 preset's decisions are checked against two mocked T4s. And the library from a git URL, as with Internet
on, against a local bare clone."""

import json
import os
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from distrinews_course import wheelhouse
from tests.hosted_env import clean_env, fresh_venv, image_view

ROOT = Path(__file__).resolve().parent.parent
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Kaggle's and Colab's images are Linux"),
]
STEPS = {}  # seconds per step, printed at the end of the module (pytest -s)
SNAPSHOT = {}  # the unpacked dataset as it was: every install and run must leave it so (root ignores read-only modes)


def timed(name, cmd, **kw):
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    STEPS[name] = time.perf_counter() - started
    return done


def read_only(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    """The archive for Kaggle and Colab (and this Python, for the test), unpacked read-only as Kaggle serves it."""
    tmp = tmp_path_factory.mktemp("pack")
    out = tmp / "distrinews_course.zip"
    done = timed("pack.py", [sys.executable, str(ROOT / "scripts" / "pack.py"), "--out", str(out), "--python", PYTHON])
    assert done.returncode == 0, done.stdout + done.stderr
    dataset = tmp / "input" / "distrinews-course"
    with zipfile.ZipFile(out) as z:
        z.extractall(dataset)
    read_only(dataset)
    SNAPSHOT[dataset] = snapshot(dataset)
    yield dataset / "distrinews"
    for path in [dataset, *dataset.rglob("*")]:  # let pytest remove it
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    print("\ntest_pack steps: " + ", ".join(f"{k} {v:.1f} s" for k, v in STEPS.items()))


def install(pack: Path, image: str, tmp: Path, dest_name: str = "working/distrinews"):
    """A fresh venv over `image`, then the archive's install; returns (python, env, dest, the install's output)."""
    view = tmp / "image"
    image_view(wheelhouse.load_image(image), view)
    python = fresh_venv(tmp / "venv", view)
    env = clean_env(tmp / "home", tmp / "venv")
    env = {k: v for k, v in env.items() if not k.startswith("DISTRINEWS")}  # a learner's machine: none of the tests'
    dest = tmp / dest_name
    done = timed(f"install on {image}", ["bash", str(pack / "distrinews_install.sh"), str(dest)], env=env, cwd=tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    return python, env, dest, done.stdout


def where(python, env, module: str) -> Path:
    """Where `python` imports `module` from, run from a folder that holds no module (not this checkout)."""
    code = f"import {module}; print({module}.__file__)"
    done = subprocess.run([str(python), "-c", code], env=env, capture_output=True, text=True, cwd=env["HOME"])
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def test_the_archive_holds_the_course_and_only_what_each_image_lacks(unpacked):
    manifest = json.loads((unpacked / "MANIFEST.json").read_text())
    reqs = wheelhouse.course_requirements()
    for name in ("kaggle", "colab"):
        image = wheelhouse.load_image(name)
        assert manifest["images"][name]["python"] == image.python
        assert manifest["images"][name]["lacks"][: len(wheelhouse.lacking(image, reqs))] == [
            str(r) for r in wheelhouse.lacking(image, reqs)
        ]
        for w in manifest["wheels"]:
            if any(f.startswith(f"{name} (Python {image.python})") for f in w["for"]):
                assert wheelhouse.serves(unpacked / "wheels" / w["file"], image.python, image.platform), w
    carried = {wheelhouse.project(w) for w in (unpacked / "wheels").glob("*.whl")}
    assert not carried & wheelhouse.NEVER_CARRIED, carried
    assert len(list((unpacked / "wheels").glob("*.whl"))) == len(manifest["wheels"])
    course = unpacked / "course"
    for must in (
        "notebooks/00_concepts.ipynb",
        "scripts/run_course.py",
        "distrinews_lib/__init__.py",
        "pyproject.toml",
    ):
        assert (course / must).is_file(), must
    assert not (course / "tests").exists() and not (course / ".ci").exists()
    hosted = (unpacked / "requirements-hosted.txt").read_text()
    assert "papermill" in hosted and "\njupyter\n" not in hosted and "-e" not in hosted


@pytest.fixture(scope="module")
def on_kaggle(unpacked, tmp_path_factory):
    return install(unpacked, "kaggle", tmp_path_factory.mktemp("kaggle"))


def test_offline_install_on_kaggles_image_copies_the_course_and_keeps_its_torch(on_kaggle, unpacked):
    python, env, dest, out = on_kaggle
    assert "torch 2" in out and "kept" in out
    assert where(python, env, "distrinews_course").parent.parent == dest  # editable, from the copy
    assert where(python, env, "torch").is_relative_to(dest.parent.parent / "image")  # the image's own
    assert os.access(dest / "notebooks" / "00_concepts.ipynb", os.W_OK)  # the copy is writable, the dataset not
    spec = "from jupyter_client.kernelspec import KernelSpecManager as K; print(K().get_kernel_spec('python3').argv[0])"
    kernel = subprocess.run(
        [str(python), "-c", spec], env=env, capture_output=True, text=True, check=True, cwd=env["HOME"]
    ).stdout
    assert Path(kernel.strip()).parent == python.parent, kernel  # papermill's kernel is the fresh environment's
    again = subprocess.run(["bash", str(unpacked / "distrinews_install.sh"), str(dest)], env=env, capture_output=True,
                           text=True)  # fmt: skip
    assert again.returncode == 0 and "already in" in again.stdout, again.stdout + again.stderr


def test_chapters_00_to_02_run_on_the_cpu_from_the_copied_folder(on_kaggle, tmp_path):
    python, env, dest, _ = on_kaggle
    runs = tmp_path / "runs"
    cmd = [
        str(python),
        "scripts/run_course.py",
        "--only",
        "00,01,02",
        "--offline",
        "--no-progress",
        "--runs-dir",
        str(runs),
    ]
    done = timed("chapters 00-02", cmd, env=env, cwd=dest, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(next(runs.glob("*/summary.json")).read_text())
    assert [(n["name"][:2], n["status"]) for n in summary["notebooks"]] == [("00", "ok"), ("01", "ok"), ("02", "ok")]
    assert (dest / "scripts" / "train_ddp.py").is_file()  # written by chapter 02 into the copy


@pytest.mark.parametrize("preset", ["kaggle_t4x2", "auto"])
def test_the_kaggle_t4x2_preset_dry_run_on_two_mocked_t4s(on_kaggle, preset):
    python, env, dest, _ = on_kaggle
    done = timed(f"dry run {preset}", [str(python), str(ROOT / "tests" / "kaggle_t4x2_dry_run.py"), preset],
                 env={**env, "HF_HUB_OFFLINE": "1"}, cwd=dest / "notebooks")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dry run | backend           nccl" in done.stdout and "NCCL_P2P_DISABLE=1" in done.stdout


def test_offline_install_on_colabs_image_brings_papermill_from_the_archive(unpacked, tmp_path):
    python, env, dest, _ = install(unpacked, "colab", tmp_path, "content/distrinews")
    venv_site = python.parent.parent / "lib"
    assert where(python, env, "papermill").is_relative_to(venv_site)  # the image has none: the archive's wheel


def test_the_install_refuses_what_it_cannot_do_with_one_line(unpacked, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("a learner's file")
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    env = clean_env(tmp_path / "home", bare)
    no_torch = subprocess.run(["bash", str(unpacked / "distrinews_install.sh"), str(tmp_path / "x")], env=env,
                              capture_output=True, text=True)  # fmt: skip
    assert no_torch.returncode == 3 and "has no torch" in no_torch.stderr and "Traceback" not in no_torch.stderr
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PYTHON": sys.executable}  # a python with torch
    done = subprocess.run(["bash", str(unpacked / "distrinews_install.sh"), str(taken)], env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 2 and "is not an earlier copy" in done.stderr
    assert (taken / "mine.txt").read_text() == "a learner's file" and len(list(taken.iterdir())) == 1


def test_pip_install_from_a_git_url_installs_the_library_with_its_data(tmp_path):
    """With Internet on: pip install git+https://.... Here against a bare clone (git+file://),
    building with the image's setuptools (no index to fetch one from)."""
    bare = tmp_path / "distrinews.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(ROOT), str(bare)], check=True)
    view = tmp_path / "image"
    image_view(wheelhouse.load_image("kaggle"), view)
    python = fresh_venv(tmp_path / "venv", view)
    env = clean_env(tmp_path / "home", tmp_path / "venv")
    url = f"git+file://{bare}"  # the form pip takes for git+https://github.com/OWNER/REPO.git
    done = timed("pip install git+file://", [str(python), "-m", "pip", "install", "-q", "--no-index",
                                             "--no-build-isolation", url], env=env, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert where(python, env, "distrinews_lib").is_relative_to(tmp_path / "venv")  # a copy, not this checkout
    check = ("from distrinews_lib.training import config; from distrinews_lib.data import sources; "
             "assert config.read_preset('kaggle_t4x2')[1]['batch_size'] == 32; "
             "print(len(sources.load_embedded().train_texts))")  # fmt: skip
    done = subprocess.run([str(python), "-c", check], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0 and int(done.stdout.split()[-1]) > 1000, done.stdout + done.stderr


def test_nothing_was_written_into_the_read_only_dataset(unpacked):
    # last in this file: after the installs, the second install and the chapters' run from the copy
    (dataset,) = SNAPSHOT
    assert snapshot(dataset) == SNAPSHOT[dataset]
    assert not any(os.stat(p).st_mode & stat.S_IWUSR for p in dataset.rglob("*") if not p.is_symlink())
