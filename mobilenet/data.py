"""Datasets (ImageFolder, synthetic, the bundled digits demo), loaders and device prefetch.

Workers decode and augment to uint8 tensors; conversion to float, normalisation and the memory
format happen on the device, so host-to-device copies are 4x smaller.
"""
import functools
import io
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy
import simplejpeg
import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from PIL import Image
from torchvision import datasets, transforms
from torchvision.transforms import v2

from mobilenet.config import UsageError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DIGITS_ROOT = Path(__file__).resolve().parent.parent / "data" / "digits"


def build_digits(root=DIGITS_ROOT, size=32, val_fraction=0.2, seed=0):
    """Writes scikit-learn's 1,797 handwritten digits (real scans, 8x8) as an ImageFolder of JPEGs.

    Stratified train/val split; built in a temporary folder and renamed, so it is never partial.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images * (255 / 16)).round().astype("uint8")
    split = train_test_split(range(len(images)), test_size=val_fraction, random_state=seed,
                             stratify=digits.target)
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=".digits-"))
    for subset, indices in zip(("train", "val"), split):
        for i in indices:
            folder = tmp / subset / str(digits.target[i])
            folder.mkdir(parents=True, exist_ok=True)
            image = Image.fromarray(images[i]).resize((size, size), Image.BILINEAR).convert("RGB")
            image.save(folder / f"{i:04d}.jpg", quality=95)
    try:
        os.rename(tmp, root)
    except OSError:  # built meanwhile by another process
        shutil.rmtree(tmp)
    return root


class EncodedImage:
    """An image file's bytes and size, decoded on demand to a uint8 CHW RGB tensor.

    YCbCr and grayscale JPEGs (baseline or progressive) go through libjpeg-turbo (simplejpeg), which
    decodes at 1/2, 1/4 or 1/8 scale almost proportionally faster; anything else (CMYK JPEGs, PNGs
    named .JPEG) through PIL, with its draft mode where the file allows."""

    def __init__(self, data):
        self.data = data
        try:
            self.height, self.width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
            self.turbo = colorspace in ("YCbCr", "Gray")
        except ValueError:  # not a JPEG libjpeg-turbo reads
            self.turbo = False
            with Image.open(io.BytesIO(data)) as image:
                self.width, self.height = image.size

    def decode(self, reduce=1):
        """Decoded at about 1/reduce of full size (1, 2, 4 or 8; other factors decode slower)."""
        height, width = math.ceil(self.height / reduce), math.ceil(self.width / reduce)
        if self.turbo:
            pixels = simplejpeg.decode_jpeg(self.data, "RGB", min_height=height, min_width=width)
        else:
            with Image.open(io.BytesIO(self.data)) as image:
                image.draft("RGB", (width, height))
                pixels = numpy.array(image.convert("RGB"))
        return torch.from_numpy(pixels).permute(2, 0, 1)

    def shape_only(self):
        """What torchvision's get_params reads (the shape), without decoding."""
        return torch.empty(()).expand(3, self.height, self.width)


def largest_reduction(height, width, keep):
    """The largest of 1, 2, 4, 8 that keeps a height x width region at least ``keep`` pixels high/wide."""
    reduce = 1
    while reduce < 8 and min(height, width) >= 2 * reduce * keep:
        reduce *= 2
    return reduce


class DecodeRandomResizedCrop(transforms.RandomResizedCrop):
    """RandomResizedCrop of an EncodedImage: the crop is drawn from the header's size (same
    distribution as torchvision's), the file is decoded at the smallest scale that keeps the crop's
    full output resolution, and crop + resize is torch's antialiased bilinear on uint8."""

    def forward(self, image):
        top, left, height, width = self.get_params(image.shape_only(), self.scale, self.ratio)
        pixels = image.decode(largest_reduction(height, width, max(self.size)))
        sy, sx = pixels.shape[1] / image.height, pixels.shape[2] / image.width
        return v2.functional.resized_crop(pixels, round(top * sy), round(left * sx), round(height * sy),
                                          round(width * sx), list(self.size), antialias=True)


