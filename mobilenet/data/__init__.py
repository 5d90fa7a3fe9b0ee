"""Data: sources.py (what a --data path is), datasets.py, transforms.py (decoding, crops and
augmentation), prepared.py (the prepared set's reader), device_decode.py. Workers give uint8
tensors; the device normalises them (mobilenet.training): host-to-device copies 4x smaller."""
