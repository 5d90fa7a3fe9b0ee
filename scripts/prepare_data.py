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
import collections
import json
import multiprocessing
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import package  # noqa: F401  (the mobilenet package, or one line that says how to run this)
import numpy
import simplejpeg
import torch

from mobilenet.data.datasets import ImageFolderRGB, image_folder, read_regular_file, same_classes
from mobilenet.data.prepared import FORMAT, MANIFEST, RECIPE, index_problem, is_prepared, manifest_problem
from mobilenet.data.datasets import EncodedImage
from mobilenet.data.transforms import largest_reduction, resize
from mobilenet.device import usable_cores
from mobilenet.errors import STOP_SIGNALS, TrainingFailure, UsageError, stop_signals


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
    for stop in stop_signals():  # train.py's: SIGINT too where a shell's background job ignored it,
        signal.signal(stop, interrupt)  # SIGHUP not under nohup; the shards written so far stay
    try:
        return command(args)
    except KeyboardInterrupt as e:
        signum = e.args[0] if isinstance(e, Stopped) else signal.SIGINT
        print(f"\n{signal.Signals(signum).name}: stopped: {args.dst} is not prepared yet (no prepared.json: it "
              f"does not train); the same command continues from its last whole shard", file=sys.stderr)
        return 128 + signum  # as train.py's: 128 + the signal's number


class Stopped(KeyboardInterrupt):
    """A stop signal, raised as Ctrl-C is, with its number (args[0]) for the exit code."""


def interrupt(signum, frame):
    raise Stopped(signum)


def command(args):
    def say(line, end="\n"):
        print(line, end=end, file=sys.stderr, flush=True)
    try:
        result = prepare(args.src, args.dst, max_side=args.max_side, val_short_side=args.val_short_side,
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



# The writer: what scripts/prepare_data.py SRC DST does (the reader: mobilenet/data/prepared.py)

SHARD = 4096  # images per shard file: a rerun redoes at most one


def target_size(height, width, split, settings):
    """(height, width) an image is stored at: train's longer side at most max_side, val's shorter
    side down to val_short_side; never enlarged."""
    if split == "train":
        scale = min(1.0, settings["max_side"] / max(height, width))
    else:
        scale = min(1.0, settings["val_short_side"] / min(height, width))
    return max(1, round(height * scale)), max(1, round(width * scale))


def reencode(job):
    """(JPEG bytes, '') of one source image at its stored size, or (b'', reason) when it cannot be
    read. Decoded at the smallest reduced scale that still covers the size."""
    path, split, settings = job
    try:
        image = EncodedImage(read_regular_file(path))  # a FIFO is unreadable, not a wait
        height, width = target_size(image.height, image.width, split, settings)
        pixels = image.decode(largest_reduction(image.height, image.width, min(height, width)))
        if pixels.shape[1:] != (height, width):
            pixels = resize(pixels, height, width)
        return simplejpeg.encode_jpeg(pixels.permute(1, 2, 0).contiguous().numpy(), quality=settings["quality"],
                                      colorsubsampling="420"), ""
    except Exception as e:  # noqa: BLE001  decoders raise many types: this file's problem, kept as such
        return b"", f"{type(e).__name__}: {e}"[:300]


def reencode_all(jobs):
    return [reencode(job) for job in jobs]


def in_order(pool, function, jobs, chunk=16):
    """``function(chunk of jobs)``'s results one by one, in order, computed in ``pool`` with a few
    chunks queued ahead. (Executor.map cancels its futures when left early, and Python 3.11's pool
    then fails on them in a thread of its own: nothing queued here is ever cancelled.)"""
    queued, ahead = collections.deque(), 2 * pool._max_workers
    for first in range(0, len(jobs), chunk):
        queued.append(pool.submit(function, jobs[first:first + chunk]))
        if len(queued) > ahead:
            yield from queued.popleft().result()
    while queued:
        yield from queued.popleft().result()


def write_atomic(final, write):
    """``write(file)`` to a temporary name, fsync, then the final name; a failure leaves no
    temporary file and is a TrainingFailure that says what to do."""
    temporary = final.with_name(final.name + ".tmp")
    try:
        with open(temporary, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, final)
    except OSError as e:
        temporary.unlink(missing_ok=True)
        raise TrainingFailure(f"{final}: cannot write ({e.strerror or e}); the whole shards written before "
                              f"stay: free some space (or fix the folder) and run the same command again to "
                              f"continue") from None


def write_shard(path, results, labels, names):
    """The shard's .jpegs, then its index (whose presence says the shard is whole)."""
    lengths = numpy.array([len(data) for data, _ in results], dtype=numpy.uint32)
    offsets = numpy.concatenate([[0], numpy.cumsum(lengths[:-1], dtype=numpy.uint64)]).astype(numpy.uint64)
    reasons = b"\0".join(reason.encode() for data, reason in results if not data)
    write_atomic(path, lambda f: [f.write(data) for data, _ in results])
    write_atomic(path.with_suffix(".index.npz"), lambda f: numpy.savez(
        f, offsets=offsets, lengths=lengths, labels=numpy.array(labels, dtype=numpy.int64),
        names=numpy.frombuffer(b"\0".join(names), dtype=numpy.uint8),
        reasons=numpy.frombuffer(reasons, dtype=numpy.uint8)))
    return int(lengths.sum()), int((lengths == 0).sum())


def our_files(dst):
    """The files a preparation writes in ``dst`` (shards, indexes, temporaries, manifest, recipe)."""
    return [path for path in dst.iterdir() if path.name in (MANIFEST, RECIPE) or path.name.endswith(
        (".jpegs", ".index.npz", ".tmp"))]


def take_destination(dst, recipe, say):
    """Makes ``dst`` ready for ``recipe`` (SRC and settings): new, or this same preparation, kept
    (its shards are checked as they are met). A folder of anything else is a UsageError."""
    if dst.exists() and not dst.is_dir():
        raise UsageError(f"DST {dst}: not a folder; pass a new folder for the prepared set")
    if dst.is_dir() and (dst / RECIPE).is_file():
        try:
            before = json.loads((dst / RECIPE).read_text())
        except (OSError, ValueError):
            before = None
        if isinstance(before, dict) and before.get("source") == recipe["source"]:
            if before.get("settings") == recipe["settings"]:
                return
            raise UsageError(f"DST {dst} holds a preparation of SRC with other settings ({before.get('settings')}); "
                             f"give those, or remove DST, or pass another folder")
        if before is not None:
            raise UsageError(f"DST {dst} holds a preparation of another source ({before.get('source')}); remove "
                             f"it or pass another folder")
        say(f"{dst / RECIPE} is unreadable: the preparation starts again")
        for path in our_files(dst):
            path.unlink()
    elif dst.is_dir() and any(dst.iterdir()):
        raise UsageError(f"DST {dst}: not empty and not a prepared set; pass a new or empty folder")
    try:
        dst.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"DST {dst}: cannot make the folder ({e.strerror})") from None
    write_atomic(dst / RECIPE, lambda f: f.write(json.dumps(recipe).encode()))


