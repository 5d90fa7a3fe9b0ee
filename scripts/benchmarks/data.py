"""Decoded + augmented img/s of one data worker: this app's pipeline vs torchvision's default and
torchvision's fastest CPU path.

python scripts/bench.py data [--data DIR] [--images 300] [--resolution 224] [--rounds 5] [--json FILE]
Without --data it writes a folder of photos encoded as ImageNet's are (benchmarks.harness
.write_imagenet_like: quality 96, 4:4:4, three quarters 500x375, the rest larger, grayscale or CMYK).
All pipelines read the same files in one process with one thread (one worker's share of the work):
  torchvision default: ImageFolder (PIL) + RandomResizedCrop + RandomHorizontalFlip + ToTensor +
                       Normalize
  torchvision fast:    torchvision.io.decode_jpeg (libjpeg-turbo) + transforms.v2 RandomResizedCrop
                       (antialiased) + RandomHorizontalFlip on uint8 tensors
  this app:            ImageFolderRGB + TrainCrop (libjpeg-turbo, reduced-scale decoding when the
                       crop allows, torch's uint8 antialiased resize, flip), a uint8 tensor
The last two leave normalisation to the device. The pipelines take turns (reversed every other
round); ratios are medians of the rounds' ratios; rounds in which other processes took more than
a quarter of the machine are dropped. The whole feed (loader workers, a prepared set, training
against synthetic images) is `bench.py feed`.
"""
import tempfile
import time
import warnings
from pathlib import Path



def pipelines(root, resolution):
    """{name: function returning the img/s of one pass over the folder}."""
    import torchvision
    from torchvision import datasets, transforms
    from torchvision.transforms import v2

    from mobilenet.data.datasets import ImageFolderRGB
    from mobilenet.data.transforms import TrainCrop
    from mobilenet.training import IMAGENET_MEAN, IMAGENET_STD
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
    ours = ImageFolderRGB(folder, TrainCrop(resolution, scale=(0.08, 1.0), hflip=True))

    def rate(dataset, key):
        def one_pass():
            start = time.perf_counter()
            for i in range(len(dataset)):
                dataset[key(i)]
            return len(dataset) / (time.perf_counter() - start)
        return one_pass
    return {"torchvision default": rate(default, lambda i: i), "torchvision fast": rate(fast, lambda i: i),
            "this app": rate(ours, lambda i: (i, i))}


def main(argv=None):
    from benchmarks.harness import benchmark_parser
    p = benchmark_parser(__doc__)
    p.add_argument("--data", help="an ImageFolder root with train/ (default: generated photos)")
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--resolution", type=int, default=224)
    args = p.parse_args(argv)
    import torch

    from benchmarks.harness import interleave, markdown_table, write_imagenet_like, write_json
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data or write_imagenet_like(tmp, args.images, classes=1)
        torch.set_num_threads(1)  # one worker's share of the machine
        try:
            rounds = interleave(pipelines(root, args.resolution), args.rounds)
        finally:
            torch.set_num_threads(threads)
    print(rounds.describe())
    names = list(rounds.values[0])
    report = {**rounds.to_json(), "img_per_s": {name: rounds.median(name) for name in names},
              "ratio": {name: rounds.ratio("this app", name)[0] for name in names}}
    print(markdown_table([f"pipeline (1 worker, {args.resolution}px)", "img/s (median, min-max)",
                          "this app vs it (median, min-max)"],
                         [[name, rounds.cell(name), rounds.ratio_cell("this app", name)] for name in names]))
    write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
