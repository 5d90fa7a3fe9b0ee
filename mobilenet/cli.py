"""train.py's command line: its own flags, the flags of pytorch/examples' imagenet/main.py and of
Ascend ModelZoo's MobileNetV1 main.py (each mapped to the setting with the meaning it has there),
the data folder as a positional argument, and ``key.sub=value`` settings; into a resolved config.

Layers, later winning: the recipe (--config), then flags, then ``key.sub=value``. A flag and a
``key.sub=value`` (or two flags) that set one setting to different values are a UsageError.
"""
import argparse
import os
import re
from pathlib import Path

import torch

from mobilenet.amp import LEVELS
from mobilenet.config import CHOICES, FLAGS, build_config, coerce_setting, parse_override, resolve
from mobilenet.device import DEVICES
from mobilenet.dialects import add_dialect_flags, dialect_settings, modelzoo_ranks, node_processes
from mobilenet.errors import UsageError

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")

class OneLineParser(argparse.ArgumentParser):
    """argparse's own errors (an unknown flag, a bad value) as one line, like every other error."""

    def error(self, message):
        raise UsageError(f"{message} (python train.py --help lists the flags)")


def build_parser(description=None):
    p = OneLineParser(description=description, allow_abbrev=False)  # no flag is reached by a prefix
    p.add_argument("--config", help="YAML config (default: demo.yaml without --data, "
                   "synthetic.yaml with --data synthetic, imagenet.yaml with a folder)")
    p.add_argument("--optimizer", choices=sorted(CHOICES["optim.impl"], reverse=True),  # standard, fused
                   help="optim.impl")
    p.add_argument("--data", help="an ImageFolder root with train/ and val/, a prepared set of one "
                   "(scripts/prepare_data.py), 'synthetic' or 'digits'")
    p.add_argument("--device", choices=DEVICES)
    p.add_argument("--amp", choices=LEVELS, help="amp.level")
    p.add_argument("--epochs", type=int, help="train.epochs")
    p.add_argument("--grad-accum-steps", type=int, metavar="N",
                   help="forwards of data.batch_size per process and optimizer step (train.grad_accum_steps)")
    p.add_argument("--output", help="run directory (default runs/<config>-<optimizer>)")
    p.add_argument("--resume", help="checkpoint to resume from, or 'auto' for the newest in --output")
    p.add_argument("--start-over", action="store_true",
                   help="train from scratch in an --output that holds a run, removing its files")
    p.add_argument("-e", "--evaluate", action="store_true",
                   help="only evaluate (weights from --resume or model.pretrained)")
    p.add_argument("--compile", action="store_true", default=None,
                   help="torch.compile the model's forward and backward and the optimizer's step (not "
                        "torch_npu's NpuFused* step) (train.compile=true)")
    p.add_argument("--profile", action="store_true", default=None,
                   help="write a profiler trace of a few steps to <output>/profile (TensorBoard)")
    p.add_argument("positionals", nargs="*", metavar="DIR | key.sub=value",
                   help="the data folder (as main.py DIR; same as --data), and any config setting")
    add_dialect_flags(p)
    return p


def split_positionals(positionals):
    """(data folder or None, key.sub=value overrides): a positional without '=' is the folder."""
    overrides = [p for p in positionals if OVERRIDE.match(p)]
    folders = [p for p in positionals if not OVERRIDE.match(p)]
    if len(folders) > 1:
        raise UsageError(f"one data folder at most, got {' '.join(folders)} (settings are key.sub=value)")
    return (folders[0] if folders else None), overrides


def default_config(data):
    """The recipe of data.path's source (mobilenet.data.sources); the demo without a path."""
    from mobilenet.data.sources import source_of
    return CONFIGS / f"{source_of(data or 'digits').recipe}.yaml"


def flag_settings(args, folder, processes):
    """{setting: (value, origin)} from every flag and the positional folder, and the notes; two
    flags that set one setting to different values are a UsageError."""
    sources = [(flag, {key: getattr(args, flag.removeprefix("--").replace("-", "_"))}, None)
               for key, flag in FLAGS.items()]
    sources.append(("DIR (positional)", {"data.path": folder}, None))
    sources += dialect_settings(args, processes)
    chosen, notes = {}, []
    for origin, settings, note in sources:
        for key, value in settings.items():
            if value is None:
                continue
            value = coerce_setting(key, value, origin)
            if key in chosen and chosen[key][0] != value:
                hint = (f" (a setting is key.sub=value: '{value}' reads as the data folder)"
                        if origin == "DIR (positional)" else "")
                raise UsageError(f"{chosen[key][1]} {chosen[key][0]!r} and {origin} {value!r} contradict each "
                                 f"other ({key}); give one{hint}")
            chosen[key] = (value, origin)
        if note:
            notes.append(note)
    return chosen, notes


def check_overrides(chosen, overrides):
    """A key.sub=value that contradicts a flag given for the same setting is a UsageError (a value a
    flag only implies, such as --apex's loss scale, gives way)."""
    for text in overrides:
        key, value = parse_override(text)
        if key in chosen and not chosen[key][1].endswith("(implied)"):
            value = coerce_setting(key, value, f"override '{text}'")
            if value != chosen[key][0]:
                raise UsageError(f"{chosen[key][1]} and {text} contradict each other; give one")


def config_from_args(args, probe=True):
    """The resolved config: the recipe, the flags, then the key=value overrides. Under --distributed
    this process's rank goes into its environment first (as torchrun would put it)."""
    folder, overrides = split_positionals(args.positionals)
    ranks = modelzoo_ranks(args, os.environ)
    if ranks:
        os.environ.update(ranks[0])
        if "OMP_NUM_THREADS" in ranks[0]:
            torch.set_num_threads(int(ranks[0]["OMP_NUM_THREADS"]))
    chosen, notes = flag_settings(args, folder, node_processes())
    notes = ([ranks[1]] if ranks else []) + notes
    check_overrides(chosen, overrides)
    data = chosen.get("data.path", (None,))[0]
    config_path = Path(args.config) if args.config else default_config(data)
    settings = {key: value for key, (value, _) in chosen.items()}
    return resolve(build_config(config_path, overrides, settings), name=config_path.stem,
                   command_line=notes, probe=probe)
