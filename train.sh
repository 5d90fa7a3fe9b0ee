#!/usr/bin/env bash
# Launches training. Single card:   bash train.sh --optimizer=fused [train.py flags]
# Several cards on this node:       bash train.sh --nproc 8 --optimizer=fused --data /imagenet
# Several nodes (run on each node): bash train.sh --nproc 8 --nnodes 2 --node-rank R \
#                                       --master-addr HOST --master-port 29500 [...]
# Every other flag (--optimizer, --device, --data, --config, key.sub=value, ...) goes to train.py.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/scripts/env.sh"

nproc=1 nnodes=1 node_rank=0 master_addr=127.0.0.1 master_port=29500
forward=()
while [ $# -gt 0 ]; do
  flag="$1"
  case "$flag" in
    --nproc|--nnodes|--node-rank|--master-addr|--master-port)
      [ $# -ge 2 ] || { echo "error: $flag needs a value" >&2; exit 2; }
      value="$2"; shift ;;
    --nproc=*|--nnodes=*|--node-rank=*|--master-addr=*|--master-port=*)
      value="${flag#*=}"; flag="${flag%%=*}" ;;
    *) forward+=("$flag"); shift; continue ;;
  esac
  case "$flag" in
    --nproc) nproc="$value" ;;
    --nnodes) nnodes="$value" ;;
    --node-rank) node_rank="$value" ;;
    --master-addr) master_addr="$value" ;;
    --master-port) master_port="$value" ;;
  esac
  shift
done
for n in "$nproc" "$nnodes" "$node_rank" "$master_port"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "error: launcher flags need whole numbers, got '$n'" >&2; exit 2; }
done

if [ "$nproc" -eq 1 ] && [ "$nnodes" -eq 1 ]; then
  exec "$PY" "$ROOT/train.py" "${forward[@]}"
fi
if [ "$nnodes" -eq 1 ]; then
  rendezvous=(--standalone)
else
  rendezvous=(--nnodes "$nnodes" --node_rank "$node_rank" --master_addr "$master_addr"
              --master_port "$master_port")
fi
exec "$PY" -m torch.distributed.run --nproc_per_node "$nproc" "${rendezvous[@]}" \
  "$ROOT/train.py" "${forward[@]}"
