#!/usr/bin/env bash
# The README's test command: set up (or reuse) .venv, then run the whole test suite. Extra args go to pytest.
#
# PyTorch and oneDNN choose kernels by instruction set at run time, so on a machine newer than AVX2 (AVX-512,
# AVX512-BF16, AMX) the numeric tests (marker `numeric`: parity, non-finite, bf16, export parity) run a second
# time on the AVX2 kernel family (ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY, see mmplugin/utils/cpu.py). With
# extra pytest arguments only the first pass runs; MMPLUGIN_SECOND_ISA=0 skips the second pass.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
PYTEST=("$PY" -m pytest -q -p no:cacheprovider)

echo "[tests] pass 1: $("$PY" -m mmplugin.utils.cpu)"
"${PYTEST[@]}" tests "$@"

lower="$("$PY" -m mmplugin.utils.cpu --lower-env)"
if [ $# -gt 0 ] || [ "${MMPLUGIN_SECOND_ISA:-1}" = 0 ]; then
  exit 0
fi
if [ -z "$lower" ]; then
  echo "[tests] this CPU has no kernel family newer than AVX2: the numeric tests ran once, on AVX2 (or older)"
  exit 0
fi
# shellcheck disable=SC2086  # NAME=value pairs, split on purpose
echo "[tests] pass 2 (numeric tests, older kernel family: $lower): $(env $lower "$PY" -m mmplugin.utils.cpu)"
# shellcheck disable=SC2086
env $lower "${PYTEST[@]}" -m numeric tests
echo "[tests] kernel families exercised: $("$PY" -c 'from mmplugin.utils.cpu import kernel_family; print(kernel_family())') and $(env $lower "$PY" -c 'from mmplugin.utils.cpu import kernel_family; print(kernel_family())')"
