#!/usr/bin/env bash
# The README's first command: set up .venv, generate the synthetic demo data, train SwiftFormer-XS Mask R-CNN from
# scratch and a Semantic FPN on its backbone on the CPU, evaluate (COCO bbox/segm AP, mIoU), draw ground truth and predictions side
# by side, plot the loss curves and print a summary table.
#   DEMO_ITERS=N / DEMO_SEG_ITERS=N  override the detector's / segmentor's training iterations (shortened runs)
#   DEMO_SKIP_SEG=1                  skip the segmentation part
#   DEMO_SKIP_SETUP=1                use the existing .venv as is (no tools/setup_env.sh)
#   DEMO_OUT=DIR                     output folder (default work_dirs/demo)
# Any failing step stops the demo with that step's own exit code and the tail of its log.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ -z "${DEMO_SKIP_SETUP:-}" ]; then bash tools/setup_env.sh; fi
PY="$ROOT/.venv/bin/python"
OUT="${DEMO_OUT:-work_dirs/demo}"
DET_CFG=configs/demo/swiftformer_xs_maskrcnn_shapes.py
SEG_CFG=configs/demo/swiftformer_xs_semfpn_shapes_ft.py  # backbone from the detector just trained
mkdir -p "$OUT"
# Seconds per step on the 2-core development machine (README, Quick start); the training steps also print
# mmengine's own ETA.
if [ -z "${DEMO_SKIP_SEG:-}" ]; then
  NAMES=(data det_train det_test det_pictures seg_train seg_test seg_pictures)
  EXPECT=(10 470 20 15 270 15 15)
else
  NAMES=(data det_train det_test det_pictures); EXPECT=(10 470 20 15)
fi
declare -A SECS=()
start=$(date +%s)
n=0
step_start=$start
# step NAME MESSAGE: close the previous step (its wall time), print progress and the ETA of the remaining steps.
step() {
  local now; now=$(date +%s)
  [ "$n" -gt 0 ] && SECS[${NAMES[$((n - 1))]}]=$(( now - step_start ))
  step_start=$now
  local left=0 i
  for (( i = n; i < ${#EXPECT[@]}; i++ )); do left=$(( left + EXPECT[i] )); done
  n=$(( n + 1 ))
  if [ $# -gt 0 ]; then
    printf '\n=== [demo %s] step %d/%d: %s (elapsed %d s, ETA %s, about %d s left)\n' "$(date +%H:%M:%S)" "$n" \
      "${#NAMES[@]}" "$*" "$(( now - start ))" "$(date -d "@$(( now + left ))" +%H:%M:%S 2>/dev/null || echo '?')" "$left"
  fi
}
# Errors are "SomethingError:" / "error:" words, not the "-Werror=..." flags of torch's build-settings line.
ERRORS='Traceback|\b[A-Za-z]*Error\b|\berror:|^warning: the machine is loaded'
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

step "generating synthetic datasets (fixed seed) in data/demo"
run_filtered "$OUT/data.log" 'written' "$PY" tools/make_demo_data.py --root data/demo

step "training SwiftFormer-XS Mask R-CNN from scratch (${DEMO_ITERS:-configured} iterations)"
# no validation inside training (the next step evaluates the same split; this saves its 15 s)
NO_VAL="train_cfg.val_begin=1000000000"
extra=(--cfg-options "$NO_VAL")
# the decay ends with the run when it outlasts the warm-up: cosine after 50 iterations (detector), poly after 20
# (segmentor); shorter runs keep the configured schedule (mmengine needs begin < end)
if [ -n "${DEMO_ITERS:-}" ]; then
  extra+=("train_cfg.max_iters=$DEMO_ITERS" "train_cfg.val_interval=$DEMO_ITERS")
  if [ "$DEMO_ITERS" -gt 50 ]; then
    extra+=("param_scheduler.1.end=$DEMO_ITERS" "param_scheduler.1.T_max=$(( DEMO_ITERS - 50 ))")
  fi
fi
run_filtered "$OUT/det_train.log" 'Iter\(train\)|bbox_mAP|segm_mAP' "$PY" tools/train.py "$DET_CFG" --work-dir "$OUT/det" ${extra[@]+"${extra[@]}"}
ckpt="$(cat "$OUT/det/last_checkpoint")"

step "evaluating the detector on the demo val split (COCO AP)"
run_filtered "$OUT/det_test.log" 'Average Precision|bbox_mAP|segm_mAP' "$PY" tools/test.py "$DET_CFG" "$ckpt" --work-dir "$OUT/det_test"

step "drawing ground truth and detections (score >= 0.5)"
run_filtered "$OUT/det_pictures.log" 'png' "$PY" tools/demo_report.py det-pictures "$DET_CFG" "$ckpt" --out "$OUT/det_result.png"
pictures=(--picture "$OUT/det_result.png")
runs=(--run "Mask R-CNN (detector)=$OUT/det")

if [ -z "${DEMO_SKIP_SEG:-}" ]; then
  step "training SwiftFormer-XS Semantic FPN, backbone from the detector (${DEMO_SEG_ITERS:-configured} iterations)"
  extra=(--cfg-options "$NO_VAL" "model.backbone.init_cfg.checkpoint=$ckpt")
  if [ -n "${DEMO_SEG_ITERS:-}" ]; then
    extra+=("train_cfg.max_iters=$DEMO_SEG_ITERS" "train_cfg.val_interval=$DEMO_SEG_ITERS")
    if [ "$DEMO_SEG_ITERS" -gt 20 ]; then extra+=("param_scheduler.1.end=$DEMO_SEG_ITERS"); fi
  fi
  run_filtered "$OUT/seg_train.log" 'Iter\(train\)|mIoU' "$PY" tools/train.py "$SEG_CFG" --work-dir "$OUT/seg" ${extra[@]+"${extra[@]}"}
  seg_ckpt="$(cat "$OUT/seg/last_checkpoint")"
  step "evaluating the segmentor (mIoU)"
  run_filtered "$OUT/seg_test.log" 'mIoU|\| +[a-z]+ +\|' "$PY" tools/test.py "$SEG_CFG" "$seg_ckpt" --work-dir "$OUT/seg_test"
  step "drawing ground truth and segmentation"
  run_filtered "$OUT/seg_pictures.log" 'png' "$PY" tools/demo_report.py seg-pictures "$SEG_CFG" "$seg_ckpt" --out "$OUT/seg_result.png"
  pictures+=(--picture "$OUT/seg_result.png")
  runs+=(--run "Semantic FPN (segmentor)=$OUT/seg")
fi
step
run_filtered "$OUT/curves.log" 'png' "$PY" tools/demo_report.py curves "${runs[@]}" --out "$OUT/loss_curves.png"
pictures+=(--picture "$OUT/loss_curves.png")
times=()
for k in "${NAMES[@]}"; do if [ -n "${SECS[$k]:-}" ]; then times+=(--time "$k=${SECS[$k]}"); fi; done
total=$(( $(date +%s) - start ))
seg_args=()
if [ -z "${DEMO_SKIP_SEG:-}" ]; then seg_args=(--seg-test "$OUT/seg_test"); fi
printf '\n'
"$PY" tools/demo_report.py summary --det-test "$OUT/det_test" ${seg_args[@]+"${seg_args[@]}"} "${times[@]}" \
  --time "total=$total" "${pictures[@]}" | tee "$OUT/summary.txt"
printf '[demo] done in %d s; summary in %s/summary.txt\n' "$total" "$OUT"
