#!/usr/bin/env bash
# The prepared device check, for one GPU. Each part has a time limit, and the check goes on past a
# part that fails; a table of the parts' exit codes closes the output.
#   tests     pytest -m cuda: the suite's device paths
#   ceiling   bench.py ceiling, eager: the app against plain loops at batch 64 and 256, O1 bfloat16
#             and O2 float16 (fused), and the plain step graphed at 64
#   loop      bench.py ceiling, eager at O2 float16, batch 64 and 256: fused against the loop
#   trace     10 eager app steps under torch.profiler (fused; b256 O2 float16, b64 O1 bfloat16),
#             read by scripts/trace_report.py: host and device time per phase, syncs, copies, casts
#   compiled  bench.py ceiling, compiled (reduce-overhead) at batch 256, O1 bfloat16
#   data      bench.py data: one worker's decode rate against torchvision's
#   feed      bench.py feed: ImageNet-like JPEGs and their prepared set, by stage and loader workers,
#             and training from them against synthetic images at b256 O2 fused
#   compare   compare_optimizers.sh at b256 O2: loop, foreach, fused (throughput, then breakdown)
#   demo      the README's command: bash train.sh --optimizer=fused
#   bash scripts/bench_device.sh [PART ...]            (default: every part, in this order)
# All parts take about 7 minutes at most: a short lease runs them in two calls (PART names).
# Results in $BENCH_OUT (default runs/bench_device): PART.log and PART.json, trace-b*/ (the runs,
# their profile/ traces) with trace-b*.json, compare/ (report.json, report.png), demo/.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
out="$(mkdir -p "${BENCH_OUT:-runs/bench_device}" && cd "${BENCH_OUT:-runs/bench_device}" && pwd)"
cd "$ROOT"
cores=$("$PY" -c "from mobilenet.data.datasets import usable_cores; print(usable_cores())")
declare -A codes=()

part() {  # part NAME SECONDS COMMAND...: runs it under a time limit into NAME.log, shows its end
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  echo "== $name (at most $limit s)"
  timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
  codes[$name]="exit $? in $((SECONDS - start)) s"
  grep -v "^W[0-9]" "$out/$name.log" | tail -n 30
}

trace() {  # trace BATCH LEVEL DTYPE: 10 profiled eager steps, fused, and their report
  local run="$out/trace-b$1-$2"
  bash train.sh --data synthetic --optimizer fused --amp "$2" amp.dtype="$3" amp.loss_scale=1024 \
    data.batch_size="$1" data.synthetic_size=$((14 * $1)) train.log_every=7 train.profile=true \
    train.compile=false --output "$run" --start-over >"$run.log" 2>&1 || { tail -n 5 "$run.log"; return 1; }
  echo "-- b$1 $2 $3"
  "$PY" scripts/trace_report.py "$run/profile" --json "$run.json"
}
export -f trace
export out PY

run_part() {
  case $1 in
    tests) part tests 60 "$PY" -m pytest -q -m cuda --tb=short -p no:cacheprovider tests ;;
    ceiling) part ceiling 100 "$PY" scripts/bench.py ceiling --steps 30 --rounds 2 --json "$out/ceiling.json" --cases \
        eager/64/O1-bfloat16/torch_fused eager/256/O1-bfloat16/torch_fused \
        eager/64/O2-float16/torch_fused eager/256/O2-float16/torch_fused graphed/64/O1-bfloat16/torch_fused ;;
    loop) part loop 70 "$PY" scripts/bench.py ceiling --steps 30 --rounds 2 --json "$out/loop.json" --cases \
        eager/64/O2-float16/torch_fused eager/64/O2-float16/loop eager/256/O2-float16/torch_fused \
        eager/256/O2-float16/loop ;;
    trace) part trace 60 bash -c "trace 256 O2 float16 && trace 64 O1 bfloat16" ;;
    compiled) part compiled 110 "$PY" scripts/bench.py ceiling --steps 30 --rounds 1 --json "$out/compiled.json" \
        --cases compiled/256/O1-bfloat16/torch_fused ;;
    data) part data 50 "$PY" scripts/bench.py data --rounds 2 --images 1024 --json "$out/data.json" ;;
    feed) part feed 150 "$PY" scripts/bench.py feed --rounds 2 --images 3072 --batch-size 256 --steps 8 \
        amp.level=O2 amp.loss_scale=1024 optim.impl=fused --json "$out/feed.json" ;;
    compare) part compare 75 env COMPARE_OUT="$out/compare" bash scripts/compare_optimizers.sh \
        --data synthetic --amp O2 amp.loss_scale=1024 data.batch_size=256 data.synthetic_size=10240 \
        train.log_every=20 --epochs 1 ;;
    demo) part demo 45 bash train.sh --optimizer=fused --output "$out/demo" --start-over ;;
    *) echo "error: no part '$1' (tests ceiling trace compiled loop data compare demo)" >&2; exit 2 ;;
  esac
}

echo "$("$PY" -c "import torch; print('torch', torch.__version__)"); $cores usable cores; results in $out"
for name in "${@:-tests ceiling trace compiled loop data feed compare demo}"; do
  for each in $name; do run_part "$each"; done
done
echo "| part | result |"
echo "|---|---|"
for name in "${!codes[@]}"; do echo "| $name | ${codes[$name]} |"; done
