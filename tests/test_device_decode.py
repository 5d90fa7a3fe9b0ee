"""data.decode=device on the cpu (torchvision's decode_jpeg on cpu tensors: the code cuda runs): the
workers' crop draws, the pixels within the stated tolerance of the workers path, every kind of bad
file in one batch, and an exact mid-epoch resume."""
import io
import random

import pytest
import torch
import yaml
from PIL import Image

import train
from conftest import TINY, assert_same_weights
from mobilenet.data.datasets import ImageFolderRGB
from mobilenet.data.transforms import TrainCrop, ValCrop
from mobilenet.data.transforms import largest_reduction
from mobilenet.data.device_decode import DeviceDecoder, Encoded, ScreenedCrop, collate, is_baseline

CPU = torch.device("cpu")


def photo(size, seed=0):
    """A crop of one of scikit-learn's two sample photos, scaled to ``size``, as a PIL image."""
    from sklearn.datasets import load_sample_images
    source = Image.fromarray(load_sample_images().images[seed % 2])
    w, h = source.size
    left, top = (seed * 37) % (w // 4), (seed * 23) % (h // 4)
    return source.crop((left, top, left + 3 * w // 4, top + 3 * h // 4)).resize(size, Image.BICUBIC)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """ImageNet-like JPEGs (quality 96, 4:4:4), 500x375 either way up and a few large ones."""
    root = tmp_path_factory.mktemp("photos")
    for split, count in (("train", 24), ("val", 8)):
        folder = root / split / "a"
        folder.mkdir(parents=True)
        for i in range(count):
            size = [(500, 375), (375, 500), (1600, 1200)][i % 3]
            photo(size, i).save(folder / f"{i}.JPEG", quality=96, subsampling=0)
    return root


def compared(root, split, crop, train_mode, seeds):
    """(workers path's uint8 images, device path's), for the same samples and seeds."""
    workers = ImageFolderRGB(root / split, crop)
    device = ImageFolderRGB(root / split, ScreenedCrop(crop, train_mode))
    keys = [(i, seed) for i, seed in seeds] if train_mode else [i for i, _ in seeds]
    batch = collate([device[key] for key in keys])
    assert len(batch.encoded) == len(keys)  # baseline JPEGs all go to the device
    decoder = DeviceDecoder(device, CPU, crop.size, None if train_mode else crop)
    return torch.stack([workers[key][0] for key in keys]), decoder(batch)[0]


def test_the_device_path_draws_the_workers_boxes_and_flips(photos):
    crop = TrainCrop(224, scale=(0.08, 1.0), hflip=True)
    screened = ImageFolderRGB(photos / "train", ScreenedCrop(crop, True))
    for index in range(len(screened.samples)):
        seed = 1000 + index
        image, sample = screened.read(index), screened[(index, seed)][0]
        rng = random.Random(seed)  # TrainCrop.__call__'s order: the box, then the flip
        assert sample.box == crop.params(image.height, image.width, rng)
        assert sample.flip == (rng.random() < 0.5) and sample.index == index


def test_pixels_within_the_stated_tolerance_of_the_workers_path(photos):
    """Where the workers path decodes at full scale: at most 1 apart (float against uint8
    antialiased resize), 0.2 on average. Where it decodes at 1/2, 1/4 or 1/8 (the crop's short side
    twice the output or more; the device decodes whole images): 8 on average at most (measured
    4.0-4.5 train, 1.0 val on photos; the maximum follows edges: 46-139 seen)."""
    crop = TrainCrop(224, scale=(0.08, 1.0), hflip=True)
    seeds = [(i % 24, 7 + i) for i in range(48)]
    workers = ImageFolderRGB(photos / "train", crop)
    full = [(i, s) for i, s in seeds if largest_reduction(*crop.params(
        workers.read(i).height, workers.read(i).width, random.Random(s))[2:], 224) == 1]
    reduced = [key for key in seeds if key not in full]
    assert full and reduced
    a, b = compared(photos, "train", crop, True, full)
    difference = (a.int() - b.int()).abs().float()
    assert difference.max() <= 1 and difference.mean() <= 0.2, (difference.max(), difference.mean())
    a, b = compared(photos, "train", crop, True, reduced)
    assert (a.int() - b.int()).abs().float().mean() <= 8
    a, b = compared(photos, "val", ValCrop(224, 0.875), False, [(i, None) for i in range(8)])
    assert (a.int() - b.int()).abs().float().mean() <= 8


def test_every_kind_of_bad_file_in_one_batch(tmp_path, capfd):
    """Progressive, CMYK, PNG named .JPEG and grayscale files, a truncated baseline JPEG and an
    empty file: the first three decoded in the worker, grayscale on the device; the truncated one
    fails there (for the whole batch, then alone), is reported once and its place taken; the empty
    one is reported by the worker, which draws the next file, as the workers path does."""
    folder = tmp_path / "train" / "a"
    folder.mkdir(parents=True)
    image = photo((200, 150))
    image.save(folder / "0-progressive.JPEG", quality=90, progressive=True)
    image.convert("CMYK").save(folder / "1-cmyk.JPEG", quality=90)
    image.save(folder / "2-png.JPEG", format="PNG")
    image.convert("L").save(folder / "3-gray.JPEG", quality=90)
    whole = io.BytesIO()
    image.save(whole, format="JPEG", quality=90)
    (folder / "4-truncated.JPEG").write_bytes(whole.getvalue()[:len(whole.getvalue()) // 2])
    (folder / "5-empty.JPEG").write_bytes(b"")
    image.save(folder / "6-good.JPEG", quality=90)
    assert not is_baseline((folder / "0-progressive.JPEG").read_bytes()) and is_baseline(whole.getvalue())
    dataset = ImageFolderRGB(tmp_path / "train", ScreenedCrop(TrainCrop(32, scale=(0.5, 1.0), hflip=True), True))
    samples = [dataset[(i, 5 + i)] for i in range(7)]
    kinds = [isinstance(sample, Encoded) for sample, _ in samples]
    assert kinds == [False, False, False, True, True, True, True]  # the empty one's place: the next file's
    out, labels = DeviceDecoder(dataset, CPU, 32)(collate(samples))
    assert out.shape == (7, 3, 32, 32) and (labels == 0).all()
    assert torch.equal(out[4], out[0])  # the truncated one's place: the batch's first good sample
    err = capfd.readouterr().err
    assert err.count("warning: skipping unreadable image") == 2
    assert "4-truncated.JPEG (RuntimeError:" in err and "5-empty.JPEG (" in err
    assert dataset.unreadable[4] and dataset.unreadable[5]


def test_a_mid_epoch_resume_is_bit_identical_with_device_decode(tmp_path, digits):
    args = ["--config", "configs/demo.yaml", *TINY, "--data", str(digits), "data.decode=device",
            "train.max_steps_per_epoch=6", "--epochs", "2"]
    assert train.main([*args, "--output", str(tmp_path / "straight")]) == 0
    assert train.main([*args, "--output", str(tmp_path / "resumed"), "train.max_steps=9"]) == 0
    assert train.main([*args, "--output", str(tmp_path / "resumed"), "--resume", "auto"]) == 0
    assert_same_weights(tmp_path / "straight", tmp_path / "resumed")
    config = yaml.safe_load((tmp_path / "straight" / "config.yaml").read_text())
    assert (config["data"]["decode"], config["derived"]["decode"]) == ("device", "device")


def test_auto_takes_the_device_only_where_its_probe_decodes_the_workers_pixels():
    """The probe's own comparison, run on the cpu (torchvision's decode against the workers'
    libjpeg-turbo: the same pixels), and the choice where a device decoded others."""
    from mobilenet.data.device_decode import SAME_PIXELS, decode_choice, probe_decode
    device_ms, host_ms, difference = probe_decode(torch.device("cpu"))
    assert difference[0] <= SAME_PIXELS[0] and difference[1] <= SAME_PIXELS[1], difference
    assert decode_choice(1.0, 100.0, difference, workers=2, where="cuda:0")[0] == "device"
    choice, why = decode_choice(1.0, 100.0, (6.0, 0.9), workers=2, where="cuda:0")
    assert choice == "workers" and why == ("workers (auto: the probe's decode on cuda:0 differed from the workers' "
                                           "by up to 6, 0.90 on average: more than 1 and 0.2)")
