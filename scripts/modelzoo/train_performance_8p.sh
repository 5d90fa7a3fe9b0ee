#!/usr/bin/env bash
# ModelZoo's MobileNetV1 performance run on 8 cards: the whole of 1 epoch, batch 2048 (256 a card),
# lr 0.8; amp O2 with static loss scale 1024 (configs/imagenet.yaml).
#   bash scripts/modelzoo/train_performance_8p.sh --data_path=/imagenet [--batch_size=N --learning_rate=X] [key.sub=value ...]
RankSize=8 Kind=perf Epochs=1 MaxSteps="" CompileTime=no
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
