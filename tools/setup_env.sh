#!/usr/bin/env bash
# Create or reuse .venv in the repository root with torch, mmengine, mmcv (with compiled ops), mmdet, mmseg and
# mmplugin (editable). Idempotent: when nothing changed since the last successful run it only verifies imports.
#
# Environment:
#   MMPLUGIN_STACK    openmmlab (default: mmengine, mmcv, mmdet, mmsegmentation in .venv) or onedl (the maintained
#                     onedl-* forks, same import names, in .venv-onedl); the exact versions are the constraints file
#                     requirements/<stack>.txt, the plugin's metadata names only tested ranges (extras)
#   PYTHON            interpreter for a new venv (default: python3.11 if present, else python3)
#   MMPLUGIN_CACHE    where built mmcv wheels are kept (default: ~/.cache/mmplugin)
#   MAX_JOBS          parallel compile jobs for mmcv (default: all cores)
#   FORCE_CUDA=1      compile mmcv's CUDA ops although no GPU is visible (login node, container build; needs nvcc
#                     matching torch's CUDA). Without it mmcv gets CUDA ops only when a GPU is visible here.
#   CUDA_HOME         the CUDA toolkit (with bin/nvcc) for that build, when nvcc is not found on its own
#
# Cached mmcv wheels are kept per torch version, Python and ops kind (...-cudaops / ...-cpuops); a wheel without
# CUDA ops is never reused where they are needed (a GPU visible, or FORCE_CUDA=1), and mmcv's ops are verified on
# CUDA tensors whenever a GPU is visible (tools/mmcv_ops.py).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="${MMPLUGIN_STACK:-openmmlab}"
case "$STACK" in
  openmmlab) VENV="$ROOT/.venv" ;;
  onedl) VENV="$ROOT/.venv-onedl" ;;
  *) printf '[setup] ERROR: MMPLUGIN_STACK must be openmmlab or onedl, got %s\n' "$STACK" >&2; exit 1 ;;
esac
CONSTRAINTS="$ROOT/requirements/$STACK.txt"
CACHE="${MMPLUGIN_CACHE:-$HOME/.cache/mmplugin}"
pin() { sed -n "s/^$1==//p" "$CONSTRAINTS"; }  # the tested version of a distribution
MMENGINE_DIST="$([ "$STACK" = onedl ] && echo onedl-mmengine || echo mmengine)"
MMCV_DIST="$([ "$STACK" = onedl ] && echo onedl-mmcv || echo mmcv)"
MMCV_VERSION="$(pin "$MMCV_DIST")"
export MMPLUGIN_STACK="$STACK"  # tools/mmcv_ops.py reads the same constraints file
STAMP="$VENV/.mmplugin-setup"

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# What the stamp covers: this script and the dependency list.
want_stamp="$(cat "$ROOT/tools/setup_env.sh" "$ROOT/tools/mmcv_ops.py" "$ROOT/pyproject.toml" "$CONSTRAINTS" | sha256sum | cut -d' ' -f1)"
VPY="$VENV/bin/python"

if [ -x "$VPY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ]; then
  if "$VPY" -c "import mmplugin, mmcv.ops, mmdet, mmseg" 2>/dev/null && "$VPY" "$ROOT/tools/mmcv_ops.py" verify; then
    say "environment up to date ($VENV, $STACK stack)"
    exit 0
  fi
  say "stamp present but imports or mmcv's ops (on a visible GPU too) fail: repairing"
fi

# ---------------------------------------------------------------- interpreter and venv
if [ ! -x "$VPY" ]; then
  PY="${PYTHON:-}"
  if [ -z "$PY" ]; then
    if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
  fi
  command -v "$PY" >/dev/null 2>&1 || die "no Python interpreter '$PY' found; set PYTHON=/path/to/python3.10-3.12"
  "$PY" - <<'EOF' || die "Python 3.10-3.12 is required (found $("$PY" --version 2>&1))"
import sys
sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 12) else 1)
EOF
  say "creating $VENV with $("$PY" --version 2>&1)"
  "$PY" -m venv "$VENV" || die "could not create a venv (on Debian/Ubuntu: apt install python3-venv)"
