"""What is done to a decoded image (uint8 CHW RGB): the crops (TrainCrop, ValCrop), and augmentation,
the fifth table: a training image's policy after its crop (POLICIES, transforms.v2's), random
erasing, as torchvision's references apply them. Each draw comes from torch's generator, forked
and seeded from the sample's seed: a resumed or re-split run draws what the straight run draws."""
import contextlib
import math
import random
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from mobilenet.tables import Setting, row_settings

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def largest_reduction(height, width, keep):
    """The largest of 1, 2, 4, 8 that keeps a height x width region at least ``keep`` pixels high/wide."""
    reduce = 1
    while reduce < 8 and min(height, width) >= 2 * reduce * keep:
        reduce *= 2
    return reduce


def resize(pixels, height, width, mode="bilinear"):
    """uint8 CHW -> height x width, antialiased bilinear or bicubic, or nearest (torch's uint8
    kernels, as torchvision's v2 resize uses them, without its per-call dispatch)."""
    if mode == "nearest":
        return F.interpolate(pixels[None], size=(height, width), mode="nearest")[0]
    return F.interpolate(pixels[None], size=(height, width), mode=mode, antialias=True, align_corners=False)[0]


class TrainCrop:
    """RandomResizedCrop and flip of an EncodedImage from the sample's seed, decoded at the smallest
    scale that keeps the crop's resolution. Its draws are RandomResizedCrop.get_params', from a
    random.Random: torchvision's tensor draws cost ~150 us an image and the global generator."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=True, mode="bilinear"):
        self.size, self.scale, self.ratio, self.hflip, self.mode = size, scale, ratio, hflip, mode
        self.log_ratio = (math.log(ratio[0]), math.log(ratio[1]))

    def params(self, height, width, rng):
        """(top, left, crop height, crop width), as torchvision's get_params draws them."""
        area = height * width
        for _ in range(10):
            target_area = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*self.log_ratio))
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                return rng.randint(0, height - h), rng.randint(0, width - w), h, w
        in_ratio = width / height  # fallback: the central crop of the nearest allowed ratio
        if in_ratio < min(self.ratio):
            w, h = width, int(round(width / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h, w = height, int(round(height * max(self.ratio)))
        else:
            h, w = height, width
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image, seed):
        rng = random.Random(seed)
        top, left, height, width = self.params(image.height, image.width, rng)
        pixels = image.decode(largest_reduction(height, width, self.size))
        sy, sx = pixels.shape[1] / image.height, pixels.shape[2] / image.width
        top, left = round(top * sy), round(left * sx)
        crop = pixels[:, top:top + round(height * sy), left:left + round(width * sx)]
        out = resize(crop, self.size, self.size, self.mode)
        return out.flip(-1) if self.hflip and rng.random() < 0.5 else out


class ValCrop:
    """The standard protocol: resize the shorter side to resolution / resize_ratio (decoding at the
    smallest scale that still covers it), centre crop, as torchvision's Resize + CenterCrop do."""

    def __init__(self, size, resize_ratio, mode="bilinear"):
        self.size, self.side, self.mode = size, round(size / resize_ratio), mode

    def __call__(self, image, seed=None):
        pixels = image.decode(largest_reduction(image.height, image.width, self.side))
        return self.centre(resize(pixels, *self.resized(*pixels.shape[1:]), self.mode))

    def resized(self, height, width):
        """The size an image of ``height`` x ``width`` is resized to: its shorter side ``side``."""
        if height <= width:
            return self.side, int(self.side * width / height)
        return int(self.side * height / width), self.side

    def centre(self, pixels):
        """The centre ``size`` x ``size`` of resized CHW ``pixels``."""
        top = int(round((pixels.shape[1] - self.size) / 2.0))
        left = int(round((pixels.shape[2] - self.size) / 2.0))
        return pixels[:, top:top + self.size, left:left + self.size]


@dataclass(frozen=True)
class Policy:
    """``build(v2, interpolation, augment)``: the transforms.v2 policy of a uint8 CHW image (None:
    none), ``augment`` the config's section; ``settings``: the augment.* settings it takes."""
    build: Callable
    settings: dict


# The policies (augment.policy), named as the references' --auto-augment names them; a row is a
# few lines: its transforms.v2 class and the settings it takes.
POLICIES = {
    "none": Policy(lambda v2, interpolation, a: None, {}),
    **{name: Policy(lambda v2, interpolation, a, name=name: v2.AutoAugment(v2.AutoAugmentPolicy(name), interpolation),
                    {}) for name in ("imagenet", "cifar10", "svhn")},
    "ra": Policy(lambda v2, interpolation, a: v2.RandAugment(magnitude=a["ra_magnitude"], interpolation=interpolation),
                 {"ra_magnitude": Setting(9, "[0, 30]")}),  # RandAugment's 31 magnitude bins
    "ta_wide": Policy(lambda v2, interpolation, a: v2.TrivialAugmentWide(interpolation=interpolation), {}),
    "augmix": Policy(lambda v2, interpolation, a: v2.AugMix(severity=a["augmix_severity"], interpolation=interpolation),
                     {"augmix_severity": Setting(3, "[1, 10]")}),
}
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")  # data.interpolation: the crops' and the policy's
# The references erase after normalising, with 0: the mean pixel, which on uint8 is this one.
ERASED = [round(255 * mean) for mean in IMAGENET_MEAN]


def policy_settings():
    """{name: Setting} of every policy's own settings: the augment.* schema they add to config."""
    return row_settings("augment.POLICIES", {name: row.settings for name, row in POLICIES.items()})


def per_sample(cfg):
    """What of ``cfg`` transforms each image in the workers beyond the crop and flip, or ''."""
    augment, data = cfg["augment"], cfg["data"]
    given = [f"augment.policy={augment['policy']}" if augment["policy"] != "none" else "",
             f"augment.random_erase={augment['random_erase']:g}" if augment["random_erase"] else "",
             f"data.interpolation={data['interpolation']}" if data["interpolation"] != "bilinear" else ""]
    return ", ".join(item for item in given if item)


class SampleAugment:
    """The crop (a TrainCrop), then the policy and random erasing, drawn from the sample's seed."""

    def __init__(self, crop, augment, interpolation):
        from torchvision.transforms import v2
        mode = v2.InterpolationMode(interpolation)
        policy = POLICIES[augment["policy"]].build(v2, mode, augment)
        erase = v2.RandomErasing(augment["random_erase"], value=ERASED) if augment["random_erase"] else None
        self.crop, self.transforms = crop, [t for t in (policy, erase) if t is not None]

    def __call__(self, image, seed):
        pixels = self.crop(image, seed)
        with drawn_from(seed):
            for transform in self.transforms:
                pixels = transform(pixels)
        return pixels


@contextlib.contextmanager
def drawn_from(seed):
    """torch's (cpu) generator seeded with ``seed`` inside, and as it was after: no other draw moves."""
    with torch.random.fork_rng(devices=()):
        torch.manual_seed(seed % 2**64)
        yield


def crops(data, model, augment):
    """(train, val) transforms: the train crop, then the augment section's policy and erasing."""
    train_side = model["resolution"] if data["train_resolution"] == "auto" else data["train_resolution"]
    train = TrainCrop(train_side, scale=(data["min_scale"], 1.0), hflip=data["hflip"], mode=data["interpolation"])
    if augment["policy"] != "none" or augment["random_erase"]:
        train = SampleAugment(train, augment, data["interpolation"])
    return train, ValCrop(model["resolution"], data["val_resize_ratio"], data["interpolation"])
