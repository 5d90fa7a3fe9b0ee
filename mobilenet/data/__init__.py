"""Data: decoding (decode), datasets and loaders (datasets), samplers, device prefetch, the demo set.

Workers decode and augment to uint8 tensors; conversion to float, normalisation and the memory
format happen on the device, so host-to-device copies are 4x smaller.
"""
from mobilenet.data.datasets import ImageFolderRGB, SyntheticImages, build_loaders, image_folder
from mobilenet.data.crops import TrainCrop, ValCrop, train_transform, val_transform
from mobilenet.data.decode import EncodedImage, largest_reduction
from mobilenet.data.demo import DIGITS_ROOT, build_digits
from mobilenet.data.prefetch import IMAGENET_MEAN, IMAGENET_STD, DevicePrefetcher
from mobilenet.data.samplers import ResumableSampler, ShardSampler
from mobilenet.data.sources import SOURCES, build_datasets, source_of

__all__ = ["DIGITS_ROOT", "IMAGENET_MEAN", "IMAGENET_STD", "DevicePrefetcher", "EncodedImage",
           "ImageFolderRGB", "ResumableSampler", "SOURCES", "ShardSampler", "SyntheticImages", "TrainCrop",
           "ValCrop", "build_datasets", "build_digits", "build_loaders", "image_folder",
           "largest_reduction", "source_of", "train_transform", "val_transform"]
