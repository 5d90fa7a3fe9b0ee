"""Datasets (ImageFolder of files, synthetic images, the digits demo) and their loaders."""
import multiprocessing
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import datasets

from mobilenet.data.decode import EncodedImage, train_transform, val_transform
from mobilenet.data.demo import DIGITS_ROOT, build_digits
from mobilenet.data.samplers import ResumableSampler, ShardSampler
from mobilenet.errors import UsageError


def sample_key(key):
    """Keys are an index (val) or (index, augmentation seed) from ResumableSampler (train)."""
    return key if isinstance(key, tuple) else (key, None)


class ImageFolderRGB(datasets.ImageFolder):
    """ImageFolder whose transform receives each file as an EncodedImage and decodes it to RGB
    (CMYK and grayscale JPEGs, PNGs named .JPEG), seeds the augmentation of each sample from its
    key, and substitutes the next image for an unreadable one with one warning naming it
    (``strict``: a UsageError instead)."""

    def __init__(self, root, transform, strict=False):
        super().__init__(root, transform)
        self.strict = strict
        self.unreadable = multiprocessing.Value("i", 0)  # shared with the loader's workers

    def load(self, index, seed):
        """(transformed image, label), or None when the file cannot be decoded."""
        path, label = self.samples[index]
        try:
            return self.augment(EncodedImage(Path(path).read_bytes()), seed), label
        except (OSError, SyntaxError, ValueError) as e:  # what PIL raises for broken files
            if self.strict:
                raise UsageError(f"{path}: unreadable image ({e}); data.strict=true stops here") from None
            print(f"warning: skipping unreadable image {path} ({e})", file=sys.stderr, flush=True)
            with self.unreadable.get_lock():
                self.unreadable.value += 1
            return None

    def augment(self, image, seed):
        """The transform decodes too; train samples draw their randomness from ``seed``."""
        if seed is None:
            return self.transform(image)
        state = torch.get_rng_state()  # torch.manual_seed would also seed every accelerator
        torch.default_generator.manual_seed(seed)
        try:
            return self.transform(image)
        finally:
            torch.set_rng_state(state)

    def __getitem__(self, key):
        index, seed = sample_key(key)
        for offset in range(len(self)):
            sample = self.load((index + offset) % len(self), seed)
            if sample is not None:
                return sample
        raise UsageError(f"{self.root}: no readable image")


class SyntheticImages(Dataset):
    """Random uint8 images with labels, for throughput runs without a dataset on disk."""

    POOL = 64  # distinct images, cycled

    def __init__(self, size, resolution, num_classes, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (self.POOL, 3, resolution, resolution),
                                    dtype=torch.uint8, generator=generator)
        self.size, self.num_classes = size, num_classes
        self.classes = [str(c) for c in range(num_classes)]

    def __len__(self):
        return self.size

    def __getitem__(self, key):
        index, _ = sample_key(key)
        return self.images[index % self.POOL], index % self.num_classes


def image_folder(root, subset, transform, strict):
    folder = Path(root) / subset
    if not folder.is_dir():
        raise UsageError(f"--data {root}: no '{subset}' folder (expected {root}/{subset}/<class>/*.JPEG)")
    try:
        return ImageFolderRGB(folder, transform, strict)
    except (FileNotFoundError, OSError) as e:
        raise UsageError(f"--data {root}: {subset}: {e}") from None


def build_datasets(data, model):
    """(train, val) datasets for ``data.path``: a folder, 'synthetic' or 'digits'."""
    path, resolution = data["path"], model["resolution"]
    if path is None:
        raise UsageError("no dataset: pass --data /path/to/imagenet, --data synthetic or --data digits")
    if path == "synthetic":
        val_size = max(1, data["synthetic_size"] // 8)
        return (SyntheticImages(data["synthetic_size"], resolution, model["num_classes"]),
                SyntheticImages(val_size, resolution, model["num_classes"], seed=1))
    if path == "digits":
        path = DIGITS_ROOT if DIGITS_ROOT.is_dir() else build_digits()
    train = image_folder(path, "train", train_transform(resolution, data["min_scale"], data["hflip"]),
                         data["strict"])
    val = image_folder(path, "val", val_transform(resolution, data["val_resize_ratio"]), data["strict"])
    if train.classes != val.classes:
        raise UsageError(f"--data {path}: train has {len(train.classes)} classes, val has "
                         f"{len(val.classes)}, or their names differ")
    if len(train.classes) != model["num_classes"]:
        raise UsageError(f"--data {path}: {len(train.classes)} classes, but "
                         f"model.num_classes={model['num_classes']}")
    return train, val


def build_loaders(train_set, val_set, data, seed, rank=0, world=1, pin_memory=False):
    """Train: a seeded, resumable shuffle per epoch, full batches. Val: this process's exact share."""
    common = {"num_workers": data["workers"], "pin_memory": pin_memory,
              "persistent_workers": data["workers"] > 0}
    sampler = ResumableSampler(len(train_set), rank, world, seed)
    train = DataLoader(train_set, batch_size=data["batch_size"], sampler=sampler, drop_last=True,
                       **common)
    val = DataLoader(val_set, batch_size=data["val_batch_size"],
                     sampler=ShardSampler(len(val_set), rank, world), **common)
    if len(train) == 0:
        raise UsageError(f"data.batch_size={data['batch_size']} is larger than the "
                         f"{len(sampler)} training images per process")
    return train, val
