#!/usr/bin/env bash
# Distributed training with torchrun (c10d rendezvous): bash tools/dist_train.sh CONFIG PROCS_PER_NODE [train.py args...]
# Multi-node, the same command on every node:
#   NNODES=2 NODE_RANK=0|1 MASTER_ADDR=<node 0's address> MASTER_PORT=29500 bash tools/dist_train.sh CONFIG 8
# NODE_RANK 0 hosts the rendezvous store at MASTER_ADDR:MASTER_PORT (global ranks come from the rendezvous).
# RDZV_ID (default mmplugin) names the job; RDZV_JOIN_TIMEOUT (s, default 600) bounds the wait for all nodes.
# A failed process ends the job on every node (no restarts); docs/distributed.md has the timeouts.
set -euo pipefail
CONFIG=$1; PROCS=$2; shift 2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"; [ -x "$PY" ] || PY=python
NNODES=${NNODES:-1}; NODE_RANK=${NODE_RANK:-0}
ADDR=${MASTER_ADDR:-127.0.0.1}; PORT=${MASTER_PORT:-${PORT:-29500}}  # PORT: the older name, still read
IS_HOST=$([ "$NODE_RANK" = 0 ] && echo 1 || echo 0)
exec "$PY" -m torch.distributed.run --nnodes="$NNODES" --nproc-per-node="$PROCS" \
  --rdzv-backend=c10d --rdzv-endpoint="$ADDR:$PORT" --rdzv-id="${RDZV_ID:-mmplugin}" \
  --rdzv-conf="is_host=$IS_HOST,join_timeout=${RDZV_JOIN_TIMEOUT:-600},read_timeout=${RDZV_READ_TIMEOUT:-60}" \
  --max-restarts=0 "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "$@"