fi
PIP=("$VPY" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q -U pip 'setuptools>=61,<81' wheel

# ---------------------------------------------------------------- torch: keep the user's 2.x, else install one
if "$VPY" -c "import torch" 2>/dev/null; then
  tv="$("$VPY" -c 'import torch; print(torch.__version__)')"
  case "$tv" in
    2.*) say "using installed torch $tv" ;;
    *) die "torch $tv is installed in $VENV but mmplugin needs torch 2.x; remove .venv or install torch 2.x" ;;
  esac
else
  pyv="$("$VPY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if [ "$pyv" = "3.11" ]; then
    say "installing torch==2.13.0 (CPU build)"
    "${PIP[@]}" install -q torch==2.13.0
  else
    say "installing torch 2.x for Python $pyv (may be a large CUDA build)"
    "${PIP[@]}" install -q 'torch>=2.1,<3'
  fi
fi
TORCH_VERSION="$("$VPY" -c 'import torch; print(torch.__version__)')"
PYTAG="$("$VPY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"

# ---------------------------------------------------------------- mmcv with ops
"${PIP[@]}" install -q -c "$CONSTRAINTS" numpy ninja "$MMENGINE_DIST" addict yapf packaging pyyaml pillow \
  opencv-python-headless

# NMS and RoIAlign on CPU tensors, and on CUDA tensors when a GPU is visible (prints the reason when they fail).
mmcv_ok() { "$VPY" "$ROOT/tools/mmcv_ops.py" verify; }
# Which ops this machine needs ('cuda' with a CUDA torch and a visible GPU or FORCE_CUDA=1, else 'cpu'); stops here,
# before any build, when they cannot be compiled (GPU but no nvcc, FORCE_CUDA=1 with a CPU torch, nvcc mismatch).
OPS="$("$VPY" "$ROOT/tools/mmcv_ops.py" plan)" || exit 1

if mmcv_ok; then
  say "mmcv $MMCV_VERSION with ops already installed"
