# Sourced by the four ModelZoo test-script entry points (train_full_1p.sh, ...), which set
# RankSize, Kind (acc|perf), Epochs, MaxSteps (ModelZoo's --max_steps, empty: whole epochs) and
# CompileTime (yes: write the CompileTime line, as their newest 1-card script does). Runs train.sh with
# the flags ModelZoo's scripts give main.py (--arch=mobilenet --batch_size --learning-rate --epochs
# [--max_steps] --apex --apex-opt-level=O2 --loss-scale-value=1024 --print-freq=10 [--device_id]; not
# --workers=128: data.workers auto sizes the loaders to this machine) over configs/imagenet.yaml, into
# output/$ASCEND_DEVICE_ID/ beside these scripts, then writes ModelZoo's performance guard outputs:
# train_$ASCEND_DEVICE_ID.log, train_${CaseName}_loss.txt and ${CaseName}.log.
# Arguments: ModelZoo's --data_path=DIR (required), --batch_size=N (the node's, default 256 a card),
# --learning_rate=X (default 0.1 a card), --device_id=N (the card, 1-card scripts; sets
# ASCEND_DEVICE_ID), then anything train.sh takes (--nproc N or --device_list=0,1,.. change the card
# count; key.sub=value settings and later flags win). Network names the case (default theirs,
# MobileNetV1_ID0094_for_PyTorch).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

Network="${Network:-MobileNetV1_ID0094_for_PyTorch}"
data_path="" batch_size="" learning_rate="" rest=()
while [ $# -gt 0 ]; do
  case "$1" in
    --data_path=*) data_path="${1#*=}" ;;
    --data_path) [ $# -ge 2 ] || { echo "error: --data_path needs a folder" >&2; exit 2; }
                 data_path="$2"; shift ;;
    --batch_size=*) batch_size="${1#*=}" ;;
    --learning_rate=*) learning_rate="${1#*=}" ;;
    --device_id=*) ASCEND_DEVICE_ID="${1#*=}" ;;
    --nproc=*) RankSize="${1#*=}" ;;
    --nproc) [ $# -ge 2 ] || { echo "error: --nproc needs a number" >&2; exit 2; }
             RankSize="$2"; shift ;;
    --device_list=*|--device-list=*)  # train.sh starts a process per listed card
      RankSize=$(( $(tr -cd , <<<"${1#*=}" | wc -c) + 1 )); rest+=("$1") ;;
    *) rest+=("$1") ;;
  esac
  shift
done
[ -n "$data_path" ] || { echo "error: --data_path=DIR is required (an ImageFolder root with train/ and val/, or synthetic)" >&2; exit 2; }

ASCEND_DEVICE_ID="${ASCEND_DEVICE_ID:-0}"
[[ "$ASCEND_DEVICE_ID" =~ ^[0-9]+$ ]] || { echo "error: ASCEND_DEVICE_ID must be a card number, got '$ASCEND_DEVICE_ID'" >&2; exit 2; }
out="$here/output/$ASCEND_DEVICE_ID"
rm -rf "$out" && mkdir -p "$out"  # as ModelZoo's scripts do: each run starts a fresh output folder
log="$out/train_$ASCEND_DEVICE_ID.log"
if [ -n "${ASCEND_HOME_PATH:-}${ASCEND_TOOLKIT_HOME:-}" ] || command -v npu-smi >/dev/null; then
  # what ModelZoo's env_npu.sh sets for throughput on Ascend, so FPS compares with their table
  export TASK_QUEUE_ENABLE="${TASK_QUEUE_ENABLE:-2}" CPU_AFFINITY_CONF="${CPU_AFFINITY_CONF:-2}"
fi

# ModelZoo's defaults are per card: 256 images and lr 0.1 (their 8-card script: 2048 and 0.8)
batch_size="${batch_size:-$(( 256 * RankSize ))}"
learning_rate="${learning_rate:-$(awk "BEGIN {print 0.1 * $RankSize}")}"
modelzoo=(--arch=mobilenet "--batch_size=$batch_size" "--learning-rate=$learning_rate" "--epochs=$Epochs"
          --apex --apex-opt-level=O2 --loss-scale-value=1024 --print-freq=10)
[ -z "$MaxSteps" ] || modelzoo+=("--max_steps=$MaxSteps")
[ "$RankSize" -ne 1 ] || modelzoo+=("--device_id=$ASCEND_DEVICE_ID")  # train.sh: one process on that card

start_time=$(date +%s)
code=0
bash "$root/train.sh" --nproc "$RankSize" --config "$root/configs/imagenet.yaml" --output "$out/run" --start-over \
  "--data=$data_path" "${modelzoo[@]}" "${rest[@]}" >"$log" 2>&1 || code=$?
e2e_time=$(( $(date +%s) - start_time ))
if [ "$code" -ne 0 ]; then
  echo "error: training failed (exit $code); its log: $log" >&2
  tail -n 3 "$log" >&2
  exit "$code"
fi

# ModelZoo's own parsing of the log
FPS=$(grep -a 'img/s' "$log" | awk '{print $9}' | awk 'END {print}')
echo "Final Performance images/sec : $FPS"
if [ "$Kind" = acc ]; then
  train_accuracy=$(grep -a '* Prec@1' "$log" | awk 'END {print}' | awk '{print $3}')
  echo "Final Train Accuracy : ${train_accuracy}"
fi
echo "E2E Training Duration sec : $e2e_time"
if [ "$CompileTime" = yes ]; then  # the first step's seconds (graph compiling on Ascend), from summary.json
  compile_time=$(awk -F': ' '/"first_step_s"/ {sub(/,$/, "", $2); printf "%.3f", $2}' "$out/run/summary.json")
fi

BatchSize=$(awk '/^derived:/ {derived = 1} derived && /^  global_batch:/ {print $2}' "$out/run/config.yaml")
DeviceType=$(uname -m)
CaseName="${Network}_bs${BatchSize}_${RankSize}p_${Kind}"
TrainingTime=$(awk "BEGIN {printf \"%.2f\", $BatchSize * 1000 / $FPS}")
grep -a 'Epoch:' "$log" | awk '{print $14}' >"$out/train_${CaseName}_loss.txt"
ActualLoss=$(awk 'END {print}' "$out/train_${CaseName}_loss.txt")
{
  echo "Network = ${Network}"
  echo "RankSize = ${RankSize}"
  echo "BatchSize = ${BatchSize}"
  echo "DeviceType = ${DeviceType}"
  echo "CaseName = ${CaseName}"
  echo "ActualFPS = ${FPS}"
  echo "TrainingTime = ${TrainingTime}"
  [ "$Kind" != acc ] || echo "TrainAccuracy = ${train_accuracy}"
  echo "ActualLoss = ${ActualLoss}"
  echo "E2ETrainingTime = ${e2e_time}"
  [ "$CompileTime" != yes ] || echo "CompileTime = ${compile_time}"
} >"$out/${CaseName}.log"
