#!/usr/bin/env bash
# The DistriNews course's offline install, as scripts/pack.py puts it in its archive (distrinews_install.sh):
#   bash distrinews_install.sh [DEST]   # DEST: /kaggle/working/distrinews on Kaggle, /content/distrinews on Colab
# It copies the course from this (read-only) folder to DEST, then installs with pip's index off: the wheels beside
# it (what the machine's image lacks), and the course itself, editable from DEST. The archive carries no torch, and
# the torch already there is pinned while pip runs, so the machine's CUDA build is never replaced.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${PYTHON:-python3}
if [ -n "${1:-}" ]; then DEST=$1
elif [ -d /kaggle/working ]; then DEST=/kaggle/working/distrinews
elif [ -d /content ]; then DEST=/content/distrinews
else echo "distrinews_install: say where to copy the course: bash $0 DEST" >&2; exit 2
fi
[ -d "$HERE/course" ] && [ -d "$HERE/wheels" ] || {
  echo "distrinews_install: $HERE holds no course/ and wheels/: run this script from the unpacked archive" >&2; exit 2; }
torch_before=$("$PY" -c "import torch; print(torch.__version__, torch.version.cuda)" 2>/dev/null) || {
  echo "distrinews_install: $PY has no torch. The archive carries none on purpose (it must never replace a GPU" \
    "machine's CUDA build): install torch first, or run this with the notebook's Python (PYTHON=...)." >&2; exit 3; }

# The course, copied once: a second run keeps the learner's edits.
if [ -f "$DEST/.distrinews_copy" ]; then
  echo "distrinews_install: the course is already in $DEST (kept as it is; remove the folder to start afresh)"
elif [ -e "$DEST" ] && [ -n "$(ls -A "$DEST" 2>/dev/null)" ]; then
  echo "distrinews_install: $DEST exists and is not an earlier copy of the course: pass another folder" >&2; exit 2
else
  mkdir -p "$DEST"
  cp -R "$HERE/course/." "$DEST/"
  chmod -R u+w "$DEST"  # a copy of a read-only dataset is read-only too; the chapters write scripts and outputs
  cp "$HERE/MANIFEST.json" "$DEST/.distrinews_copy"
  echo "distrinews_install: the course copied to $DEST"
fi

# pip, offline: what the image has stays (torch pinned to itself), the rest comes from wheels/.
keep=$(mktemp)
trap 'rm -f "$keep"' EXIT
"$PY" -m pip list --format=freeze 2>/dev/null | grep -iE '^(torch|torchvision|torchaudio|triton)==' > "$keep" || true
"$PY" -m pip install -q --no-index --find-links "$HERE/wheels" -c "$keep" -r "$HERE/requirements-hosted.txt"
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e "$DEST"
torch_after=$("$PY" -c "import torch; print(torch.__version__, torch.version.cuda)")
if [ "$torch_before" != "$torch_after" ]; then
  echo "distrinews_install: torch changed from $torch_before to $torch_after; this should never happen" >&2; exit 1
fi
"$PY" -c "import distrinews_lib, distrinews_course, papermill" || exit 1
echo "distrinews_install: ok. torch $torch_after kept; the course is in $DEST (open its notebooks/ folder, or run"
echo "  python $DEST/scripts/run_course.py from there)"
