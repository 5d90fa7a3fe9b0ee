"""The crops the loader's workers make of an image: training's RandomResizedCrop and flip, drawn
from a per-sample seed, and validation's resize and centre crop. A crop is called as
``crop(image, seed)`` on an EncodedImage: training draws its randomness from the seed alone.
"""
import math
import random

from mobilenet.data.decode import largest_reduction, resize


class TrainCrop:
    """RandomResizedCrop (+ horizontal flip) of an EncodedImage, from a per-sample seed.

    The crop is drawn from the header's size, the file decoded at the smallest scale that keeps the
    crop's full output resolution, and the crop resized with antialiased bilinear on uint8. The
    draws follow torchvision's RandomResizedCrop.get_params exactly, with a random.Random of the
    sample's seed in place of torch's global generator: torchvision's ~15 one-element tensor ops
    cost ~150 us an image and need the global state saved and restored around each sample."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=True):
        self.size, self.scale, self.ratio, self.hflip = size, scale, ratio, hflip
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
        out = resize(crop, self.size, self.size)
        return out.flip(-1) if self.hflip and rng.random() < 0.5 else out


class ValCrop:
    """The standard protocol: resize the shorter side to resolution / resize_ratio (decoding at the
    smallest scale that still covers it), centre crop, as torchvision's Resize + CenterCrop do."""

    def __init__(self, size, resize_ratio):
        self.size, self.side = size, round(size / resize_ratio)

    def __call__(self, image, seed=None):
        pixels = image.decode(largest_reduction(image.height, image.width, self.side))
        return self.centre(resize(pixels, *self.resized(*pixels.shape[1:])))

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


def train_transform(resolution, min_scale, hflip):
    return TrainCrop(resolution, scale=(min_scale, 1.0), hflip=hflip)


def val_transform(resolution, resize_ratio):
    return ValCrop(resolution, resize_ratio)
