"""A prepared dataset: an ImageFolder (train/ and val/) written once, by scripts/prepare_data.py,
into a few large files that the loader's workers read by memory map (no file opened per image).
Each image is re-encoded as a baseline JPEG with 4:2:0 chroma, its longer side at most
``max_side`` (training) or its shorter side down to ``val_short_side`` (validation), which decodes
far cheaper than ImageNet's own large, 4:4:4 files. The samples keep the folder's classes,
labels, names and order, so the app's per-sample seeds draw the same crops (of the smaller image);
an image the preparation could not read is kept as an entry that the loader reports as it reports
an unreadable file.

DST/prepared.json              what it holds and how it was made; written last, so a DST without it
                               is a preparation that did not finish (it does not train)
DST/<split>-NNNNN.jpegs        the JPEG bytes of up to SHARD images, back to back
DST/<split>-NNNNN.index.npz    per image: offset and length in the .jpegs (0: unreadable at
                               preparation), label; the names (relative to the source split) and
                               the reasons of the unreadable ones, NUL-separated bytes
"""
import json
import mmap
import os
import time
from pathlib import Path

import numpy
import simplejpeg
import torch

from mobilenet.data.decode import EncodedImage, largest_reduction, resize
from mobilenet.data.datasets import ImageFolderRGB, ImageSamples, image_folder, same_classes, usable_cores
from mobilenet.errors import UsageError

MANIFEST = "prepared.json"
RECIPE = ".recipe.json"  # the source and settings of a preparation under way (a rerun continues it)
SHARD = 4096             # images per shard file: a rerun redoes at most one
FORMAT = 1


def is_prepared(path):
    return holds(path, MANIFEST)


def is_unfinished(path):
    """A preparation that was stopped before its end (it does not train)."""
    return holds(path, RECIPE) and not is_prepared(path)


def holds(path, name):
    """Whether folder ``path`` holds file ``name`` (a path the system refuses: no; the folder's own
    check says why)."""
    try:
        return (Path(path) / name).is_file()
    except OSError:
        return False


