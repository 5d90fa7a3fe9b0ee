"""Data: sources.py (what a --data path is), datasets.py, transforms.py (decoding and crops in the
workers), augment.py, prepared.py (the prepared set's reader), device_decode.py. Workers give uint8
tensors; the device normalises them (mobilenet.training): host-to-device copies 4x smaller."""
