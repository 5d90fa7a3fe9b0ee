#!/usr/bin/env bash
# The three optimizer implementations, back to back with the same seed, data and settings
# (mobilenet.optim.SETTINGS): loop (the seed article's baseline; torch on cpu/910A), foreach
# (torch's default on cuda and Ascend A2/A3), fused (torch's fused=True; NpuFused* on npu).
#   bash scripts/compare_optimizers.sh [train.sh flags]      (default: the bundled demo)
# Each runs twice: for its throughput (no device syncs but the log intervals'), then again for its
# step-time breakdown (train.measure_breakdown=true, which syncs the device around the optimizer's
# phases, so its times are labelled as such). Writes $COMPARE_OUT (default runs/compare)/{loop,
# foreach,fused} and {loop,foreach,fused}-breakdown (TensorBoard: tensorboard --logdir
# runs/compare), report.json and report.png, and prints the table.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
out="${COMPARE_OUT:-runs/compare}"
# each implementation's settings, from their one source (mobilenet.optim.SETTINGS); torch_fused is
# the run named fused (optim.impl=fused: npu_fused on npu)
mapfile -t runs < <("$PY" -c 'from mobilenet.optim import SETTINGS
for name, settings in SETTINGS.items(): print(name.replace("torch_fused", "fused"), *settings)')
for run in "${runs[@]}"; do
  read -r name settings <<<"$run"
  echo "== $name" >&2
  # shellcheck disable=SC2086  # the settings are words
  bash "$ROOT/train.sh" "$@" $settings --output "$out/$name" --start-over >&2
  echo "== $name, breakdown (device syncs)" >&2
  # shellcheck disable=SC2086
  bash "$ROOT/train.sh" "$@" $settings --output "$out/$name-breakdown" --start-over \
    train.measure_breakdown=true >&2
done
"$PY" "$ROOT/scripts/compare_report.py" "$out"
