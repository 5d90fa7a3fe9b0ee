"""Data: the sources (sources.py: what a --data path is, the demo set), datasets, samplers and
loaders (datasets.py), decoding and crops in the loader's workers (transforms.py), the prepared set
(prepared.py writes and reads it) and decoding on the device (device_decode.py).

Workers decode and augment to uint8 tensors; conversion to float, normalisation and the memory
format happen on the device (mobilenet.training's DevicePrefetcher), so host-to-device copies are
4x smaller.
"""
