"""Train or evaluate MobileNetV1: python train.py [--config X.yaml] [flags] [key.sub=value ...]"""
import argparse
import sys
from pathlib import Path

from mobilenet.config import FLAGS, build_config, resolve
from mobilenet.errors import exit_code

CONFIGS = Path(__file__).resolve().parent / "configs"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", help="YAML config (default: demo.yaml without --data, "
                   "synthetic.yaml with --data synthetic, imagenet.yaml with a folder)")
    p.add_argument("--optimizer", choices=["standard", "fused"], help="optim.impl")
    p.add_argument("--data", help="ImageFolder root with train/ and val/, 'synthetic' or 'digits'")
    p.add_argument("--device", choices=["auto", "npu", "cuda", "cpu"])
    p.add_argument("--amp", choices=["O0", "O1", "O2"], help="amp.level")
    p.add_argument("--epochs", type=int, help="train.epochs")
    p.add_argument("--output", help="run directory (default runs/<config>-<optimizer>)")
    p.add_argument("--resume", help="checkpoint to resume from, or 'auto' for the newest in --output")
    p.add_argument("--evaluate", action="store_true",
                   help="only evaluate (weights from --resume or model.pretrained)")
    p.add_argument("--profile", action="store_true", default=None,
                   help="write a profiler trace of a few steps to <output>/profile (TensorBoard)")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="any config setting")
    return p.parse_intermixed_args(argv)


def default_config(data):
    if data is None or data == "digits":
        return CONFIGS / "demo.yaml"
    return CONFIGS / ("synthetic.yaml" if data == "synthetic" else "imagenet.yaml")


def config_from_args(args):
    """The resolved config: the recipe, the flags, then the key=value overrides."""
    config_path = Path(args.config) if args.config else default_config(args.data)
    flag_values = {key: getattr(args, flag.removeprefix("--")) for key, flag in FLAGS.items()}
    settings = {key: value for key, value in flag_values.items() if value is not None}
    return resolve(build_config(config_path, args.overrides, settings), name=config_path.stem)


def main(argv=None):
    args = parse_args(argv)

    def train():
        cfg = config_from_args(args)
        from mobilenet.engine import run  # the engine loads after the config is known to be valid
        run(cfg, resume=args.resume, evaluate_only=args.evaluate)
    return exit_code(train)


if __name__ == "__main__":
    sys.exit(main())
