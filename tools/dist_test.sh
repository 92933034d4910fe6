#!/usr/bin/env bash
# Distributed evaluation with torchrun: bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py args...]
set -euo pipefail
CONFIG=$1; CHECKPOINT=$2; GPUS=$3; shift 3
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"; [ -x "$PY" ] || PY=python
exec "$PY" -m torch.distributed.run --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" \
  --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${MASTER_PORT:-${PORT:-29500}}" --nproc_per_node="$GPUS" \
  "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
