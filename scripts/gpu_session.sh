#!/usr/bin/env bash
# The GPU benchmark session: the course and the GPU benchmarks on one machine with one GPU (an H100 or H200 here;
# Python 3.12, torch 2.11 for CUDA 13, transformers 5, accelerate, no package index), in parts of at most 10 minutes
# each, so that each part fits one sitting on a shared GPU. Each part keeps its record in /tmp for the next part on
# the same machine; on a fresh machine the record committed in benchmarks/ is merged instead.
#   bash scripts/gpu_session.sh course   # the chapters through run_course.py on the GPU, offline, embedded sample
#   (or course1 then course2: chapters 00-05, then 06 onwards, where one part cannot hold them all)
#   bash scripts/gpu_session.sh race     # bench_train's race: ours, bare, CUDA graphs, Trainer x3; launches, syncs
#   bash scripts/gpu_session.sh extras   # the CUDA-graphs path checked, the large_gpu preset's MFU, the launch floor
#   (train = race + extras in one part, where ten minutes hold both)
#   bash scripts/gpu_session.sh rehearse # on a CPU: the same parts at CPU sizes (nothing it writes claims a GPU)
# The machine lacks some of the course's packages: `python scripts/gpu_wheels.py` puts them in .whl/ beforehand, and
# the session installs them from there (pip's index off) before each part. Results go to $OUT when it is set (a
# folder the session's files come back from; keep it under 8 files), else outputs/gpu_session/; copy the
# benchmark files into benchmarks/ afterwards.
set -uo pipefail
cd "$(dirname "$0")/.."
PART=${1:-}
OUT=${OUT:-outputs/gpu_session}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
if [ -d .whl ] && ! $PY -c "import papermill, fastapi" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
slug=$($PY -c "from distrinews_course.bench.provenance import machine_slug; print(machine_slug())") || exit 3
gpu=$($PY -c "import torch; print(int(torch.cuda.is_available()))")
echo "gpu_session $PART: $slug, $(git rev-parse --short HEAD 2>/dev/null || echo '?'), results in $OUT"

small_tar() {  # logs, records and JSON of a run folder: the executed notebooks are too large to bring back
  (cd "$1" && find . \( -name '*.json' -o -name '*.log' \) -size -4M | tar czf - -T -) > "$2"
}

# The course in one part, or in two halves (the same machine keeps the first half's record in /tmp for the second; on
# a fresh one, a record of the first half committed in benchmarks/ is merged instead).
chapters_from() {  # the chapters in notebooks/ numbered $1 or above, as run_course.py's --only takes them
  ls notebooks/ | sed -n 's/^\([0-9][0-9]\)_.*\.ipynb$/\1/p' | awk -v from="$1" '$1 >= from' | paste -sd, -
}
COURSE1=00,01,02,03,04,05
COURSE2=$(chapters_from 06)
KEEP=/tmp/gpu_session
mkdir -p "$KEEP"
course_part() {
  [ "$gpu" = 1 ] || { echo "no CUDA GPU here: use 'rehearse' on a CPU"; exit 2; }
  local record="$KEEP/course_gpu_$slug.json" started
  [ -f "$record" ] || [ -z "$1" ] || cp "benchmarks/course_gpu_$slug.json" "$record" 2>/dev/null
  started=$(date +%s)
  $PY scripts/gpu_check.py --offline --only notebooks --run_dir "/tmp/gpu_course$2" ${1:+--chapters "$1"} \
    --course_out "$record" --out "$OUT/gpu_check_course$2.json" 2>&1 | tee "$OUT/course$2.log"
  rc=${PIPESTATUS[0]}
  cp "$record" "$OUT/" 2>/dev/null
  # The chapters' times, for the README's GPU column (merged part by part; copy it into benchmarks/ afterwards).
  local times="$KEEP/chapters_$slug.json" run
  [ -f "$times" ] || [ -z "$1" ] || cp "benchmarks/chapters_$slug.json" "$times" 2>/dev/null
  run=$(ls -d "/tmp/gpu_course$2"/runs/*/ 2>/dev/null | tail -1)
  [ -n "$run" ] && $PY scripts/make_docs.py --record-run "$run" --record-out "$times" && cp "$times" "$OUT/"
  small_tar "/tmp/gpu_course$2" "$OUT/course$2_runs.tgz"
  echo "course part $PART: exit $rc after $(( $(date +%s) - started )) s"
  exit "$rc"
}

case "$PART" in
  course) course_part "" "" ;;
  course1) course_part "$COURSE1" 1 ;;
  course2) course_part "$COURSE2" 2 ;;
  race | extras | train)
    [ "$gpu" = 1 ] || { echo "no CUDA GPU here: use 'rehearse' on a CPU"; exit 2; }
    record="$KEEP/train_$slug.json"
    [ -f "$record" ] || cp "benchmarks/train_$slug.json" "$record" 2>/dev/null
    case "$PART" in  # race: ours, bare, CUDA graphs, Trainer x3, counts; extras: the graphs path, preset, floor
      race) only=bench_train; sections=compare ;;
      extras) only=graphs,bench_train; sections=preset,floor ;;
      train) only=graphs,bench_train; sections=compare,preset,floor ;;
    esac
    started=$(date +%s)
    $PY scripts/gpu_check.py --offline --only "$only" --bench_sections "$sections" --bench_update --bench_rounds 2 \
      --run_dir "/tmp/gpu_$PART" --bench_out "$record" --out "$OUT/gpu_check_$PART.json" 2>&1 | tee "$OUT/$PART.log"
    rc=${PIPESTATUS[0]}
    cp "$record" "$OUT/" 2>/dev/null
    small_tar "/tmp/gpu_$PART" "$OUT/${PART}_runs.tgz"
    echo "$PART part: exit $rc after $(( $(date +%s) - started )) s"
    exit "$rc"
    ;;
  rehearse)
    [ "$gpu" = 0 ] || { echo "a GPU is here: run 'course' and 'train'"; exit 2; }
    R=${REHEARSAL:-outputs/gpu_rehearsal}
    mkdir -p "$R"
    started=$(date +%s)
    $PY scripts/gpu_check.py --dry-run --offline --run_dir "$R/plan" --out "$R/gpu_check_dry_run.json" || exit 1
    $PY scripts/run_course.py --offline --nproc 1 --no-progress --runs-dir "$R/runs" || exit 1
    $PY -m distrinews_course.bench.graphs_check --out "$R/graphs.json" || exit 1
    $PY scripts/bench_train.py --quick --models tiny --sections compare --no-plots --out "$R/train_rehearsal.json" || exit 1
    $PY scripts/bench_train.py --quick --models tiny --sections preset,floor --no-plots --update \
      --out "$R/train_rehearsal.json" || exit 1  # as race, then extras, on a GPU
    echo "rehearsal: ok after $(( $(date +%s) - started )) s (CPU figures, in $R; none is a GPU result)"
    ;;
  *)
    echo "usage: bash scripts/gpu_session.sh course|course1|course2|race|extras|train|rehearse"
    exit 2
    ;;
esac
