#!/usr/bin/env bash
# The three optimizer implementations, back to back with the same seed, data and settings:
#   loop     optim.impl=standard optim.foreach=false  (the seed article's baseline; torch on cpu/910A)
#   foreach  optim.impl=standard optim.foreach=true   (torch's default on cuda and Ascend A2/A3)
#   fused    optim.impl=fused                         (torch_fused: fused=True; npu_fused on npu)
#   bash scripts/compare_optimizers.sh [train.sh flags]      (default: the bundled demo)
# Each runs twice: for its throughput (no device syncs but the log intervals'), then again for its
# step-time breakdown (train.measure_breakdown=true, which syncs the device around the optimizer's
# phases, so its times are labelled as such). Writes $COMPARE_OUT (default runs/compare)/{loop,
# foreach,fused} and {loop,foreach,fused}-breakdown (TensorBoard: tensorboard --logdir
# runs/compare), report.json and report.png, and prints the table.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
out="${COMPARE_OUT:-runs/compare}"
declare -A settings=([loop]="--optimizer standard optim.foreach=false"
                     [foreach]="--optimizer standard optim.foreach=true" [fused]="--optimizer fused")
for name in loop foreach fused; do
  echo "== $name" >&2
  # shellcheck disable=SC2086  # the settings are words
  bash "$ROOT/train.sh" "$@" ${settings[$name]} --output "$out/$name" --start-over >&2
  echo "== $name, breakdown (device syncs)" >&2
  # shellcheck disable=SC2086
  bash "$ROOT/train.sh" "$@" ${settings[$name]} --output "$out/$name-breakdown" --start-over \
    train.measure_breakdown=true >&2
done
"$PY" "$ROOT/scripts/compare_report.py" "$out"
