#!/usr/bin/env bash
# Standard vs fused optimizer, back to back with the same seed, data and settings.
#   bash scripts/compare_optimizers.sh [train.sh flags]      (default: the bundled demo)
# Both runs measure their step-time breakdown (train.measure_breakdown=true). Writes
# $COMPARE_OUT (default runs/compare)/{standard,fused} (TensorBoard: tensorboard --logdir runs/compare),
# report.json and report.png, and prints the table.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
out="${COMPARE_OUT:-runs/compare}"
for impl in standard fused; do
  echo "== $impl" >&2
  bash "$ROOT/train.sh" "$@" --optimizer "$impl" --output "$out/$impl" train.measure_breakdown=true >&2
done
"$PY" "$ROOT/scripts/compare_report.py" "$out"
