#!/usr/bin/env bash
# The README's test command: set up (or reuse) .venv, then run the whole test suite. Extra args go to pytest.
#
# The suite runs in parallel processes (pytest-xdist, one per core up to 4, whole files per process, one thread
# each; MMPLUGIN_TEST_WORKERS=0 runs it in this process with torch's default threads).
#
# PyTorch and oneDNN choose kernels by instruction set at run time. On a machine newer than AVX2 the numeric
# tests (marker `numeric`: parity, non-finite, bf16, export parity) run again on the next-lower kernel family
# that `mmplugin/utils/cpu.py --lower-envs` names (AMX: AVX512-BF16; AVX-512: AVX2), capped with
# ONEDNN_MAX_CPU_ISA / ATEN_CPU_CAPABILITY. With extra pytest arguments only the first pass runs;
# MMPLUGIN_OLDER_ISAS=0 skips the second pass.
#
# --quick (first argument): the working tier, a slice of every area in ~5 minutes on 2 cores: no `slow` tests, one
# instance of each `heavy` family of checks, one kernel family. CI runs the whole suite (no argument).
#
# MMPLUGIN_STACK=onedl runs in .venv-onedl, the maintained onedl-* forks of mmengine / mmcv / mmdet / mmseg
# (tools/setup_env.sh builds it); CI runs the quick tier there too.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
QUICK=0
if [ "${1:-}" = "--quick" ]; then QUICK=1; shift; fi
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
VENV="$ROOT/.venv"
[ "${MMPLUGIN_STACK:-openmmlab}" = onedl ] && VENV="$ROOT/.venv-onedl"
PY="$VENV/bin/python"
PYTEST=("$PY" -m pytest -q -p no:cacheprovider --durations=15)  # the slowest tests: the suite has a 25-minute budget
workers="${MMPLUGIN_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}"
[ "$workers" -le 4 ] || workers=4
if [ "$workers" -ge 2 ]; then
  PYTEST+=(-n "$workers" --dist loadfile)
  export OMP_NUM_THREADS=1   # one thread per worker process: the cores are shared out by processes, not threads
fi
CPU=("$PY" "$ROOT/mmplugin/utils/cpu.py")  # standalone: no package import
family() { env "$@" "${CPU[@]}" --family; }

if [ "$QUICK" = 1 ]; then
  echo "[tests] quick tier on: $("${CPU[@]}"); stack: $("$PY" "$ROOT/mmplugin/utils/stack.py")"
  exec "${PYTEST[@]}" -m 'not slow and not heavy' tests "$@"
fi
echo "[tests] all tests on: $("${CPU[@]}"); stack: $("$PY" "$ROOT/mmplugin/utils/stack.py")"
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
