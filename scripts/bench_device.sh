#!/usr/bin/env bash
# One short benchmark for a GPU or NPU machine (a few minutes): the optimizer step alone, then
# standard vs fused training at batch 256 with amp on synthetic data (100 steps each).
#   bash scripts/bench_device.sh [train.sh flags]     AMP=O1 to change the level (default O2)
# Results: $BENCH_OUT (default runs/bench_device)/optimizer.json, report.json, report.png.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
out="${BENCH_OUT:-runs/bench_device}"
mkdir -p "$out"
"$PY" "$ROOT/scripts/bench.py" optimizer --json "$out/optimizer.json"
COMPARE_OUT="$out" bash "$ROOT/scripts/compare_optimizers.sh" --data synthetic --amp "${AMP:-O2}" \
  data.batch_size=256 data.synthetic_size=25600 data.workers=8 train.epochs=1 train.log_every=20 "$@"