def prepare(src, dst, *, max_side=384, val_short_side=256, quality=90, workers=None, say=print, shard=SHARD):
    """Writes (or completes, or mends) the prepared set of ImageFolder ``src`` in ``dst`` (see the
    module doc); returns its manifest."""
    src, dst = Path(src).resolve(), Path(dst)
    if dst.resolve() == src or dst.resolve().is_relative_to(src):
        raise UsageError(f"DST {dst}: inside SRC {src}, whose class folders it would change; pass a folder "
                         f"outside SRC")
    settings = {"max_side": max_side, "val_short_side": val_short_side, "quality": quality, "format": FORMAT,
                "shard": shard}
    splits = {name: image_folder(src, name, transform=None, strict=False, flag="SRC") for name in ("train", "val")}
    same_classes(splits["train"], splits["val"], f"SRC {src}")
    take_destination(dst, {"source": str(src), "settings": settings}, say)
    finished = finished_manifest(dst)
    with stopped_pool(workers or usable_cores()) as pool:
        described = {name: prepare_split(folder, name, dst, settings, pool, say, shard)
                     for name, folder in splits.items()}
    result = {"format": FORMAT, "source": str(src), "settings": settings, "splits": described,
              "bytes": sum(split["bytes"] for split in described.values())}
    if result == finished and is_prepared(dst):
        say(f"{dst} is prepared already and holds what SRC holds; nothing to do")
        return result
    write_atomic(dst / MANIFEST, lambda f: f.write((json.dumps(result, indent=2) + "\n").encode()))
    return result


