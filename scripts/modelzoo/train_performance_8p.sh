#!/usr/bin/env bash
# ModelZoo's MobileNetV1 performance run on 8 card(s): the full recipe for 1 epoch, capped at 1000
# steps (train.max_steps), batch 256 per card, amp O2 with static loss scale 1024.
#   bash scripts/modelzoo/train_performance_8p.sh --data_path=/imagenet [key.sub=value ...]
Network="MobileNet" RankSize=8 Kind=perf
recipe=(train.epochs=1 train.max_steps=1000)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
