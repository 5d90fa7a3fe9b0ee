"""The loader's decoding and augmentation against torchvision's: same crop distribution, same
pixels for the same crop, reduced-scale decoding close to full decoding, the same val protocol."""
import math
import random
import statistics

import pytest
import torch
from PIL import Image
from torchvision import transforms
from torchvision.transforms.functional import pil_to_tensor
from torchvision.transforms.v2.functional import resized_crop

from mobilenet.data.datasets import EncodedImage
from mobilenet.data.transforms import TrainCrop, ValCrop, largest_reduction


def write_gradient_jpeg(path, width, height):
    ramp = torch.linspace(0, 255, width).to(torch.uint8).expand(height, width)
    pixels = torch.stack([ramp, ramp.flip(1), torch.full((height, width), 90, dtype=torch.uint8)], dim=2)
    Image.fromarray(pixels.numpy()).save(path, quality=95)
    return EncodedImage(path.read_bytes())


@pytest.mark.parametrize("height,width,scale", [(375, 500, (0.08, 1.0)), (32, 32, (0.5, 1.0)),
                                                (100, 900, (0.08, 1.0))])  # the last hits the fallback
def test_crop_draws_follow_torchvision_random_resized_crop(height, width, scale):
    """20,000 draws each: our per-sample generator against torchvision's get_params."""
    ours = TrainCrop(224, scale=scale)
    rng = random.Random(0)
    mine = [ours.params(height, width, rng) for _ in range(20_000)]
    torch.manual_seed(0)
    image = torch.empty(3, height, width)
    theirs = [transforms.RandomResizedCrop.get_params(image, list(scale), [3 / 4, 4 / 3])
              for _ in range(20_000)]

    def features(draws):  # area share, log aspect, relative top and left
        return [[h * w / (height * width) for top, left, h, w in draws],
                [math.log(w / h) for top, left, h, w in draws],
                [top / height for top, left, h, w in draws], [left / width for top, left, h, w in draws]]
    for a, b in zip(features(mine), features(theirs)):
        assert statistics.mean(a) == pytest.approx(statistics.mean(b), abs=0.006)
        assert statistics.quantiles(a, n=10) == pytest.approx(statistics.quantiles(b, n=10), abs=0.02)


def test_same_crop_same_pixels_as_torchvision(tmp_path):
    image = write_gradient_jpeg(tmp_path / "small.JPEG", 500, 375)  # ImageNet's typical size
    crop = TrainCrop(224, hflip=False)
    ours = crop(image, seed=7)
    top, left, height, width = crop.params(375, 500, random.Random(7))
    with Image.open(tmp_path / "small.JPEG") as pil:
        reference = pil_to_tensor(transforms.functional.resized_crop(
            pil.convert("RGB"), top, left, height, width, [224, 224]))
    assert ours.shape == (3, 224, 224) and ours.dtype == torch.uint8
    assert (ours.float() - reference.float()).abs().mean() < 1.0
    assert torch.equal(crop(image, seed=7), ours)  # a seed is a sample's whole randomness
    flips = TrainCrop(224)
    assert {torch.equal(flips(image, s), crop(image, s)) for s in range(20)} == {True, False}


def test_crop_decodes_large_jpegs_at_reduced_scale_with_nearly_the_same_result(tmp_path):
    image = write_gradient_jpeg(tmp_path / "big.JPEG", 2000, 1500)
    assert image.decode(4).shape == (3, 375, 500)
    assert largest_reduction(1400, 1900, 224) == 4 and largest_reduction(440, 500, 224) == 1
    crop = TrainCrop(224, scale=(0.9, 1.0), hflip=False)
    fast = crop(image, seed=3)
    top, left, height, width = crop.params(1500, 2000, random.Random(3))
    full = resized_crop(image.decode(1), top, left, height, width, [224, 224], antialias=True)
    assert fast.shape == (3, 224, 224) and (fast.float() - full.float()).abs().mean() < 2.0


@pytest.mark.parametrize("width,height", [(500, 375), (375, 500), (1200, 900), (40, 30)])
def test_val_crop_is_torchvisions_resize_and_centre_crop(tmp_path, width, height):
    image = write_gradient_jpeg(tmp_path / "v.JPEG", width, height)
    reference = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224)])
    with Image.open(tmp_path / "v.JPEG") as pil:
        expected = pil_to_tensor(reference(pil.convert("RGB")))
    ours = ValCrop(224, 0.875)(image)
    assert ours.shape == expected.shape == (3, 224, 224)
    tolerance = 2.5 if min(width, height) >= 512 else 1.0  # reduced-scale decoding above 512
    assert (ours.float() - expected.float()).abs().mean() < tolerance


def test_the_decoded_cache_changes_no_sample(tmp_path, digits):
    """data.cache_mb: the same pixels as reading again, at full and at reduced scale."""
    from mobilenet.data.datasets import ImageFolderRGB
    from mobilenet.data.transforms import TrainCrop
    for i in range(4):  # large enough for reduced-scale decoding
        folder = tmp_path / "big" / "train" / "x"
        folder.mkdir(parents=True, exist_ok=True)
        write_gradient_jpeg(folder / f"{i}.JPEG", 1000 + 100 * i, 800)
    for root, size, budget in ((digits / "train", 32, 1), (tmp_path / "big" / "train", 224, 64)):
        plain = ImageFolderRGB(root, TrainCrop(size, scale=(0.08, 1.0), hflip=True))
        cached = ImageFolderRGB(root, TrainCrop(size, scale=(0.08, 1.0), hflip=True), cache_mb=budget)
        assert 0 < len(cached.cache) <= len(cached) and not plain.cache
        assert sum(3 * i.height * i.width + len(i.data) for i in cached.cache.values()) <= budget * 2**20
        for index in range(0, len(plain), max(1, len(plain) // 50)):
            for seed in (index, index + 10_000):
                assert torch.equal(plain[(index, seed)][0], cached[(index, seed)][0]), (root, index)


@pytest.mark.parametrize("mode_bits", [16, 8])
def test_sixteen_bit_grayscale_pngs_scale_to_eight_bits(tmp_path, mode_bits):
    """A 16-bit grayscale PNG (PIL mode I;16) keeps its tones: 0, 1/4, 1/2, 3/4 and full scale read
    as 0, 64, 128, 192 and 255 on all three channels, as the same image saved in 8 bits does."""
    levels = torch.tensor([0, 16384, 32768, 49152, 65535], dtype=torch.int32)
    if mode_bits == 8:
        levels = levels >> 8
    rows = levels.repeat(3, 1).numpy().astype("uint16" if mode_bits == 16 else "uint8")
    Image.fromarray(rows).save(tmp_path / "gray.png")
    pixels = EncodedImage((tmp_path / "gray.png").read_bytes()).decode()
    assert pixels.dtype == torch.uint8 and pixels.shape == (3, 3, 5)
    assert pixels[:, 0].tolist() == [[0, 64, 128, 192, 255]] * 3
