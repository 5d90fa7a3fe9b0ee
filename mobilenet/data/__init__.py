"""Data: the sources (sources.py: what a --data path is, the demo set, the crops a config asks
for), datasets, samplers and loaders (datasets.py), decoding and crops in the loader's workers
(transforms.py), the augmentation policies and the batch's MixUp/CutMix (augment.py), the prepared
set (prepared.py writes and reads it) and decoding on the device (device_decode.py).

Workers decode and augment to uint8 tensors; conversion to float, normalisation, the memory format
and a batch's mix happen on the device (mobilenet.training), so host-to-device copies are 4x smaller.
"""
