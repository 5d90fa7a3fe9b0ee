"""Augmentation, the fifth table: a training image's policy after its crop (POLICIES, transforms.v2's),
random erasing, and MixUp/CutMix on the device, as torchvision's references apply them. Each draw
comes from torch's generator, forked and seeded from the sample's seed or (seed, epoch, step,
virtual rank), so a resumed or re-split run draws what the straight run draws."""
import contextlib
import hashlib
from dataclasses import dataclass
from typing import Callable

import torch

from mobilenet.data.transforms import IMAGENET_MEAN
from mobilenet.tables import Setting, row_settings


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


class BatchMix:
    """MixUp and CutMix of a batch (torchvision's v2.MixUp and v2.CutMix; with both, one of them a
    batch, as the references choose), the labels becoming soft targets of ``num_classes``."""

    def __init__(self, augment, num_classes, seed):
        from torchvision.transforms import v2
        mixes = [cls(alpha=augment[key], num_classes=num_classes)
                 for cls, key in ((v2.MixUp, "mixup_alpha"), (v2.CutMix, "cutmix_alpha")) if augment[key] > 0]
        self.mix, self.seed = mixes[0] if len(mixes) == 1 else v2.RandomChoice(mixes), seed

    def __call__(self, images, labels, *, epoch, step, virtual_rank):
        draw = hashlib.sha256(f"mix {self.seed} {epoch} {step} {virtual_rank}".encode()).digest()[:8]
        with drawn_from(int.from_bytes(draw, "little")):
            return self.mix(images, labels)


@contextlib.contextmanager
def drawn_from(seed):
    """torch's (cpu) generator seeded with ``seed`` inside, and as it was after: no other draw moves."""
    with torch.random.fork_rng(devices=()):
        torch.manual_seed(seed % 2**64)
        yield


def build_batch_mix(augment, num_classes, seed):
    """The BatchMix of the ``augment`` section, or None (both alphas 0)."""
    return BatchMix(augment, num_classes, seed) if augment["mixup_alpha"] or augment["cutmix_alpha"] else None
