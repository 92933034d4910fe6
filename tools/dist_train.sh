#!/usr/bin/env bash
# Distributed training with torchrun: bash tools/dist_train.sh CONFIG GPUS [train.py args...]
# Multi-node: NNODES=2 NODE_RANK=0|1 MASTER_ADDR=host PORT=29500 bash tools/dist_train.sh CONFIG GPUS
set -euo pipefail
CONFIG=$1; GPUS=$2; shift 2
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"; [ -x "$PY" ] || PY=python
exec "$PY" -m torch.distributed.run --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" \
  --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" --nproc_per_node="$GPUS" \
  "$ROOT/tools/train.py" "$CONFIG" --launcher pytorch "$@"
