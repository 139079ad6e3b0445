#!/usr/bin/env bash
# Launch scripts/train_ddp.py on N processes on this machine (one per GPU, or N CPU processes).
#   bash scripts/run_ddp.sh 2 --epochs 3
#   bash scripts/run_ddp.sh 2 --config kaggle_t4x2
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
if [ -n "${NNODES:-}" ] && [ "${NNODES}" != "1" ]; then
  # A node that joins a later rendezvous round (a replacement) would wait for keys the survivors wrote in
  # the first round of torch's shared store (pytorch#135712): give every round its own store.
  export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
  cmd=("$PY" -m torch.distributed.run --nnodes="$NNODES" --node_rank="${NODE_RANK:?set NODE_RANK}"
       --rdzv_backend=c10d --rdzv_endpoint="${MASTER_ADDR:?set MASTER_ADDR}:${MASTER_PORT:-29500}"
       --nproc_per_node="$N" scripts/train_ddp.py "$@")
else
  cmd=("$PY" -m torch.distributed.run --standalone --nproc_per_node="$N" scripts/train_ddp.py "$@")
fi
echo "+ ${cmd[*]}"   # the plain torchrun command line (python -m torch.distributed.run IS torchrun)
exec "${cmd[@]}"
