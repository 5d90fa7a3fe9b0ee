"""Parameters and multiply-adds of a model of the table (mobilenet.model.MODELS), counted from it.

python scripts/model_info.py [--model mobilenet_v1] [--width 1.0] [--resolution 224] [--num-classes 1000]
"""
import argparse

import package  # noqa: F401  (the mobilenet package, or one line that says how to run this)
from mobilenet.model import build_model, count_multiply_adds, model_row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="mobilenet_v1", help="a model of the table, or torchvision's by name")
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    args = p.parse_args(argv)
    if model_row(args.model) is None:
        p.error(f"--model {args.model}: neither in mobilenet.model.MODELS nor a classification model of torchvision's")
    model = build_model({"name": args.model, "width_mult": args.width, "num_classes": args.num_classes})
    params = sum(p.numel() for p in model.parameters())
    macs = count_multiply_adds(model, args.resolution)
    width = f" width {args.width}" if "width_mult" in model_row(args.model).takes else ""
    print(f"{args.model}{width} resolution {args.resolution}: "
          f"{params:,} parameters ({params / 1e6:.2f} M), {macs:,} multiply-adds ({macs / 1e6:.0f} M)")


if __name__ == "__main__":
    main()
