"""Parameters and multiply-adds of MobileNetV1, counted from the model.

python scripts/model_info.py [--width 1.0] [--resolution 224] [--num-classes 1000]
"""
import argparse

from mobilenet.model import MobileNetV1, count_multiply_adds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--num-classes", type=int, default=1000)
    args = p.parse_args(argv)
    model = MobileNetV1(args.width, args.num_classes)
    params = sum(p.numel() for p in model.parameters())
    macs = count_multiply_adds(model, args.resolution)
    print(f"MobileNetV1 width {args.width} resolution {args.resolution}: "
          f"{params:,} parameters ({params / 1e6:.2f} M), {macs:,} multiply-adds ({macs / 1e6:.0f} M)")


if __name__ == "__main__":
    main()