class DecodeForResize(torch.nn.Module):
    """Decodes an EncodedImage at the smallest scale whose shorter side still covers ``side``."""

    def __init__(self, side):
        super().__init__()
        self.side = side

    def forward(self, image):
        return image.decode(largest_reduction(image.height, image.width, self.side))


def train_transform(resolution, min_scale, hflip):
    steps = [DecodeRandomResizedCrop(resolution, scale=(min_scale, 1.0))]
    if hflip:
        steps.append(v2.RandomHorizontalFlip())
    return v2.Compose(steps)


def val_transform(resolution, resize_ratio):
    """The standard protocol: resize the shorter side to resolution / resize_ratio, centre crop."""
    side = round(resolution / resize_ratio)
    return v2.Compose([DecodeForResize(side), v2.Resize(side, antialias=True), v2.CenterCrop(resolution)])


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


class ResumableSampler(Sampler):
    """DistributedSampler's seeded per-epoch shuffle and shard (drop_last), which can start
    mid-epoch, and yields (index, seed): each sample's augmentation depends only on the seed, the
    epoch and its index, so a resumed run sees exactly the images an uninterrupted one would."""

    def __init__(self, length, rank=0, world=1, seed=0):
        self.length, self.rank, self.world, self.seed = length, rank, world, seed
        self.per_rank = length // world
        self.epoch = self.start = 0

    def set_epoch(self, epoch, start=0):
        """``start``: samples of this process's share already trained in this epoch."""
        self.epoch, self.start = epoch, start

    def __iter__(self):
        order = torch.randperm(self.length, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        mine = order[:self.per_rank * self.world][self.rank::self.world].tolist()
        base = (self.seed * 1_000_003 + self.epoch) * self.length
        return ((index, base + index) for index in mine[self.start:])

    def __len__(self):
        return self.per_rank - self.start


class ShardSampler(Sampler):
    """Every ``world``-th index from ``rank``: each val image is seen exactly once, no padding."""

    def __init__(self, length, rank, world):
        self.indices = range(rank, length, world)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


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


@functools.lru_cache(maxsize=None)
def copy_stream(device):
    """One side stream per device for the whole run: a prefetcher is made per epoch, and torch_npu
    documents leaked memory when streams are created over and over."""
    return getattr(torch, device.type).Stream(device)


class DevicePrefetcher:
    """Iterates a loader of uint8 batches, copying the next batch to the device and normalising it
    there (float, (x/255 - mean)/std, optional channels_last) while the current one trains: on a
    side stream on cuda and npu, so that the copy overlaps the compute; in order on cpu."""

    def __init__(self, loader, device, channels_last=False, dtype=torch.float32):
        self.loader, self.device = loader, device
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.dtype = dtype
        self.mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255
        # torch.cuda and torch.npu (torch_npu) share the stream API used here
        self.streams = getattr(torch, device.type) if device.type in ("cuda", "npu") else None
        self.side_stream = copy_stream(device) if self.streams else None

    def __len__(self):
        return len(self.loader)

    def _to_device(self, batch):
        images, labels = batch
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        images = ((images.float() - self.mean) / self.std).to(self.dtype)
        return images.contiguous(memory_format=self.memory_format), labels

    def _start(self, batch):
        """Queues ``batch``'s copy and normalisation (on the side stream where there is one)."""
        if batch is None:
            return None
        if self.side_stream is None:
            return self._to_device(batch)
        with self.streams.stream(self.side_stream):
            return self._to_device(batch)

    def _ready(self, batch):
        """Makes the compute stream wait for what the side stream has queued so far (this batch)
        and keeps the batch's memory from reuse until the compute stream is done with it."""
        if self.side_stream is not None:
            compute = self.streams.current_stream(self.device)
            compute.wait_stream(self.side_stream)
            for tensor in batch:
                tensor.record_stream(compute)
        return batch

    def __iter__(self):
        if self.side_stream is not None:  # mean and std were made on the compute stream
            self.side_stream.wait_stream(self.streams.current_stream(self.device))
        iterator = iter(self.loader)
        upcoming = self._start(next(iterator, None))
        while upcoming is not None:
            current = self._ready(upcoming)  # before the next batch is queued behind it
            upcoming = self._start(next(iterator, None))
            yield current
