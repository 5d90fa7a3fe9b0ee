"""Top-1/top-5 of a checkpoint (ours or an Ascend ModelZoo .pth.tar) on a validation set.

python scripts/validate.py --checkpoint X --data /path/to/imagenet [--resolution 224]
--data takes what train.py's does (an ImageFolder root, a prepared set, digits). Prints
` * Prec@1 X Prec@5 Y` (the line Ascend's scripts parse); unreadable images are left out and said.
ImageNet protocol: resize to resolution/0.875 (256 for 224), centre crop. The model, its width and
class count are read from the checkpoint.
"""
import argparse
import contextlib
import sys

import package  # noqa: F401  (the mobilenet package, or one line that says how to run this)
from mobilenet.device import DEVICES
from mobilenet.errors import exit_code
from mobilenet.validation import accuracy_line


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", required=True, help="as train.py's: an ImageFolder root with val/<class>/..., "
                   "a prepared set, digits")
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--resize-ratio", type=float, default=0.875)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--device", default="auto", choices=DEVICES)
    args = p.parse_args(argv)

    def report():
        result = validate(args)
        print(accuracy_line(result.top1, result.top5, result.note() if result.left_out else ""))
    return exit_code(report)


def validate(args):
    from torch.utils.data import DataLoader

    from mobilenet.checkpoint import load_checkpoint
    from mobilenet.config import build_config
    from mobilenet.data.sources import build_datasets
    from mobilenet.training import DevicePrefetcher
    from mobilenet.device import choose_device, open_device
    from mobilenet.validation import accuracy
    from mobilenet.model import model_from_checkpoint, output_classes

    device = open_device(choose_device(args.device))
    net = model_from_checkpoint(load_checkpoint(args.checkpoint), args.checkpoint).to(device)
    cfg = build_config(None, settings={"data.path": args.data, "model.resolution": args.resolution,
                                       "data.val_resize_ratio": args.resize_ratio,
                                       "model.num_classes": output_classes(net)})
    _, val = build_datasets(cfg["data"], cfg["model"], cfg["augment"])  # the train split too: their classes must agree
    loader = DataLoader(val, batch_size=args.batch_size, num_workers=args.workers,
                        pin_memory=device.type != "cpu")
    return accuracy(net, DevicePrefetcher(loader, device), contextlib.nullcontext, device)


if __name__ == "__main__":
    sys.exit(main())
