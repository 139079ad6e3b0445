"""The Python packages the course needs that a lent GPU machine lacks, as wheels for it, in .whl/ (git-ignored).

    python scripts/gpu_wheels.py            # here, with pip's index: downloads into .whl/, prints the size
    # there, before any command (the machine has no package index):
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD

The machine's image (/work/.library/device/KINDS.md, "Python packages already there") has torch 2.11 (CUDA 13),
transformers 5.17, accelerate 1.15, tensorboard, matplotlib, but no papermill or Jupyter kernel (run_course.py),
no FastAPI/uvicorn/pydantic (chapter 10, the serving stage) and no `datasets` (not needed: the benchmarks feed
Trainer a plain torch Dataset where it is missing). Wheels are for CPython 3.12 on x86-64 manylinux, the image's.
A package the image has is not carried: a second copy earlier on the path would shadow the image's own.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WANTED = [
    "papermill",  # run_course.py
    "nbformat",
    "nbclient",
    "ipykernel",  # the notebooks' kernel (papermill starts python3's)
    "fastapi",  # chapter 10 and gpu_check's serving stage
    "uvicorn",
    "httptools",  # uvicorn's parser with the limits distrinews_lib.serving sets (uvicorn[standard])
    "pydantic",
]
# The image's packages (KINDS.md, read 2026-11-17), normalised as pip names them.
IMAGE = set(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
    charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
    cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
    flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx humanize
    huggingface-hub hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
    jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
    markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
    multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
    nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
    nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
    nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless
    optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
    portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
    pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
    python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
    scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson
    six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
    tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision
    tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug
    wheel wrapt xarray xxhash yarl zipp""".split()
)
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def project(wheel: Path) -> str:
    """A wheel's project name as pip normalises it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()


def missing_requirements(dest: Path) -> dict:
    """{requirement: [wheels needing it]} for what no carried wheel and no package of the image provides (markers
    evaluated for CPython 3.12 on x86-64 Linux, extras left out)."""
    import zipfile

    from packaging.requirements import Requirement

    have = {project(w) for w in dest.glob("*.whl")} | IMAGE
    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "os_name": "posix",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "extra": ""}  # fmt: skip
    missing = {}
    for wheel in dest.glob("*.whl"):
        with zipfile.ZipFile(wheel) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            lines = z.read(meta).decode().splitlines()
        for line in lines:
            if line.startswith("Requires-Dist:"):
                req = Requirement(line.split(":", 1)[1].strip())
                name = re.sub(r"[-_.]+", "-", req.name).lower()
                if (not req.marker or req.marker.evaluate(env)) and name not in have:
                    missing.setdefault(name, []).append(project(wheel))
    return missing


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", type=Path, default=ROOT / ".whl")
    p.add_argument("--limit_mb", type=float, default=40, help="fail above this size (a call carries 64 MiB in all)")
    args = p.parse_args(argv)
    if args.dest.exists():
        shutil.rmtree(args.dest)
    args.dest.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12"]
    cmd += ["--implementation", "cp", *(x for plat in PLATFORMS for x in ("--platform", plat)), "--platform", "any"]
    subprocess.run([*cmd, "-d", str(args.dest), *WANTED], check=True)
    kept, dropped = [], []
    for wheel in sorted(args.dest.glob("*.whl")):
        if project(wheel) in IMAGE:
            wheel.unlink()
            dropped.append(project(wheel))
        else:
            kept.append(wheel)
    size = sum(w.stat().st_size for w in kept) / 2**20
    print(f"{len(kept)} wheels, {size:.1f} MiB in {args.dest} (left out, the image has them: {', '.join(dropped)})")
    # git ignores the folder (so it is never committed); a device call carries it by name (carry=[".whl"]).
    git = subprocess.run(["git", "rev-parse", "--git-path", "info/exclude"], cwd=ROOT, capture_output=True, text=True)
    exclude = ROOT / git.stdout.strip() if git.returncode == 0 else None
    if exclude and "/.whl/" not in (exclude.read_text() if exclude.exists() else ""):
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with open(exclude, "a") as f:
            f.write("/.whl/\n")
    missing = missing_requirements(args.dest)
    if missing:
        print(f"not carried and not in the image: {missing}", file=sys.stderr)
        return 1
    print("every requirement of the carried wheels is carried or in the image")
    if size > args.limit_mb:
        print(f"too large: {size:.1f} MiB > {args.limit_mb} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
