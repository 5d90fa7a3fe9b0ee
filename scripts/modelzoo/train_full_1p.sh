#!/usr/bin/env bash
# ModelZoo's MobileNetV1 full training on 1 card(s): 90 epochs, batch 256 per card, amp O2 with
# static loss scale 1024 (configs/imagenet.yaml).
#   bash scripts/modelzoo/train_full_1p.sh --data_path=/imagenet [key.sub=value ...]
Network="MobileNet" RankSize=1 Kind=acc
recipe=(train.epochs=90)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
