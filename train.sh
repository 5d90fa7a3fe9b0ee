#!/usr/bin/env bash
# Launches training. Single card:   bash train.sh --optimizer=fused [train.py flags]
# Several cards on this node:       bash train.sh --nproc 8 --optimizer=fused --data /imagenet
# Several nodes (run on each node): bash train.sh --nproc 8 --nnodes 2 --node-rank R \
#                                       --master-addr HOST --master-port 29500 [...]
#                                   (--join-timeout S: how long the nodes wait for each other, 600)
# Restart after a failure:          --max-restarts N (torchrun's own; every rank resumes from rank 0's
#                                   newest checkpoint; see train.checkpoint_every_minutes)
# Elastic, MIN to MAX nodes:        --nnodes MIN:MAX --max-restarts N (a node lost or come back is a
#                                   restart; the run keeps its global batch, accumulating forwards;
#                                   --last-call S: once MIN nodes met, how long they wait for more, 30)
# Every other flag (--optimizer, --device, --data, --config, key.sub=value, ...) goes to train.py.
# The launcher flags of ModelZoo's and pytorch/examples' main.py that mean one thing on one node:
#   --addr HOST                     = --master-addr HOST
#   --device-list|--device_list L   = one process per card of the list L (0,1,...), those cards only
#   --device_id|--device-id|--gpu N = one process on card N
# (the others, --world-size, --rank, --dist-url, ..., train.py refuses, naming the flag to use).
set -euo pipefail

nproc="" nnodes=1 node_rank=0 master_addr="" master_port=29500 max_restarts=0 rdzv_id=mobilenet
join_timeout=600 last_call=30
cards="" cards_flag=""
forward=()
fail() { echo "error: $1" >&2; exit 2; }
while [ $# -gt 0 ]; do
  flag="$1"
  case "$flag" in
    --nproc|--nnodes|--node-rank|--master-addr|--master-port|--max-restarts|--rdzv-id|--join-timeout|--last-call|--addr|\
    --device-list|--device_list|--device_id|--device-id|--gpu)
      [ $# -ge 2 ] || fail "$flag needs a value"
      value="$2"; shift ;;
    --nproc=*|--nnodes=*|--node-rank=*|--master-addr=*|--master-port=*|--max-restarts=*|--rdzv-id=*|--join-timeout=*|--last-call=*|\
    --addr=*|--device-list=*|--device_list=*|--device_id=*|--device-id=*|--gpu=*)
      value="${flag#*=}"; flag="${flag%%=*}" ;;
    *) forward+=("$flag"); shift; continue ;;
  esac
  case "$flag" in
    --nproc) nproc="$value" ;;
    --nnodes) nnodes="$value" ;;
    --node-rank) node_rank="$value" ;;
    --master-addr|--addr)
      [ -z "$master_addr" ] || [ "$master_addr" = "$value" ] \
        || fail "--master-addr/--addr given twice ($master_addr, $value); give one"
      master_addr="$value" ;;
    --master-port) master_port="$value" ;;
    --max-restarts) max_restarts="$value" ;;
    --rdzv-id) rdzv_id="$value" ;;
    --join-timeout) join_timeout="$value" ;;
    --last-call) last_call="$value" ;;
    --device-list|--device_list|--device_id|--device-id|--gpu)
      [ -z "$cards_flag" ] || fail "$cards_flag and $flag both choose the cards; give one"
      [[ "$value" =~ ^[0-9]+(,[0-9]+)*$ ]] || fail "$flag needs card numbers like 0 or 0,1,2,3, got '$value'"
      [[ "$flag" = --device?list ]] || [[ "$value" != *,* ]] || fail "$flag takes one card; use --device-list $value"
      cards="$value" cards_flag="$flag" ;;
  esac
  shift
done

whole() { [[ "$2" =~ ^[0-9]+$ ]] || fail "$1 needs a whole number, got '$2'"; }
if [ -n "$cards" ]; then
  count=$(( $(tr -cd , <<<"$cards" | wc -c) + 1 ))
  [ -z "$nproc" ] || [ "$nproc" = "$count" ] \
    || fail "--nproc $nproc and $cards_flag $cards ($count cards) contradict each other; give one"
  nproc="$count"
  # the listed cards only, numbered from 0 in the order given (each process takes its local rank's)
  export ASCEND_RT_VISIBLE_DEVICES="$cards" CUDA_VISIBLE_DEVICES="$cards"
fi
nproc="${nproc:-1}" master_addr="${master_addr:-127.0.0.1}"
if [[ "$nnodes" =~ ^([0-9]+):([0-9]+)$ ]]; then  # torchrun's elastic range: the job goes on with MIN to MAX nodes
  min_nodes="${BASH_REMATCH[1]}" max_nodes="${BASH_REMATCH[2]}"
  [ "$min_nodes" -ge 1 ] && [ "$min_nodes" -le "$max_nodes" ] \
    || fail "--nnodes $nnodes: give MIN:MAX with 1 <= MIN <= MAX"
else
  whole --nnodes "$nnodes"
  min_nodes="$nnodes" max_nodes="$nnodes"
fi
whole --nproc "$nproc"; whole --node-rank "$node_rank"
whole --master-port "$master_port"; whole --max-restarts "$max_restarts"; whole --join-timeout "$join_timeout"
whole --last-call "$last_call"
[ "$join_timeout" -ge 1 ] || fail "--join-timeout must be at least 1 (seconds), got $join_timeout"
[ "$nproc" -ge 1 ] || fail "--nproc must be at least 1 (processes on this node, one per card), got $nproc"
[ "$max_nodes" -ge 1 ] || fail "--nnodes must be at least 1, got $nnodes"
[ "$node_rank" -lt "$max_nodes" ] || fail "--node-rank must be below --nnodes ($nnodes), got $node_rank"
[ "$master_port" -ge 1 ] && [ "$master_port" -le 65535 ] || fail "--master-port must be in 1..65535, got $master_port"
[ -n "$master_addr" ] || fail "--master-addr needs a host name or address"

source "$(dirname "${BASH_SOURCE[0]}")/scripts/env.sh"

if [ "$nproc" -eq 1 ] && [ "$max_nodes" -eq 1 ] && [ "$max_restarts" -eq 0 ]; then
  exec "$PY" "$ROOT/train.py" "${forward[@]}"
fi
if [ "$max_nodes" -eq 1 ]; then
  rendezvous=(--standalone)
else  # torchrun's c10d rendezvous; the host at --master-addr serves it (node ranks follow from it)
  rendezvous=(--nnodes "$nnodes" --node-rank "$node_rank" --rdzv-backend c10d
              --rdzv-endpoint "$master_addr:$master_port" --rdzv-id "$rdzv_id"
              --rdzv-conf "join_timeout=$join_timeout,last_call_timeout=$last_call")
fi
if [ "$max_restarts" -gt 0 ]; then
  # a restarted round must not read the previous round's store keys (pytorch/pytorch#135712):
  # each round's rank 0 hosts a fresh store instead of sharing torchrun's
  export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
fi
# torchrun's launcher in a process of ours: the config is checked once first, a failure's line comes last
exec "$PY" -m mobilenet.launch --nproc-per-node "$nproc" --max-restarts "$max_restarts" \
  "${rendezvous[@]}" "$ROOT/train.py" "${forward[@]}"
