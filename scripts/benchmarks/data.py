"""Decoded + augmented img/s of one data worker: this app's pipeline vs torchvision's default and
torchvision's fastest CPU path.

python scripts/bench.py data [--data DIR] [--images 300] [--resolution 224] [--rounds 5]
                             [--loader-workers N [--batch-size 256]] [--json FILE]
Without --data it writes a folder of real photos (scikit-learn's two sample JPEGs, cropped and
scaled to ImageNet-like sizes: 3/4 of them 500x375 or 375x500, 1/4 with a long side of 800-2000).
All pipelines read the same files in one process with one thread (one worker's share of the work):
  torchvision default: ImageFolder (PIL) + RandomResizedCrop + RandomHorizontalFlip + ToTensor +
                       Normalize
  torchvision fast:    torchvision.io.decode_jpeg (libjpeg-turbo) + transforms.v2 RandomResizedCrop
                       (antialiased) + RandomHorizontalFlip on uint8 tensors
  this app:            ImageFolderRGB + TrainCrop (libjpeg-turbo, reduced-scale decoding when the
                       crop allows, torch's uint8 antialiased resize, flip), a uint8 tensor
The last two leave normalisation to the device. The pipelines take turns (reversed every other
round); ratios are medians of the rounds' ratios; rounds in which other processes took more than
a quarter of the machine are dropped.
--loader-workers N then measures the feed rate: the app's own train DataLoader over the same files
with N workers (all usable cores, say), img/s from its first batch to the end of --rounds epochs;
its batch is at most --batch-size and small enough that every worker makes 4 batches an epoch.
"""
import tempfile
import time
import warnings
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
    """{name: function returning the img/s of one pass over the folder}."""
    import torchvision
    from torchvision import datasets, transforms
    from torchvision.transforms import v2

    from mobilenet.data import IMAGENET_MEAN, IMAGENET_STD, ImageFolderRGB, train_transform
    folder = Path(root) / "train"
    default = datasets.ImageFolder(folder, transforms.Compose([
        transforms.RandomResizedCrop(resolution), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]))
    fast_transform = v2.Compose([v2.RandomResizedCrop(resolution, antialias=True), v2.RandomHorizontalFlip()])
    warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)  # torchvision 0.29+ points
    # to TorchCodec; decode_jpeg is still torchvision's own fastest JPEG path
    fast = datasets.DatasetFolder(folder, loader=lambda path: torchvision.io.decode_jpeg(
        torchvision.io.read_file(path), mode=torchvision.io.ImageReadMode.RGB),
        extensions=(".jpeg", ".jpg"), transform=fast_transform)
    ours = ImageFolderRGB(folder, train_transform(resolution, 0.08, True))

    def rate(dataset, key):
        def one_pass():
            start = time.perf_counter()
            for i in range(len(dataset)):
                dataset[key(i)]
            return len(dataset) / (time.perf_counter() - start)
        return one_pass
    return {"torchvision default": rate(default, lambda i: i), "torchvision fast": rate(fast, lambda i: i),
            "this app": rate(ours, lambda i: (i, i))}


def feed_rate(root, resolution, workers, batch, epochs):
    """img/s the app's train loader delivers with ``workers`` workers, after its first batch."""
    from mobilenet.data import ImageFolderRGB, build_loaders, train_transform
    train = ImageFolderRGB(Path(root) / "train", train_transform(resolution, 0.08, True))
    batch = max(1, min(batch, len(train) // (4 * max(1, workers))))  # every worker busy, not its start
    data = {"batch_size": batch, "val_batch_size": batch}
    loader, _ = build_loaders(train, train, data, seed=0, workers=workers)
    images, start = 0, None
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        for batch_images, _ in loader:
            if start is None:
                start = time.perf_counter()
                continue
            images += len(batch_images)
    return images / (time.perf_counter() - start), batch


def main(argv=None):
    from benchmarks.harness import benchmark_parser
    p = benchmark_parser(__doc__)
    p.add_argument("--data", help="an ImageFolder root with train/ (default: generated photos)")
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--loader-workers", type=int, default=0, help="also the feed rate of N loader workers")
    p.add_argument("--batch-size", type=int, default=256, help="the feed rate's batch")
    args = p.parse_args(argv)
    import torch

    from benchmarks.harness import interleave, markdown_table, write_json
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data or write_photo_folder(tmp, args.images)
        torch.set_num_threads(1)  # one worker's share of the machine
        try:
            rounds = interleave(pipelines(root, args.resolution), args.rounds)
        finally:
            torch.set_num_threads(threads)
        feed = feed_rate(root, args.resolution, args.loader_workers, args.batch_size, args.rounds) \
            if args.loader_workers else None
    print(rounds.describe())
    names = list(rounds.values[0])
    report = {**rounds.to_json(), "img_per_s": {name: rounds.median(name) for name in names},
              "ratio": {name: rounds.ratio("this app", name)[0] for name in names}}
    if feed is not None:
        feed, batch = feed
        report["feed"] = {"workers": args.loader_workers, "batch": batch, "img_per_s": feed}
        print(f"feed rate: the app's train loader with {args.loader_workers} workers, batch {batch}, "
              f"{args.resolution} px: {feed:.0f} img/s (after its first batch, {args.rounds} epochs of "
              f"{args.images if not args.data else 'the'} images)")
    print(markdown_table([f"pipeline (1 worker, {args.resolution}px)", "img/s (median, min-max)",
                          "this app vs it (median, min-max)"],
                         [[name, rounds.cell(name), rounds.ratio_cell("this app", name)] for name in names]))
    write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
