#!/usr/bin/env bash
# What srun runs on each node of a Slurm job (scripts/slurm/train.sbatch): one torchrun agent with
# NPROC_PER_NODE (else SLURM_GPUS_ON_NODE, else 1) processes, meeting the other nodes' agents at
# the job's first node (torchrun's c10d rendezvous, port MASTER_PORT or 29500), resuming from the
# run's newest checkpoint when there is one. Arguments go to train.sh.
set -euo pipefail
: "${SLURM_JOB_ID:?not in a Slurm job: submit scripts/slurm/train.sbatch with sbatch}"
nproc="${NPROC_PER_NODE:-${SLURM_GPUS_ON_NODE:-1}}"
master="${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}"
exec bash "$(dirname "${BASH_SOURCE[0]}")/../../train.sh" --nproc "$nproc" --nnodes "$SLURM_NNODES" \
  --node-rank "$SLURM_NODEID" --master-addr "$master" --master-port "${MASTER_PORT:-29500}" \
  --rdzv-id "slurm-$SLURM_JOB_ID" --resume auto "$@"
