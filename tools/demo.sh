#!/usr/bin/env bash
# The README's first command: set up .venv, generate the synthetic demo data, train SwiftFormer-XS Mask R-CNN and
# Semantic FPN from scratch on the CPU, evaluate (COCO bbox/segm AP, mIoU) and draw predictions to PNG files.
# DEMO_ITERS=N overrides the detector's 400 iterations; DEMO_SKIP_SEG=1 skips the segmentation part.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup_env.sh
PY="$ROOT/.venv/bin/python"
OUT="${DEMO_OUT:-work_dirs/demo}"
step() { printf '\n=== [demo %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
start=$(date +%s)
mkdir -p "$OUT"
# Errors are "SomethingError:" / "error:" words, not the "-Werror=..." flags of torch's build-settings line.
ERRORS='Traceback|\b[A-Za-z]*Error\b|\berror:'
# run_filtered LOG PATTERN CMD...: run CMD with its full output in LOG, show only the lines matching PATTERN (or an
# error), and stop the demo with CMD's own exit code (not grep's) when it fails.
run_filtered() {
  local log="$1" pattern="$2"; shift 2
  local rc=0
  "$@" 2>&1 | tee "$log" | { grep -E --line-buffered "$pattern|$ERRORS" || true; } || rc=$?  # pipefail: CMD's code
  if [ "$rc" -ne 0 ]; then
    printf '[demo] ERROR: "%s" failed with exit code %s; full log: %s\n' "$*" "$rc" "$log" >&2
    tail -n 20 "$log" >&2
    exit "$rc"
  fi
}

step "1/5 generating synthetic datasets (fixed seed) in data/demo"
"$PY" tools/make_demo_data.py --root data/demo

DET_CFG=configs/demo/swiftformer_xs_maskrcnn_shapes.py
step "2/5 training SwiftFormer-XS Mask R-CNN from scratch (${DEMO_ITERS:-400} iterations, ~7 min on 2 cores)"
extra=()
[ -n "${DEMO_ITERS:-}" ] && extra=(--cfg-options "train_cfg.max_iters=$DEMO_ITERS" "train_cfg.val_interval=$DEMO_ITERS")
run_filtered "$OUT/det_train.log" 'Iter\(train\)|bbox_mAP|segm_mAP' "$PY" tools/train.py "$DET_CFG" --work-dir "$OUT/det" ${extra[@]+"${extra[@]}"}
ckpt="$(cat "$OUT/det/last_checkpoint")"

step "3/5 evaluating the detector on the demo val split (COCO AP)"
run_filtered "$OUT/det_test.log" 'Average Precision|bbox_mAP|segm_mAP' "$PY" tools/test.py "$DET_CFG" "$ckpt" --work-dir "$OUT/det_test"
"$PY" tools/infer.py "$DET_CFG" "$ckpt" data/demo/shapes_coco/val/val_00000.png --out "$OUT/det_result.png"

if [ -z "${DEMO_SKIP_SEG:-}" ]; then
  SEG_CFG=configs/demo/swiftformer_xs_semfpn_shapes.py
  step "4/5 training SwiftFormer-XS Semantic FPN from scratch (400 iterations, ~4 min)"
  run_filtered "$OUT/seg_train.log" 'Iter\(train\)|mIoU' "$PY" tools/train.py "$SEG_CFG" --work-dir "$OUT/seg"
  seg_ckpt="$(cat "$OUT/seg/last_checkpoint")"
  step "5/5 evaluating the segmentor (mIoU) and drawing a prediction"
  run_filtered "$OUT/seg_test.log" 'mIoU|\| +[a-z]+ +\|' "$PY" tools/test.py "$SEG_CFG" "$seg_ckpt" --work-dir "$OUT/seg_test"
  "$PY" tools/infer.py "$SEG_CFG" "$seg_ckpt" data/demo/shapes_ade/images/validation/00000.png --out "$OUT/seg_result.png"
fi
step "done in $(( $(date +%s) - start )) s; pictures: $OUT/det_result.png ${DEMO_SKIP_SEG:+}$OUT/seg_result.png"
