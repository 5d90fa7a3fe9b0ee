"""Decoding in the loader's workers to uint8 CHW RGB tensors, and the crops (TrainCrop, ValCrop)."""
import io
import math
import random

import numpy
import simplejpeg
import torch
import torch.nn.functional as F
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class EncodedImage:
    """An image file's bytes and size, decoded on demand: YCbCr and grayscale JPEGs by libjpeg-turbo
    (simplejpeg), at 1/2-1/8 scale about that much faster; anything else (CMYK, PNGs) by PIL."""

    def __init__(self, data):
        self.data = data
        self.full = None  # the full-scale pixels, once hold_full_scale() has been called
        try:
            self.height, self.width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
            self.turbo = colorspace in ("YCbCr", "Gray")
        except ValueError:  # not a JPEG libjpeg-turbo reads
            self.turbo = False
            with Image.open(io.BytesIO(data)) as image:  # PIL applies its bomb guard here
                self.width, self.height = image.size
        limit = Image.MAX_IMAGE_PIXELS
        if self.turbo and limit and self.width * self.height > 2 * limit:  # PIL's guard, for JPEGs too
            raise Image.DecompressionBombError(f"{self.width}x{self.height} pixels is over PIL's limit "
                                               f"of {2 * limit} (Image.MAX_IMAGE_PIXELS)")

    def hold_full_scale(self):
        """From now on the full-scale decode is kept; returns the bytes this will hold."""
        self.full = False
        return len(self.data) + 3 * self.height * self.width

    def decode(self, reduce=1):
        """Decoded at about 1/reduce of full size (1, 2, 4 or 8; other factors decode slower)."""
        if reduce == 1 and self.full is not None:
            if self.full is False:
                self.full = self._decode(1)
            return self.full
        return self._decode(reduce)

    def _decode(self, reduce):
        height, width = math.ceil(self.height / reduce), math.ceil(self.width / reduce)
        if self.turbo:
            pixels = simplejpeg.decode_jpeg(self.data, "RGB", min_height=height, min_width=width)
        else:
            with Image.open(io.BytesIO(self.data)) as image:
                image.draft("RGB", (width, height))
                pixels = rgb_pixels(image)
        return torch.from_numpy(pixels).permute(2, 0, 1)


def rgb_pixels(image):
    """HWC uint8 RGB of a PIL image. 16-bit grayscale (PNG, TIFF: modes I;16* and I) is scaled to 8
    bits; PIL's convert("RGB") would clip every value above 255 to white."""
    if image.mode.startswith("I;16") or image.mode == "I":
        gray = (numpy.asarray(image).astype(numpy.uint32) >> 8).clip(0, 255).astype(numpy.uint8)
        return numpy.repeat(gray[:, :, None], 3, axis=2)
    return numpy.array(image.convert("RGB"))


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
