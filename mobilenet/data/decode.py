"""Decoding in the loader's workers: file bytes -> uint8 CHW RGB tensors (the crops that ask for
them: data/crops.py).

JPEGs decode with libjpeg-turbo (simplejpeg), at 1/2, 1/4 or 1/8 scale whenever the caller keeps
its output resolution; images resize with torch's antialiased bilinear on uint8.
"""
import io
import math

import numpy
import simplejpeg
import torch
import torch.nn.functional as F
from PIL import Image


class EncodedImage:
    """An image file's bytes and size, decoded on demand to a uint8 CHW RGB tensor.

    YCbCr and grayscale JPEGs (baseline or progressive) go through libjpeg-turbo (simplejpeg), which
    decodes at 1/2, 1/4 or 1/8 scale almost proportionally faster; anything else (CMYK JPEGs, PNGs
    named .JPEG) through PIL, with its draft mode where the file allows."""

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
        """From now on the full-scale decode is kept (the same pixels as decoding again); returns
        the bytes this will hold."""
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


def resize(pixels, height, width):
    """uint8 CHW -> height x width, antialiased bilinear (torch's uint8 kernel, as torchvision's
    v2 resize uses it, without its per-call dispatch)."""
    return F.interpolate(pixels[None], size=(height, width), mode="bilinear", antialias=True,
                         align_corners=False)[0]
