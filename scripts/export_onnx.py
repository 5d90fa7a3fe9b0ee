"""Exports a checkpoint to ONNX with the Ascend ModelZoo names.

python scripts/export_onnx.py --checkpoint X --output model.onnx [--resolution 224] [--dynamic-batch]
Input `actual_input_1` (N x 3 x R x R, normalised RGB), output `output1` (N x classes), opset 11.
"""
import argparse
import sys

import package  # noqa: F401  (the mobilenet package, or one line that says how to run this)
from mobilenet.errors import exit_code


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--resolution", type=int, default=224)
    p.add_argument("--opset", type=int, default=11)
    p.add_argument("--dynamic-batch", action="store_true", help="batch dimension left free")
    args = p.parse_args(argv)

    def write():
        export(args)
        print(f"wrote {args.output}")
    return exit_code(write)


def export(args):
    import torch

    from mobilenet.checkpoint import load_checkpoint
    from mobilenet.model import model_from_checkpoint

    net = model_from_checkpoint(load_checkpoint(args.checkpoint), args.checkpoint).float().eval()
    dummy = torch.randn(1, 3, args.resolution, args.resolution)
    batch = {0: "batch"}
    dynamic = {"actual_input_1": batch, "output1": batch} if args.dynamic_batch else None
    torch.onnx.export(net, (dummy,), args.output, input_names=["actual_input_1"],
                      output_names=["output1"], opset_version=args.opset, dynamic_axes=dynamic,
                      dynamo=False)


if __name__ == "__main__":
    sys.exit(main())
