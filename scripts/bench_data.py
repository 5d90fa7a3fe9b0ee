"""Decoded + augmented img/s of one data worker: this app's pipeline vs torchvision's default.

python scripts/bench_data.py [--data DIR] [--images 300] [--resolution 224] [--json FILE]
Without --data it writes a folder of real photos (scikit-learn's two sample JPEGs, cropped and
scaled to ImageNet-like sizes: 3/4 of them 500x375 or 375x500, 1/4 with a long side of 800-2000).
Both pipelines read the same files in one process (one worker's share of the work):
  torchvision: ImageFolder + RandomResizedCrop + RandomHorizontalFlip + ToTensor + Normalize
  this app:    ImageFolderRGB + DecodeRandomResizedCrop (libjpeg-turbo, reduced-scale decoding when
               the crop allows, torch's uint8 antialiased resize) + flip, a uint8 tensor
               (normalisation happens later, on the device)
The pipelines take turns, one pass each per round; the ratio is the median of the rounds' ratios,
so a slow spell of a shared machine hits both.
"""
import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path



def write_photo_folder(root, count, seed=0):
    """``count`` JPEGs cut from scikit-learn's sample photos, in one class folder."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    photos = [Image.fromarray(a) for a in load_sample_images().images]
    folder = Path(root) / "train" / "photos"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        photo = photos[i % len(photos)]
        if rng.random() < 0.75:
            size = (500, 375) if rng.random() < 0.5 else (375, 500)
        else:
            long_side = int(rng.integers(800, 2001))
            size = (long_side, long_side * 3 // 4)
        w, h = photo.size
        crop_w, crop_h = int(w * rng.uniform(0.6, 1)), int(h * rng.uniform(0.6, 1))
        left, top = int(rng.integers(0, w - crop_w + 1)), int(rng.integers(0, h - crop_h + 1))
        image = photo.crop((left, top, left + crop_w, top + crop_h)).resize(size, Image.BICUBIC)
        image.save(folder / f"{i:04d}.JPEG", quality=90)
    return Path(root)


def pipelines(root, resolution):
    from torchvision import datasets, transforms

    from mobilenet.data import IMAGENET_MEAN, IMAGENET_STD, ImageFolderRGB, train_transform
    default = datasets.ImageFolder(Path(root) / "train", transforms.Compose([
        transforms.RandomResizedCrop(resolution), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]))
    ours = ImageFolderRGB(Path(root) / "train", train_transform(resolution, 0.08, True))
    return {"torchvision default": (default, lambda i: i), "this app": (ours, lambda i: (i, i))}


def seconds_per_pass(dataset, key):
    start = time.perf_counter()
    for i in range(len(dataset)):
        dataset[key(i)]
    return time.perf_counter() - start


def measure(pipelines, repeats):
    """{name: (median img/s, median ratio to the first pipeline)} over interleaved rounds."""
    seconds = {name: [] for name in pipelines}
    for _ in range(repeats):
        for name, (dataset, key) in pipelines.items():
            seconds[name].append(seconds_per_pass(dataset, key))
    base = next(iter(seconds.values()))
    count = len(next(iter(pipelines.values()))[0])
    return {name: (statistics.median(count / t for t in times),
                   statistics.median(b / t for b, t in zip(base, times)))
            for name, times in seconds.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="an ImageFolder root with train/ (default: generated photos)")
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds")
    p.add_argument("--json")
    args = p.parse_args(argv)
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one worker's share of the machine
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = args.data or write_photo_folder(tmp, args.images)
            rows = measure(pipelines(root, args.resolution), args.repeats)
    finally:
        torch.set_num_threads(threads)
    print(f"| pipeline (1 worker, {args.resolution}px) | img/s | vs torchvision |\n|---|---|---|")
    for name, (rate, ratio) in rows.items():
        print(f"| {name} | {rate:.1f} | {ratio:.2f}x |")
    if args.json:
        report = {"img_per_s": {name: rate for name, (rate, _) in rows.items()},
                  "ratio": rows["this app"][1], "rounds": args.repeats}
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
