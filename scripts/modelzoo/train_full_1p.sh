#!/usr/bin/env bash
# ModelZoo's MobileNetV1 full training on 1 card: 90 epochs, batch 256, lr 0.1; amp O2 with static loss scale 1024 (configs/imagenet.yaml).
#   bash scripts/modelzoo/train_full_1p.sh --data_path=/imagenet [--batch_size=N --learning_rate=X] [key.sub=value ...]
RankSize=1 Kind=acc Epochs=90 MaxSteps="" CompileTime=no
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
