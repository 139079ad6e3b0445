#!/usr/bin/env bash
# Launch scripts/train_ddp.py on N processes on this machine (one per GPU, or N CPU processes).
#   bash scripts/run_ddp.sh 2 --epochs 3
#   bash scripts/run_ddp.sh 2 --config kaggle_t4x2
#   MAX_RESTARTS=3 bash scripts/run_ddp.sh 2 --resume auto --snapshot_every 200   # survives a dying rank
# Several nodes: run on every node with NNODES, NODE_RANK and MASTER_ADDR set, e.g.
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash scripts/run_ddp.sh 4 --config single_gpu
set -euo pipefail
if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
  echo "usage: bash scripts/run_ddp.sh N [train_ddp.py flags...]   (N = processes on this node, e.g. 2)" >&2
  exit 2
fi
N=$1; shift
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
# Every rendezvous round (a restart, a replacement node) gets a store of its own: in torch's shared store the dead
# attempt's keys are still there (pytorch#167288), and a replacement node waits for first-round keys (pytorch#135712).
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
# gloo connects each pair of ranks on first use: its eager connect failed about half the time right after a restart.
export TORCH_GLOO_LAZY_INIT=${TORCH_GLOO_LAZY_INIT:-1}
restarts=(--max-restarts="${MAX_RESTARTS:-0}")    # MAX_RESTARTS=3: torchrun restarts the ranks after a failure
if [ -n "${NNODES:-}" ] && [ "${NNODES}" != "1" ]; then
  cmd=("$PY" -m torch.distributed.run --nnodes="$NNODES" --node_rank="${NODE_RANK:?set NODE_RANK}"
       --rdzv_backend=c10d --rdzv_endpoint="${MASTER_ADDR:?set MASTER_ADDR}:${MASTER_PORT:-29500}"
       "${restarts[@]}" --nproc_per_node="$N" scripts/train_ddp.py "$@")
else
  cmd=("$PY" -m torch.distributed.run --standalone "${restarts[@]}" --nproc_per_node="$N" scripts/train_ddp.py "$@")
fi
echo "+ ${cmd[*]}"   # the plain torchrun command line (python -m torch.distributed.run IS torchrun)
exec "${cmd[@]}"
