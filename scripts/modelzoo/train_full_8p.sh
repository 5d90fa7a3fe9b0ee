#!/usr/bin/env bash
# ModelZoo's MobileNetV1 full training on 8 card(s): 90 epochs, batch 256 per card, amp O2 with
# static loss scale 1024 (configs/imagenet.yaml).
#   bash scripts/modelzoo/train_full_8p.sh --data_path=/imagenet [key.sub=value ...]
Network="MobileNet" RankSize=8 Kind=acc
recipe=(train.epochs=90)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
