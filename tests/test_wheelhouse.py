"""distrinews_course/wheelhouse.py without the network: reading an image's list, what it lacks, which wheels serve
which Python and platform, and the check that an offline install can succeed (on wheels made here)."""

import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from distrinews_course import wheelhouse
from distrinews_course.wheelhouse import Image, WheelhouseError

IMAGE = Image("t", "3.12", "manylinux_2_35_x86_64", {"torch": "2.10.0+cu128", "nbformat": "5.1.0", "tqdm": None}, "")


def make_wheel(folder: Path, name: str, version: str, tag: str = "py3-none-any", requires=()) -> Path:
    path = folder / f"{name}-{version}-{tag}.whl"
    meta = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                      *(f"Requires-Dist: {r}" for r in requires)])  # fmt: skip
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta + "\n")
    return path


def test_the_shipped_images_read_and_have_a_torch():
    for name in ("kaggle", "colab", "gpu_session"):
        image = wheelhouse.load_image(name)
        assert image.python.startswith("3.") and image.platform.startswith("manylinux_2_")
        assert "torch" in image.packages and "transformers" in image.packages and image.about


def test_a_malformed_or_unknown_image_list_is_one_clear_error(tmp_path):
    with pytest.raises(WheelhouseError, match="Known images: .*kaggle"):
        wheelhouse.load_image("nosuch")
    bad = tmp_path / "bad.txt"
    bad.write_text("# python: 3.12\n# platform: manylinux_2_35_x86_64\nnumpy>=2\n")
    with pytest.raises(WheelhouseError, match=r"bad.txt:3: 'numpy>=2' is not 'name' or 'name==version'"):
        wheelhouse.load_image(str(bad))
    bad.write_text("# python: 3.12\nnumpy\n")
    with pytest.raises(WheelhouseError, match="no '# platform: ...' line"):
        wheelhouse.load_image(str(bad))
    bad.write_text("# python: three\n# platform: x\nnumpy\n")
    with pytest.raises(WheelhouseError, match="not a Python version"):
        wheelhouse.load_image(str(bad))


def test_lacking_is_what_the_image_misses_or_holds_too_old():
    reqs = [Requirement(r) for r in ("torch>=2.1", "nbformat>=5.2", "tqdm>=99", "papermill", "jupyter-x")]
    assert [str(r) for r in wheelhouse.lacking(IMAGE, reqs, skip={"jupyter_x": "why"})] == [
        "nbformat>=5.2",
        "papermill",
    ]
    # tqdm's version is not listed: the image was built with what it needs, so it counts as there
    with pytest.raises(WheelhouseError, match="never carries one"):
        wheelhouse.lacking(IMAGE, [Requirement("torch>=3")])


def test_hosted_requirements_leave_jupyter_out_and_keep_the_rest():
    names = [wheelhouse.norm(r.name) for r in wheelhouse.course_requirements()]
    assert "jupyter" not in names and {"torch", "transformers", "papermill", "fastapi"} <= set(names)


def test_platform_tags_take_every_older_glibc():
    tags = wheelhouse.platform_tags("manylinux_2_35_x86_64")
    assert tags[0] == "manylinux_2_35_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert "manylinux_2_36_x86_64" not in tags


@pytest.mark.parametrize(
    "tag, python, serves",
    [
        ("py3-none-any", "3.13", True),
        ("cp312-cp312-manylinux_2_17_x86_64", "3.12", True),
        ("cp312-cp312-manylinux_2_17_x86_64", "3.13", False),  # another Python's ABI
        ("cp310-abi3-manylinux_2_28_x86_64", "3.12", True),  # the stable ABI, from 3.10 on
        ("cp313-abi3-manylinux_2_28_x86_64", "3.12", False),
        ("cp312-cp312-manylinux_2_39_x86_64", "3.12", False),  # needs a newer glibc than 2.35
        ("cp312-cp312-macosx_11_0_arm64", "3.12", False),
    ],
)
def test_serves_reads_a_wheels_tags(tmp_path, tag, python, serves):
    wheel = make_wheel(tmp_path, "pkg", "1.0", tag)
    assert wheelhouse.serves(wheel, python, "manylinux_2_35_x86_64") is serves


def test_unmet_names_what_neither_the_wheels_nor_the_image_provide(tmp_path):
    deps = ["nbformat>=5.2", "tenacity>=5", 'pywin32; sys_platform == "win32"']  # not on Linux: not needed
    paper = make_wheel(tmp_path, "papermill", "2.7.0", requires=deps)
    needs = [Requirement("papermill")]
    assert wheelhouse.unmet([paper], IMAGE, needs) == [
        "nbformat>=5.2 (wanted by papermill-2.7.0-py3-none-any.whl)",
        "tenacity>=5 (wanted by papermill-2.7.0-py3-none-any.whl)",
    ]
    carried = [paper, make_wheel(tmp_path, "nbformat", "5.10.4"), make_wheel(tmp_path, "tenacity", "9.0")]
    assert wheelhouse.unmet(carried, IMAGE, needs) == []
    # an extra asked for by the course pulls in what the extra needs
    uv = make_wheel(tmp_path, "uvicorn", "0.40", requires=['httptools>=0.6; extra == "standard"'])
    assert wheelhouse.unmet([uv], IMAGE, [Requirement("uvicorn")]) == []
    assert wheelhouse.unmet([uv], IMAGE, [Requirement("uvicorn[standard]")]) == [
        'httptools>=0.6; extra == "standard" (wanted by uvicorn-0.40-py3-none-any.whl)'
    ]
