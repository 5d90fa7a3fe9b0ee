#!/usr/bin/env bash
# ModelZoo's MobileNetV1 performance run on 1 card: 1 epoch cut at 2002 batches (--max_steps=2000,
# as their script), batch 256, lr 0.1; writes CompileTime; amp O2 with static loss scale 1024 (configs/imagenet.yaml).
#   bash scripts/modelzoo/train_performance_1p.sh --data_path=/imagenet [--batch_size=N --learning_rate=X] [key.sub=value ...]
RankSize=1 Kind=perf Epochs=1 MaxSteps="2000" CompileTime=yes
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
