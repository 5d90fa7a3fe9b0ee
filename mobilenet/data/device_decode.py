"""data.decode=device: JPEGs decoded on the step's device, then cropped, resized and flipped there.

The workers screen each file's header and draw its crop and flip from the sample's seed; baseline
JPEGs travel as bytes, others are decoded there. The main process decodes each batch with
torchvision's decode_jpeg (nvJPEG on cuda) in a thread of its own, then crops and resizes with
antialiased bilinear on float. Whole images, never at reduced scale, so the pixels differ from the
workers' (tests/test_device_decode.py gives the tolerance). Unbuilt for Ascend's DVPP (no card).
"""
import random
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F

SOF_BASELINE = (0xC0, 0xC1)  # baseline and extended sequential DCT: what nvJPEG batches
SOF_OTHER = (0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)  # progressive, lossless, ...


def is_baseline(data):
    """Whether JPEG ``data`` is sequential (baseline) by its first frame header; progressive and the
    rest go to the worker's decoder (nvJPEG sends them one by one through its slow hybrid path)."""
    position = 2
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            return False
        marker = data[position + 1]
        if marker in SOF_BASELINE:
            return True
        if marker in SOF_OTHER or marker == 0xDA:  # another frame kind, or the scan before any frame
            return False
        position += 2 + int.from_bytes(data[position + 2:position + 4], "big")
    return False


class Encoded(NamedTuple):
    """A sample for the device: its bytes, crop box (None: validation's), flip and dataset index."""
    data: torch.Tensor
    box: tuple | None
    flip: bool
    index: int = -1

    def with_index(self, index):
        return self._replace(index=index)


class ScreenedCrop:
    """The worker's side of data.decode=device around a TrainCrop or ValCrop: an Encoded for a
    baseline YCbCr or grayscale JPEG, the crop's own uint8 output (decoded here) for anything else."""

    keeps_bytes = True  # a cached image keeps its file's bytes (data.cache_mb), not its pixels

    def __init__(self, crop, train):
        self.crop, self.train = crop, train

    def __call__(self, image, seed=None):
        if not (image.turbo and is_baseline(image.data)):
            return self.crop(image, seed)
        data = torch.frombuffer(bytearray(image.data), dtype=torch.uint8)
        if not self.train:
            return Encoded(data, None, False)
        rng = random.Random(seed)  # the draws of TrainCrop.__call__, in its order
        box = self.crop.params(image.height, image.width, rng)
        return Encoded(data, box, bool(self.crop.hflip and rng.random() < 0.5))


@dataclass
class EncodedBatch:
    """A batch in which some samples are still encoded: ``decoded`` the worker-decoded images
    (k, 3, S, S) at positions ``decoded_at``, ``encoded`` the rest at ``encoded_at``."""
    labels: torch.Tensor
    decoded: torch.Tensor | None
    decoded_at: list
    encoded: list = field(default_factory=list)
    encoded_at: list = field(default_factory=list)

    def pin_memory(self):  # the DataLoader's pinning (cuda): the bytes stay where they are
        if self.decoded is not None:
            self.decoded = self.decoded.pin_memory()
        return self

    def __len__(self):
        return len(self.labels)


def collate(samples):
    """The DataLoader's collate_fn under data.decode=device: [(image or Encoded, label)] -> EncodedBatch."""
    decoded_at = [i for i, (image, _) in enumerate(samples) if not isinstance(image, Encoded)]
    encoded_at = [i for i, (image, _) in enumerate(samples) if isinstance(image, Encoded)]
    return EncodedBatch(labels=torch.tensor([label for _, label in samples]),
                        decoded=torch.stack([samples[i][0] for i in decoded_at]) if decoded_at else None,
                        decoded_at=decoded_at, encoded=[samples[i][0] for i in encoded_at], encoded_at=encoded_at)


def decode_jpegs(datas, device):
    """torchvision's decode_jpeg of a list of byte tensors to RGB on ``device``; for a list that
    fails as a whole (one bad file fails all), each on its own: (images, {position: error})."""
    from torchvision.io import ImageReadMode, decode_jpeg
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")
        try:
            return decode_jpeg(datas, mode=ImageReadMode.RGB, device=device), {}
        except RuntimeError:
            images, errors = [], {}
            for position, data in enumerate(datas):
                try:
                    images.append(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))
                except RuntimeError as e:
                    images.append(None)
                    errors[position] = e
            return images, errors


def resized(pixels, height, width):
    """uint8 CHW -> height x width: antialiased bilinear on float, rounded back to uint8."""
    out = F.interpolate(pixels[None].float(), size=(height, width), mode="bilinear", antialias=True,
                        align_corners=False)[0]
    return out.round_().clamp_(0, 255).to(torch.uint8)


