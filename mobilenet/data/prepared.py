"""A prepared dataset: an ImageFolder re-encoded once (scripts/prepare_data.py) as baseline 4:2:0
JPEGs, train's longer side at most ``max_side``, val's shorter side down to ``val_short_side``, in
a few large files read by memory map. The folder's classes, labels, names and order are kept.

DST/prepared.json            what it holds and how it was made; written last (without it: unfinished)
DST/<split>-NNNNN.jpegs      the JPEG bytes of up to 4096 images, back to back
DST/<split>-NNNNN.index.npz  per image: offset, length (0: unreadable then), label; the names and
                             the unreadable ones' reasons as NUL-separated bytes
"""

import json
import mmap
import os
from pathlib import Path

import numpy

from mobilenet.data.datasets import EncodedImage, ImageSamples
from mobilenet.errors import UsageError

MANIFEST = "prepared.json"
RECIPE = ".recipe.json"  # the source and settings of a preparation under way (a rerun continues it)
FORMAT = 1
INDEX_KEYS = ("offsets", "lengths", "labels", "names", "reasons")


def is_prepared(path):
    return holds(path, MANIFEST)


def is_unfinished(path):
    """A preparation that was stopped before its end (it does not train)."""
    return holds(path, RECIPE) and not is_prepared(path)


def holds(path, name):
    """Whether folder ``path`` holds file ``name`` (a path the system refuses: no)."""
    try:
        return (Path(path) / name).is_file()
    except OSError:
        return False


def redo(root):
    """The command that completes or mends the prepared set ``root`` (its SRC from its recipe)."""
    try:
        source = json.loads((Path(root) / RECIPE).read_text())["source"]
    except (OSError, ValueError, KeyError, TypeError):
        source = "SRC"
    return f"python scripts/prepare_data.py {source} {root}"


def damaged(root, name, why):
    return UsageError(f"--data {root}: {Path(root) / name} is damaged ({why}); run {redo(root)} to redo it")


def manifest(root):
    """DST/prepared.json, checked; a UsageError naming the file (or the unfinished preparation)."""
    if is_unfinished(root):
        raise UsageError(f"--data {root}: its preparation did not finish (no {MANIFEST}); run {redo(root)} "
                         f"to complete it")
    try:
        about = json.loads((Path(root) / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise damaged(root, MANIFEST, f"unreadable: {type(e).__name__}") from None
    problem = manifest_problem(about)
    if problem:
        raise damaged(root, MANIFEST, problem)
    return about


def manifest_problem(about):
    """What is missing from a prepared.json, or ''."""
    if not isinstance(about, dict) or about.get("format") != FORMAT:
        return f"not a format {FORMAT} description"
    if not isinstance(about.get("source"), str) or not isinstance(about.get("settings"), dict):
        return "no 'source' or 'settings'"
    if not {"max_side", "val_short_side", "quality"} <= about["settings"].keys():
        return "its settings are incomplete"
    for split in ("train", "val"):
        described = about.get("splits", {}).get(split) if isinstance(about.get("splits"), dict) else None
        if not (isinstance(described, dict) and isinstance(described.get("classes"), list)
                and isinstance(described.get("shards"), list) and isinstance(described.get("images"), int)):
            return f"no whole description of '{split}'"
    return ""


def read_index(root, shard):
    """The index of ``shard`` (a .jpegs file's name), checked against it; a UsageError names a damaged file."""
    path = Path(root) / shard
    index_path = path.with_suffix(".index.npz")
    try:
        with numpy.load(index_path) as loaded:
            index = {key: loaded[key] for key in INDEX_KEYS}
        size = path.stat().st_size
    except FileNotFoundError as e:
        raise damaged(root, Path(e.filename).name, "missing") from None
    except (OSError, ValueError, KeyError, EOFError) as e:  # a truncated or foreign .npz among them
        raise damaged(root, index_path.name, f"unreadable: {type(e).__name__}") from None
    problem = index_problem(index, size)
    if problem:
        raise damaged(root, path.name if "bytes" in problem else index_path.name, problem)
    return index


def index_problem(index, size):
    """What is inconsistent in a shard's index and its .jpegs file of ``size`` bytes, or ''."""
    count = len(index["lengths"])
    if not (len(index["offsets"]) == len(index["labels"]) == count
            and len(bytes(index["names"]).split(b"\0")) == count):
        return "its index's columns differ in length"
    ends = index["offsets"].astype(numpy.int64) + index["lengths"]
    needed = int(ends.max()) if count else 0
    if size < needed:
        return f"{size} bytes, its index needs {needed}: cut short"
    return ""


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
            index = read_index(root, path.name)
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
        self.ready(transform, strict, leave_out, cache_mb)

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