def manifest(root):
    """DST/prepared.json, or a UsageError naming DST."""
    try:
        return json.loads((Path(root) / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--data {root}: {MANIFEST} is unreadable ({type(e).__name__}); prepare it again "
                         f"with scripts/prepare_data.py") from None


class PreparedImages(ImageSamples):
    """One split of a prepared dataset, as ImageFolderRGB gives a folder's."""

    def __init__(self, root, split, transform, strict=False, leave_out=None, cache_mb=0):
        about = manifest(root)
        self.root = str(Path(about["source"]) / split)  # names and warnings as the folder's
        self.settings, described = about["settings"], about["splits"][split]
        self.classes = described["classes"]
        self.shards = [Path(root) / name for name in described["shards"]]
        offsets, lengths, labels, self.names, self.reasons = [], [], [], [], {}
        for shard, path in enumerate(self.shards):
            index = numpy.load(path.with_suffix(".index.npz"))
            first = sum(map(len, offsets))
            offsets.append(index["offsets"])
            lengths.append(index["lengths"])
            labels.append(index["labels"])
            self.names += bytes(index["names"]).split(b"\0")
            reasons = bytes(index["reasons"]).split(b"\0") if len(index["reasons"]) else []
            for position, reason in zip(numpy.flatnonzero(index["lengths"] == 0), reasons):
                self.reasons[first + int(position)] = reason.decode(errors="replace")
        self.offsets, self.lengths = numpy.concatenate(offsets), numpy.concatenate(lengths)
        self.shard_of = numpy.concatenate([numpy.full(len(o), i) for i, o in enumerate(offsets)])
        self.targets = numpy.concatenate(labels).tolist()
        self.samples = [(os.path.join(self.root, os.fsdecode(name)), label)
                        for name, label in zip(self.names, self.targets)]
        self.maps = {}  # shard -> memory map, opened in each process that reads (after the fork)
        self.keep(transform, strict, leave_out, cache_mb)

    def read(self, index):
        if not self.lengths[index]:
            raise OSError(f"unreadable when the set was prepared: {self.reasons.get(index, 'no reason kept')}")
        shard = int(self.shard_of[index])
        if shard not in self.maps:
            with open(self.shards[shard], "rb") as f:
                self.maps[shard] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        start = int(self.offsets[index])
        return EncodedImage(self.maps[shard][start:start + int(self.lengths[index])])

    def __getstate__(self):  # the maps open again in each worker
        return {**self.__dict__, "maps": {}}

    def record_lines(self):
        made = {key: value for key, value in self.settings.items() if key != "shard"}  # how, not how split up
        yield f"prepared {json.dumps(made, sort_keys=True)}\n".encode()
        yield from super().record_lines()


def prepared_datasets(root, train_transform, val_transform, data, leave_out):
    return (PreparedImages(root, "train", train_transform, data["strict"], cache_mb=data["cache_mb"]),
            PreparedImages(root, "val", val_transform, data["strict"], leave_out, data["cache_mb"]))


def train_images(root):
    return manifest(root)["splits"]["train"]["images"]


# Writing one.

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
        image = EncodedImage(Path(path).read_bytes())
        height, width = target_size(image.height, image.width, split, settings)
        pixels = image.decode(largest_reduction(image.height, image.width, min(height, width)))
        if pixels.shape[1:] != (height, width):
            pixels = resize(pixels, height, width)
        return simplejpeg.encode_jpeg(pixels.permute(1, 2, 0).contiguous().numpy(), quality=settings["quality"],
                                      colorsubsampling="420"), ""
    except Exception as e:  # noqa: BLE001  decoders raise many types: this file's problem, kept as such
        return b"", f"{type(e).__name__}: {e}"[:300]


def write_shard(path, results, labels, names):
    """The shard's .jpegs, then its index (whose presence says the shard is whole), each written
    through a temporary name."""
    lengths = numpy.array([len(data) for data, _ in results], dtype=numpy.uint32)
    offsets = numpy.concatenate([[0], numpy.cumsum(lengths[:-1], dtype=numpy.uint64)]).astype(numpy.uint64)
    reasons = b"\0".join(reason.encode() for data, reason in results if not data)
    for final, write in ((path, lambda f: [f.write(data) for data, _ in results]),
                         (path.with_suffix(".index.npz"), lambda f: numpy.savez(
                             f, offsets=offsets, lengths=lengths, labels=numpy.array(labels, dtype=numpy.int64),
                             names=numpy.frombuffer(b"\0".join(names), dtype=numpy.uint8),
                             reasons=numpy.frombuffer(reasons, dtype=numpy.uint8)))):
        temporary = final.with_name(final.name + ".tmp")
        with open(temporary, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, final)
    return int(lengths.sum()), int((lengths == 0).sum())


def check_destination(dst, recipe):
    """A DST that holds nothing, or this same preparation (finished or not), is taken; anything
    else is a UsageError."""
    if not dst.exists():
        return
    if not dst.is_dir():
        raise UsageError(f"{dst}: not a folder; pass a new folder for the prepared set")
    if (dst / RECIPE).is_file():
        try:
            before = json.loads((dst / RECIPE).read_text())
        except (OSError, ValueError):
            before = None
        if before != recipe:
            raise UsageError(f"{dst} holds a preparation of another source or with other settings ({before}); "
                             f"remove it or pass another folder")
        return
    if any(dst.iterdir()):
        raise UsageError(f"{dst}: not empty and not a prepared set; pass a new or empty folder")


def prepare(src, dst, *, max_side=384, val_short_side=256, quality=90, workers=None, say=print, shard=SHARD):
    """Writes the prepared set of ImageFolder ``src`` into ``dst`` (see the module doc); a
    preparation that was stopped continues where its shards end (of ``shard`` images). Returns the
    manifest."""
    src, dst = Path(src).resolve(), Path(dst)
    settings = {"max_side": max_side, "val_short_side": val_short_side, "quality": quality, "format": FORMAT,
                "shard": shard}
    recipe = {"source": str(src), "settings": settings}
    splits = {name: image_folder(src, name, transform=None, strict=False, flag="SRC") for name in ("train", "val")}
    same_classes(splits["train"], splits["val"], f"SRC {src}")
    check_destination(dst, recipe)
    if is_prepared(dst):
        say(f"{dst} is prepared already (its {MANIFEST}); nothing to do")
        return manifest(dst)
    dst.mkdir(parents=True, exist_ok=True)
    (dst / RECIPE).write_text(json.dumps(recipe))
    described = {name: prepare_split(folder, name, dst, settings, workers, say, shard)
                 for name, folder in splits.items()}
    result = {"format": FORMAT, "source": str(src), "settings": settings, "splits": described,
              "bytes": sum(split["bytes"] for split in described.values())}
    temporary = dst / (MANIFEST + ".tmp")
    temporary.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(temporary, dst / MANIFEST)
    return result


def prepare_split(folder: ImageFolderRGB, split, dst, settings, workers, say, shard):
    """The shards of one split, in parallel over ``workers`` processes (the usable cores), with a
    progress line; shards already whole are kept."""
    from multiprocessing import get_context

    samples, shards = folder.samples, []
    total_bytes = unreadable = 0
    start, done = time.monotonic(), 0
    with get_context("fork").Pool(workers or usable_cores(), initializer=torch.set_num_threads, initargs=(1,)) as pool:
        for first in range(0, len(samples), shard):
            part = samples[first:first + shard]
            path = dst / f"{split}-{first // shard:05d}.jpegs"
            shards.append(path.name)
            if path.with_suffix(".index.npz").is_file():  # whole from an earlier run
                index = numpy.load(path.with_suffix(".index.npz"))
                total_bytes += int(index["lengths"].sum())
                unreadable += int((index["lengths"] == 0).sum())
                done += len(part)
                continue
            results = []
            for result in pool.imap(reencode, [(p, split, settings) for p, _ in part], chunksize=16):
                results.append(result)
                done += 1
                if done % 256 == 0 or done == len(samples):
                    progress(say, split, done, len(samples), time.monotonic() - start)
            names = [os.fsencode(os.path.relpath(p, folder.root)) for p, _ in part]
            written, bad = write_shard(path, results, [label for _, label in part], names)
            total_bytes, unreadable = total_bytes + written, unreadable + bad
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