class DeviceDecoder:
    """``decoder(batch)`` -> (uint8 images on ``device``, labels): an EncodedBatch decoded and cropped
    there. A file that fails is reported through ``dataset``, its place taken by the batch's first
    good sample (training) or a blank labelled -1 (validation)."""

    def __init__(self, dataset, device, size, val_crop=None):
        self.dataset, self.device, self.size, self.val_crop = dataset, device, size, val_crop

    def __call__(self, batch):
        out = torch.empty((len(batch), 3, self.size, self.size), dtype=torch.uint8, device=self.device)
        labels = batch.labels.clone()
        if batch.decoded is not None:
            out[batch.decoded_at] = batch.decoded.to(self.device, non_blocking=True)
        images, errors = decode_jpegs([sample.data for sample in batch.encoded], self.device)
        for at, sample, pixels in zip(batch.encoded_at, batch.encoded, images):
            if pixels is None:
                continue
            if sample.box is None:
                out[at] = self.val_crop.centre(resized(pixels, *self.val_crop.resized(*pixels.shape[1:])))
            else:
                top, left, height, width = sample.box
                crop = resized(pixels[:, top:top + height, left:left + width], self.size, self.size)
                out[at] = crop.flip(-1) if sample.flip else crop
        for position, error in errors.items():
            self.replace(out, labels, batch.encoded_at[position], batch.encoded[position].index, error)
        return out, labels

    def replace(self, out, labels, at, index, error):
        self.dataset.report_unreadable(index, self.dataset.samples[index][0], f"{type(error).__name__}: "
                                       f"{str(error).strip().splitlines()[0][:200]}")
        if self.val_crop is not None:
            out[at], labels[at] = 0, -1
            return
        good = next((i for i in range(len(labels)) if i != at and labels[i] >= 0), None)
        if good is not None:
            out[at], labels[at] = out[good], labels[good]


PROBE_IMAGES = 16  # baseline JPEGs of ImageNet's common size, for data.decode auto on cuda
# The most a full-scale decode on the device may differ from the workers' (libjpeg-turbo) and
# still count as the same pixels: largest and mean |difference|, as measured on the cpu through
# the whole crop (tests/test_device_decode.py).
SAME_PIXELS = (1, 0.2)


def probe_choice(card, workers):
    """data.decode auto's choice on cuda card ``card``, from a probe (see decode_choice)."""
    return decode_choice(*probe_decode(torch.device("cuda", card)), workers=workers, where=f"cuda:{card}")


def decode_choice(device_ms, host_ms, difference, *, workers, where):
    """data.decode auto's choice from a probe's timings and its pixels' (largest, mean) difference."""
    if difference[0] > SAME_PIXELS[0] or difference[1] > SAME_PIXELS[1]:
        return "workers", (f"workers (auto: the probe's decode on {where} differed from the workers' by up to "
                           f"{difference[0]:g}, {difference[1]:.2f} on average: more than {SAME_PIXELS[0]} and "
                           f"{SAME_PIXELS[1]})")
    host_ms /= max(1, workers)
    choice = "device" if device_ms < host_ms else "workers"
    return choice, (f"{choice} (auto: the probe decoded {PROBE_IMAGES} JPEGs to the workers' pixels in "
                    f"{device_ms:.1f} ms on {where}, {host_ms:.1f} ms with {max(1, workers)} worker(s))")


def probe_decode(device):
    """(device ms, one host core's ms, (largest, mean) pixel difference) for the probe's JPEGs."""
    import time

    import simplejpeg
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (375, 500, 3), dtype=torch.uint8, generator=generator)
    pixels = F.avg_pool2d(pixels.permute(2, 0, 1)[None].float(), 9, 1, 4)[0].permute(1, 2, 0).to(torch.uint8)
    data = simplejpeg.encode_jpeg(pixels.contiguous().numpy(), quality=90, colorsubsampling="420")
    batch = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for _ in range(PROBE_IMAGES)]
    timings, decoded = [], []
    for decode in (lambda: decode_jpegs(batch, device)[0], lambda: [simplejpeg.decode_jpeg(data) for _ in batch]):
        decode()
        start = time.perf_counter()
        decoded.append(decode()[0])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timings.append(1000 * (time.perf_counter() - start))
    difference = (decoded[0].cpu().int() - torch.from_numpy(decoded[1]).permute(2, 0, 1).int()).abs().float()
    return timings[0], timings[1], (difference.max().item(), difference.mean().item())
