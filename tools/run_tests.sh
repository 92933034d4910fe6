#!/usr/bin/env bash
# The README's test command: set up (or reuse) .venv, then run the whole test suite. Extra args go to pytest.
#
# PyTorch and oneDNN choose kernels by instruction set at run time. On a machine newer than AVX2 the numeric
# tests (marker `numeric`: parity, non-finite, bf16, export parity) run again on each older kernel family that
# `mmplugin/utils/cpu.py --lower-envs` names (AMX: AVX512-BF16 and AVX2; AVX-512: AVX2), capped with
# ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY. With extra pytest arguments only the first pass runs;
# MMPLUGIN_OLDER_ISAS=0 skips the other passes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
PYTEST=("$PY" -m pytest -q -p no:cacheprovider)
CPU=("$PY" "$ROOT/mmplugin/utils/cpu.py")  # standalone: no package import
family() { env "$@" "${CPU[@]}" --family; }

echo "[tests] all tests on: $("$PY" -m mmplugin.utils.cpu)"
"${PYTEST[@]}" tests "$@"
if [ $# -gt 0 ] || [ "${MMPLUGIN_OLDER_ISAS:-1}" = 0 ]; then
  exit 0
fi
exercised="$(family)"
while IFS= read -r lower; do
  [ -n "$lower" ] || continue
  # shellcheck disable=SC2086  # NAME=value pairs, split on purpose
  echo "[tests] numeric tests again ($lower): $(env $lower "${CPU[@]}")"
  # shellcheck disable=SC2086
  env $lower "${PYTEST[@]}" -m 'numeric and not slow' tests
  # shellcheck disable=SC2086
  exercised="$exercised; $(family $lower)"
done < <("${CPU[@]}" --lower-envs)
echo "[tests] kernel families exercised: $exercised"
