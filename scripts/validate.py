"""Top-1/top-5 of a checkpoint (ours or an Ascend ModelZoo .pth.tar) on an ImageFolder val set.

python scripts/validate.py --checkpoint X --data /path/to/imagenet [--resolution 224]
Prints ` * Prec@1 X Prec@5 Y` (the line Ascend's scripts parse).
ImageNet protocol: resize to resolution/0.875 (256 for 224), centre crop. Width and class count
are read from the weights.
"""
import argparse
import contextlib
import sys

from mobilenet.device import DEVICES
from mobilenet.errors import UsageError, exit_code
from mobilenet.logging import accuracy_line


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", required=True, help="ImageFolder root holding val/<class>/...")
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
    from mobilenet.data import DevicePrefetcher, image_folder, val_transform
    from mobilenet.device import choose_device, open_device
    from mobilenet.engine import accuracy
    from mobilenet.model import model_from_checkpoint

    device = open_device(choose_device(args.device))
    net = model_from_checkpoint(load_checkpoint(args.checkpoint), args.checkpoint).to(device)
    val = image_folder(args.data, "val", val_transform(args.resolution, args.resize_ratio), False)
    if len(val.classes) != net.num_classes:
        raise UsageError(f"--data {args.data}: {len(val.classes)} classes, "
                         f"the checkpoint has {net.num_classes}")
    loader = DataLoader(val, batch_size=args.batch_size, num_workers=args.workers,
                        pin_memory=device.type != "cpu")
    return accuracy(net, DevicePrefetcher(loader, device), contextlib.nullcontext, device)


if __name__ == "__main__":
    sys.exit(main())