else
  if "$VPY" -m pip show mmcv-lite >/dev/null 2>&1; then
    say "mmcv-lite (no compiled ops) found: replacing it with a full mmcv build"
    "${PIP[@]}" uninstall -y -q mmcv-lite
  fi
  if "$VPY" -c "import mmcv" 2>/dev/null; then
    say "installed mmcv lacks compiled ops or is not $MMCV_VERSION: reinstalling"
    "${PIP[@]}" uninstall -y -q "$MMCV_DIST" || true
  fi
  WHEELS="$CACHE/wheels/torch-$TORCH_VERSION-$PYTAG"  # + -cudaops / -cpuops; the bare name is the old layout
  [ "$STACK" = openmmlab ] || WHEELS="$WHEELS-$STACK"
  whl="$("$VPY" "$ROOT/tools/mmcv_ops.py" pick-wheel "$OPS" "$WHEELS-cudaops" "$WHEELS-cpuops" "$WHEELS")"
  if [ -z "$whl" ]; then
    command -v g++ >/dev/null 2>&1 || die "mmcv $MMCV_VERSION must be compiled (no prebuilt wheel for torch $TORCH_VERSION) and no C++ compiler was found; install one (Debian/Ubuntu: apt install build-essential python3-dev)"
    inc="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    [ -f "$inc/Python.h" ] || die "Python headers missing ($inc/Python.h); install python3-dev for your interpreter"
    jobs="${MAX_JOBS:-$(nproc)}"
    STAGE="$WHEELS-building.$$"
    rm -rf "$STAGE"; mkdir -p "$STAGE"
    say "building mmcv $MMCV_VERSION with $OPS ops against torch $TORCH_VERSION ($jobs jobs; ~10 min on 2 cores, cached afterwards in $WHEELS-${OPS}ops)"
    start=$(date +%s)
    ( while sleep 60; do say "  ... still compiling mmcv ($(( ($(date +%s) - start) / 60 )) min)"; done ) &
    ticker=$!
    trap 'kill $ticker 2>/dev/null || true' EXIT
    MMCV_WITH_OPS=1 MAX_JOBS="$jobs" "${PIP[@]}" wheel -q --no-build-isolation --no-deps -w "$STAGE" \
      "$MMCV_DIST==$MMCV_VERSION" || die "$MMCV_DIST build failed (see the compiler output above)"
    kill $ticker 2>/dev/null || true
    built="$(ls "$STAGE"/"${MMCV_DIST//-/_}"-$MMCV_VERSION-*.whl | head -n1)"
    built_ops="$("$VPY" "$ROOT/tools/mmcv_ops.py" wheel-ops "$built")"
    if [ "$OPS" = cuda ] && [ "$built_ops" != cuda ]; then
      die "mmcv was built without CUDA ops although they are needed (check nvcc and CUDA_HOME; build log above)"
    fi
    mkdir -p "$WHEELS-${built_ops}ops"
    whl="$WHEELS-${built_ops}ops/$(basename "$built")"
    mv -f "$built" "$whl" && rm -rf "$STAGE"
    say "built $(basename "$whl") with $built_ops ops in $(( $(date +%s) - start )) s (cached in $(dirname "$whl"))"
  else
    say "reusing cached $(basename "$whl")"
  fi
  "${PIP[@]}" install -q --no-deps "$whl"
  "${PIP[@]}" install -q -c "$CONSTRAINTS" addict "$MMENGINE_DIST" yapf packaging pillow pyyaml
  mmcv_ok || die "mmcv installed but its compiled ops do not work (rebuild: rm -r $(dirname "$whl"))"
fi

# ---------------------------------------------------------------- mmdet, mmseg, mmplugin
say "installing the $STACK stack's mmdet and mmsegmentation, and mmplugin (editable, with test extras)"
if ! PYTHONWARNINGS=ignore "${PIP[@]}" install -q --no-build-isolation -c "$CONSTRAINTS" -e "$ROOT[tests,$STACK]" \
    > "$VENV/.pip-install.log" 2>&1; then
  cat "$VENV/.pip-install.log" >&2
  die "installing mmdet / mmsegmentation / mmplugin failed (full log above)"
fi
# mmdeploy 1.3.1 without its pins (protobuf<=3.20.2, onnx==1.17 clash with onnxruntime; the export path
# in mmplugin.export.mmdeploy needs none of them): tools/export_mmdeploy.py and its parity test
# (the original stack only: mmdeploy 1.3.1 targets it; the fork tier of the suite skips its test)
if [ "$STACK" = openmmlab ]; then
  "${PIP[@]}" install -q --no-deps 'mmdeploy==1.3.1' || \
    say "warning: installing mmdeploy 1.3.1 (--no-deps) failed: tools/export_mmdeploy.py and its test are unavailable"
  # ExecuTorch + XNNPACK (the edge extra's runtime; tests/export/test_edge_export.py), with torch held fixed
  echo "torch==$TORCH_VERSION" > "$VENV/.torch-constraint.txt"
  "${PIP[@]}" install -q -c "$VENV/.torch-constraint.txt" 'executorch==1.5.1' 'torchao==0.18.0' || \
    say "warning: installing executorch 1.5.1 failed: the ExecuTorch export and its tests are unavailable (skipped)"
fi
"$VPY" -c "import mmplugin, mmcv.ops, mmdet, mmseg; print('[setup] ok: mmplugin', mmplugin.__version__, '| mmcv', __import__('mmcv').__version__, '| mmdet', mmdet.__version__, '| mmseg', mmseg.__version__, '| torch', __import__('torch').__version__)"
say "stack: $("$VPY" "$ROOT/mmplugin/utils/stack.py")"
echo "$want_stamp" > "$STAMP"
