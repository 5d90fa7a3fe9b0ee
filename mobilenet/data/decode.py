"""Decoding and augmentation in the loader's workers: file bytes -> uint8 CHW RGB tensors.

JPEGs decode with libjpeg-turbo (simplejpeg), at 1/2, 1/4 or 1/8 scale whenever the crop keeps its
output resolution; crops resize with torch's antialiased bilinear on uint8.
"""
import io
import math

import numpy
import simplejpeg
import torch
from PIL import Image
from torchvision import transforms
from torchvision.transforms import v2


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
            with Image.open(io.BytesIO(data)) as image:  # PIL applies its bomb guard here
                self.width, self.height = image.size
        limit = Image.MAX_IMAGE_PIXELS
        if self.turbo and limit and self.width * self.height > 2 * limit:  # PIL's guard, for JPEGs too
            raise Image.DecompressionBombError(f"{self.width}x{self.height} pixels is over PIL's limit "
                                               f"of {2 * limit} (Image.MAX_IMAGE_PIXELS)")

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
