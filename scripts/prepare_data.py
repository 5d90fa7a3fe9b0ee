"""Prepare an ImageFolder (SRC/train and SRC/val) for fast training: python scripts/prepare_data.py SRC DST

Writes DST: every image re-encoded as a baseline JPEG with 4:2:0 chroma, training images with
their longer side at most --max-side, validation images with their shorter side down to
--val-short-side, in a few large files that the loader reads by memory map (mobilenet/data/prepared.py).
Train from it with --data DST, as from the folder: the same classes, labels and sample order.
Runs in parallel over the usable cores. Stopped at any moment (Ctrl-C, SIGTERM), it leaves DST
without its prepared.json, which does not train; the same command again continues from the last
whole shard, and mends a set that SRC no longer matches or whose files were damaged.
"""
import argparse
import signal
import sys

import package  # noqa: F401  (the mobilenet package, or one line that says how to run this)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC", help="an ImageFolder root with train/ and val/")
    p.add_argument("dst", metavar="DST", help="the prepared set's folder (new, or this same preparation)")
    p.add_argument("--max-side", type=int, default=384, help="training images' longer side at most (384)")
    p.add_argument("--val-short-side", type=int, default=256, help="validation images' shorter side (256)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality (90)")
    p.add_argument("--workers", type=int, help="processes (default: the usable cores)")
    args = p.parse_args(argv)
    for name, value, low, high in (("--max-side", args.max_side, 32, 10000),
                                   ("--val-short-side", args.val_short_side, 32, 10000),
                                   ("--quality", args.quality, 1, 100), ("--workers", args.workers or 1, 1, 4096)):
        if not low <= value <= high:
            print(f"error: {name} {value}: give {low} to {high}", file=sys.stderr)
            return 2
    from mobilenet.errors import stop_signals
    for stop in stop_signals():  # train.py's: SIGINT too where a shell's background job ignored it,
        signal.signal(stop, interrupt)  # SIGHUP not under nohup; the shards written so far stay
    try:
        return prepare(args)
    except KeyboardInterrupt as e:
        signum = e.args[0] if isinstance(e, Stopped) else signal.SIGINT
        print(f"\n{signal.Signals(signum).name}: stopped: {args.dst} is not prepared yet (no prepared.json: it "
              f"does not train); the same command continues from its last whole shard", file=sys.stderr)
        return 128 + signum  # as train.py's: 128 + the signal's number


class Stopped(KeyboardInterrupt):
    """A stop signal, raised as Ctrl-C is, with its number (args[0]) for the exit code."""


def interrupt(signum, frame):
    raise Stopped(signum)


def prepare(args):
    from mobilenet.data.prepared import prepare as write
    from mobilenet.errors import TrainingFailure, UsageError

    def say(line, end="\n"):
        print(line, end=end, file=sys.stderr, flush=True)
    try:
        result = write(args.src, args.dst, max_side=args.max_side, val_short_side=args.val_short_side,
                       quality=args.quality, workers=args.workers, say=say)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TrainingFailure as e:
        print(f"\nerror: {e}", file=sys.stderr)
        return 1
    splits = result["splits"]
    print(f"prepared {args.dst}: {splits['train']['images']} train / {splits['val']['images']} val images "
          f"({splits['train']['unreadable'] + splits['val']['unreadable']} unreadable, kept as such), "
          f"{result['bytes'] / 2**20:,.1f} MiB; train with --data {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