def finished_manifest(dst):
    """DST's prepared.json where it is whole (else None): a rerun that finds the same writes nothing."""
    if not is_prepared(dst):
        return None
    try:
        about = json.loads((dst / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return about if not manifest_problem(about) else None


class stopped_pool:
    """A process pool whose workers ignore the stop signals (the main process stops and ends them,
    so a Ctrl-C prints no worker's traceback) and which, left on an error or a stop, kills its
    workers instead of waiting for what they have queued."""

    def __init__(self, workers):
        self.others = set(multiprocessing.active_children())  # this process's children before the pool's
        self.executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                            initializer=quiet_worker)

    def __enter__(self):
        return self.executor

    def __exit__(self, kind, error, trace):
        if kind is None:
            self.executor.shutdown(wait=True)
            return
        for worker in set(multiprocessing.active_children()) - self.others:
            worker.kill()  # first: the pool then fails what is queued, which a cancel races with
        self.executor.shutdown(wait=True)
        if kind is BrokenProcessPool:
            raise TrainingFailure("a worker process of the preparation died (killed, or out of memory?); the "
                                  "whole shards written before stay: run the same command again to continue") from None


def quiet_worker():
    torch.set_num_threads(1)
    for stop in STOP_SIGNALS:
        signal.signal(stop, signal.SIG_IGN)


def shard_matches(path, part, root):
    """'' when shard ``path`` is whole and holds ``part`` ([(file, label)] of SRC now), else why not."""
    index_path = path.with_suffix(".index.npz")
    if not index_path.is_file():
        return "not written"
    try:
        with numpy.load(index_path) as loaded:
            index = {key: loaded[key] for key in ("offsets", "lengths", "labels", "names")}
        problem = index_problem(index, path.stat().st_size)
    except (OSError, ValueError, KeyError, EOFError) as e:
        return f"unreadable ({type(e).__name__})"
    if problem:
        return problem
    names = [os.fsencode(os.path.relpath(p, root)) for p, _ in part]
    if bytes(index["names"]).split(b"\0") != names or index["labels"].tolist() != [label for _, label in part]:
        return "SRC's files or labels there changed"
    return ""


def prepare_split(folder: ImageFolderRGB, split, dst, settings, pool, say, shard):
    """The shards of one split, re-encoded in ``pool``, with a progress line; a whole shard that
    holds what SRC holds now is kept, any other written again (said); shards past SRC's end go."""
    samples, shards = folder.samples, []
    total_bytes = unreadable = 0
    start, done = time.monotonic(), 0
    for first in range(0, len(samples), shard):
        part = samples[first:first + shard]
        path = dst / f"{split}-{first // shard:05d}.jpegs"
        shards.append(path.name)
        why = shard_matches(path, part, folder.root)
        if not why:
            with numpy.load(path.with_suffix(".index.npz")) as index:
                total_bytes += int(index["lengths"].sum())
                unreadable += int((index["lengths"] == 0).sum())
            done += len(part)
            continue
        (dst / MANIFEST).unlink(missing_ok=True)  # from here on DST is not a finished set
        if why != "not written":
            say(f"{path.name}: {why}; written again")
        results = []
        for result in in_order(pool, reencode_all, [(p, split, settings) for p, _ in part]):
            results.append(result)
            done += 1
            if done % 256 == 0 or done == len(samples):
                progress(say, split, done, len(samples), time.monotonic() - start)
        names = [os.fsencode(os.path.relpath(p, folder.root)) for p, _ in part]
        written, bad = write_shard(path, results, [label for _, label in part], names)
        total_bytes, unreadable = total_bytes + written, unreadable + bad
    for stale in sorted(dst.glob(f"{split}-*")):  # SRC holds fewer images than when they were written
        if stale.name.split(".")[0] + ".jpegs" not in shards:
            (dst / MANIFEST).unlink(missing_ok=True)
            stale.unlink()
    say("")  # the progress line ends
    return {"images": len(samples), "unreadable": unreadable, "bytes": total_bytes,
            "classes": folder.classes, "shards": shards}


def progress(say, split, done, total, seconds):
    """One progress line, written over the last (a carriage return, no newline)."""
    width = 30
    filled = width * done // max(total, 1)
    rate = done / seconds if seconds > 0 else 0.0
    left = (total - done) / rate if rate else 0.0
    say(f"\r{split}: [{'#' * filled}{'.' * (width - filled)}] {done}/{total} images, {rate:.0f} img/s, "
        f"{left / 60:.1f} min left", end="")


if __name__ == "__main__":
    from mobilenet.distributed import exit_process
    exit_process(main())  # as train.py: without the interpreter's teardown
