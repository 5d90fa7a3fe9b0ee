"""The datasets (a folder of files, synthetic images), decoding in the workers to uint8 CHW RGB tensors,
the samplers and the loaders."""
import contextlib
import hashlib
import io
import math
import multiprocessing
import os
import signal
import stat
import sys
from pathlib import Path

import numpy
import simplejpeg
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torch.utils.data import Sampler

from mobilenet.errors import UsageError, stop_signals


class EncodedImage:
    """An image file's bytes and size, decoded on demand: YCbCr and grayscale JPEGs by libjpeg-turbo
    (simplejpeg), at 1/2-1/8 scale about that much faster; anything else (CMYK, PNGs) by PIL."""

    def __init__(self, data):
        self.data = data
        self.full = None  # the full-scale pixels, once hold_full_scale() has been called
        try:
            self.height, self.width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
            self.turbo = colorspace in ("YCbCr", "Gray")
        except ValueError:  # not a JPEG libjpeg-turbo reads
            self.turbo = False
            with Image.open(io.BytesIO(data)) as image:  # PIL applies its bomb guard here
                self.width, self.height = image.size
        limit = Image.MAX_IMAGE_PIXELS
        if self.turbo and limit and self.width * self.height > 2 * limit:  # PIL's guard, for JPEGs too
            raise Image.DecompressionBombError(f"{self.width}x{self.height} pixels is over PIL's limit "
                                               f"of {2 * limit} (Image.MAX_IMAGE_PIXELS)")

    def hold_full_scale(self):
        """From now on the full-scale decode is kept; returns the bytes this will hold."""
        self.full = False
        return len(self.data) + 3 * self.height * self.width

    def decode(self, reduce=1):
        """Decoded at about 1/reduce of full size (1, 2, 4 or 8; other factors decode slower)."""
        if reduce == 1 and self.full is not None:
            if self.full is False:
                self.full = self._decode(1)
            return self.full
        return self._decode(reduce)

    def _decode(self, reduce):
        height, width = math.ceil(self.height / reduce), math.ceil(self.width / reduce)
        if self.turbo:
            pixels = simplejpeg.decode_jpeg(self.data, "RGB", min_height=height, min_width=width)
        else:
            with Image.open(io.BytesIO(self.data)) as image:
                image.draft("RGB", (width, height))
                pixels = rgb_pixels(image)
        return torch.from_numpy(pixels).permute(2, 0, 1)


def rgb_pixels(image):
    """HWC uint8 RGB of a PIL image. 16-bit grayscale (PNG, TIFF: modes I;16* and I) is scaled to 8
    bits; PIL's convert("RGB") would clip every value above 255 to white."""
    if image.mode.startswith("I;16") or image.mode == "I":
        gray = (numpy.asarray(image).astype(numpy.uint32) >> 8).clip(0, 255).astype(numpy.uint8)
        return numpy.repeat(gray[:, :, None], 3, axis=2)
    return numpy.array(image.convert("RGB"))


def sample_key(key):
    """Keys are an index (val) or (index, augmentation seed) from ResumableSampler (train)."""
    return key if isinstance(key, tuple) else (key, None)


def read_regular_file(path):
    """The bytes of ``path``; not a regular file (a FIFO blocks forever) is an OSError. Plain os
    calls: a file object costs ~30 us more per small file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"not a regular file ({stat.filemode(info.st_mode)[0]})")
        chunks, left = [], info.st_size
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class ImageSamples(Dataset):
    """Encoded images with labels (``samples``: [(path, label)]), transformed with the sample's seed.
    An unreadable image gets one warning and a mark in ``unreadable`` (shared with the workers);
    training takes the next readable one instead, validation (``leave_out``: the image shape) a
    blank labelled -1 that accuracy leaves out; ``strict``: a UsageError at the first."""

    def ready(self, transform, strict=False, leave_out=None, cache_mb=0):
        """Called by a subclass once its samples are known."""
        self.transform, self.strict, self.leave_out = transform, strict, leave_out
        self.unreadable = torch.zeros(len(self.samples), dtype=torch.bool).share_memory_()
        self.lock = multiprocessing.Lock()
        decoded = not getattr(transform, "keeps_bytes", False)  # device decode's crops take the bytes
        self.cache = self.preload(cache_mb * 2**20, decoded=decoded) if cache_mb else {}

    def read(self, index):
        """The EncodedImage of sample ``index``, read now (an OSError or a decoder's error: unreadable)."""
        raise NotImplementedError

    def preload(self, budget, decoded=True):
        """{index: EncodedImage, decoded at full scale (else its bytes alone)} of the first images
        that fit in ``budget`` bytes, before the workers fork. A cached image gives a fresh read's
        pixels (reduced-scale decodes come from its bytes): caching never changes a run."""
        cache = {}
        for index, (path, _) in enumerate(self.samples):
            try:
                image = self.read(index)
                budget -= image.hold_full_scale() if decoded else len(image.data)
                if budget < 0:
                    break
                if decoded:
                    image.decode(1)
            except Exception as e:  # noqa: BLE001  as in load()
                self.report_unreadable(index, path, f"{type(e).__name__}: {e}")
                continue
            cache[index] = image
        return cache

    def open(self, index):
        """The EncodedImage of sample ``index``, from the cache (data.cache_mb) or read now."""
        image = self.cache.get(index)
        return image if image is not None else self.read(index)

    def load(self, index, seed):
        """(transformed image, label), or None when the image cannot be read or decoded."""
        if self.unreadable[index]:
            return None
        path, label = self.samples[index]
        try:
            image = self.transform(self.open(index), seed)
        except Exception as e:  # noqa: BLE001  decoders raise many types for bad data: this image's problem
            self.report_unreadable(index, path, f"{type(e).__name__}: {e}")
            return None
        if hasattr(image, "with_index"):  # still encoded (data.decode=device): it carries its index
            image = image.with_index(index)
        return image, label

    def report_unreadable(self, index, path, reason):
        if self.strict:
            raise UsageError(f"{path}: unreadable image ({reason}); data.strict=true stops here")
        with self.lock:
            first = not self.unreadable[index]
            self.unreadable[index] = True
        if first:
            print(f"warning: skipping unreadable image {path} ({reason})", file=sys.stderr, flush=True)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, key):
        index, seed = sample_key(key)
        if self.leave_out is not None:
            sample = self.load(index, seed)
            return sample if sample is not None else (torch.zeros(self.leave_out, dtype=torch.uint8), -1)
        for offset in range(len(self)):
            sample = self.load((index + offset) % len(self), seed)
            if sample is not None:
                return sample
        raise UsageError(f"{self.root}: no readable image")

    def record_lines(self):
        """What tells this data apart, as bytes, for the data record (no image is read)."""
        for path, label in self.samples:  # names are bytes on Linux, not always UTF-8
            yield os.fsencode(os.path.relpath(path, self.root)) + f"\t{label}\n".encode()


# torchvision's ImageFolder extensions; its scan is rewritten below, and importing torchvision
# costs each process 1.4 s (it loads torch._dynamo), so the folder needs nothing else from it.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ImageFolderRGB(ImageSamples):
    """A folder of image files with torchvision ImageFolder's classes, labels and sample order."""

    def __init__(self, root, transform, strict=False, leave_out=None, cache_mb=0):
        self.root = str(root)
        self.classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        if not self.classes:
            raise FileNotFoundError(f"Couldn't find any class folder in {root}.")
        self.samples = self.scan(self.root, {name: label for label, name in enumerate(self.classes)})
        self.targets = [label for _, label in self.samples]
        self.ready(transform, strict, leave_out, cache_mb)

    def read(self, index):
        return EncodedImage(read_regular_file(self.samples[index][0]))

    @staticmethod
    def scan(directory, class_to_idx):
        """torchvision's make_dataset (its samples, its order), but each real folder and file once:
        its os.walk(followlinks=True) follows a link to a parent folder round the whole tree again,
        labelling other classes' images with this one's. A folder reached again is one warning."""
        seen_folders = {folder_id(directory)} | {folder_id(os.path.join(directory, c)) for c in class_to_idx}
        seen_files, again, samples = set(), [], []
        for name in sorted(class_to_idx):
            top = os.path.join(directory, name)
            seen_folders.discard(folder_id(top))  # its own class reads it; links from others do not
            for folder, files in sorted(scan_once(top, seen_folders, seen_files, again)):
                samples += [(os.path.join(folder, f), class_to_idx[name]) for f in sorted(files)
                            if f.lower().endswith(IMAGE_EXTENSIONS)]
        if again:
            print(f"warning: {directory}: {len(again)} folder(s) reached again through a link, skipped (a loop, "
                  f"or a second way into one folder), e.g. {again[0]}; each real folder is read once",
                  file=sys.stderr, flush=True)
        empty = set(class_to_idx) - {Path(path).relative_to(directory).parts[0] for path, _ in samples}
        if empty:
            raise FileNotFoundError(f"Found no valid file for the classes {', '.join(sorted(empty))}")
        return samples


def folder_id(path):
    info = os.stat(path)
    return info.st_dev, info.st_ino


def scan_once(top, seen_folders, seen_files, again):
    """[(folder, [file names])] below ``top``, each real folder and file once; repeats to ``again``."""
    found, todo = [], [top]
    while todo:
        folder = todo.pop()
        key = folder_id(folder)
        if key in seen_folders:
            again.append(folder)
            continue
        seen_folders.add(key)
        files = []
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda entry: entry.name, reverse=True)  # popped in order
        for entry in entries:
            try:
                if entry.is_dir():  # a link to a folder too
                    todo.append(entry.path)
                    continue
                info = entry.stat() if entry.is_symlink() else None
                file_key = (info.st_dev, info.st_ino) if info else (key[0], entry.inode())
            except OSError:  # a broken or looping link: the loader warns when it reads it
                files.append(entry.name)
                continue
            if file_key not in seen_files:
                seen_files.add(file_key)
                files.append(entry.name)
        found.append((folder, files))
    return found


def data_record(dataset):
    """{"images": N, "fingerprint": a hash of the files and labels}, which a resume compares."""
    digest = hashlib.sha1()
    for line in dataset.record_lines():
        digest.update(line)
    return {"images": len(dataset), "fingerprint": digest.hexdigest()}


class SyntheticImages(Dataset):
    """Random uint8 images with labels, for throughput runs without a dataset on disk."""

    POOL = 64  # distinct images, cycled

    def __init__(self, size, resolution, num_classes, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (self.POOL, 3, resolution, resolution),
                                    dtype=torch.uint8, generator=generator)
        self.size, self.num_classes = size, num_classes
        self.classes = [str(c) for c in range(num_classes)]
        self.unreadable = torch.zeros(0, dtype=torch.bool)  # no files

    def __len__(self):
        return self.size

    def __getitem__(self, key):
        index, _ = sample_key(key)
        return self.images[index % self.POOL], index % self.num_classes

    def record_lines(self):
        yield f"synthetic {self.size} {tuple(self.images.shape)} {self.num_classes}".encode()


def image_folder(root, subset, transform, strict, leave_out=None, cache_mb=0, flag="--data"):
    """ImageFolderRGB of ``root``/``subset``; a bad folder is a UsageError naming ``flag``."""
    folder = Path(root) / subset
    try:
        found = folder.is_dir()
    except OSError as e:  # a name too long, a permission: the path itself is the problem
        raise UsageError(f"{flag} {root}: {e.strerror}") from None
    if not found:
        raise UsageError(f"{flag} {root}: no '{subset}' folder (expected {root}/{subset}/<class>/*.JPEG)")
    try:
        return ImageFolderRGB(folder, transform, strict, leave_out, cache_mb)
    except (FileNotFoundError, OSError) as e:
        raise UsageError(f"{flag} {root}: {subset}: {e}") from None


def same_classes(train, val, where):
    """A UsageError starting with ``where`` unless the two splits have the same classes."""
    if train.classes != val.classes:
        missing, extra = sorted(set(train.classes) - set(val.classes)), sorted(set(val.classes) - set(train.classes))
        raise UsageError(f"{where}: train has {len(train.classes)} classes, val has {len(val.classes)}; "
                         f"not in val: {', '.join(missing[:5]) or 'none'}{' ...' if len(missing) > 5 else ''}; "
                         f"only in val: {', '.join(extra[:5]) or 'none'}{' ...' if len(extra) > 5 else ''}")


def checked(train, val, path, model):
    """(train, val), once their classes agree with each other and with the model."""
    same_classes(train, val, f"--data {path}")
    if len(train.classes) != model["num_classes"]:
        raise UsageError(f"--data {path}: {len(train.classes)} classes, but the model has "
                         f"{model['num_classes']} (model.num_classes={model['num_classes']})")
    return train, val


class WorkerSignals:
    """While the run trains (``protect()``) the loader's workers outlive the stop signals, which
    torchrun, Slurm and Ctrl-C send to every process: the run stops after its step and ends them.
    Otherwise they end at once, as the loader's own SIGTERM shutdown expects."""

    def __init__(self):
        self.protected = multiprocessing.Value("b", 0, lock=False)  # shared with the workers

    def worker_init(self, worker_id):
        for signum in stop_signals():
            signal.signal(signum, self.handle)

    def handle(self, signum, frame):
        if not self.protected.value:
            os._exit(0)  # as torch's own worker handler does when the loader shuts a worker down

    @contextlib.contextmanager
    def protect(self):
        self.protected.value = 1
        try:
            yield
        finally:
            self.protected.value = 0


def build_loaders(train_set, val_set, data, seed, rank=0, world=1, pin_memory=False,
                  worker_signals=None, workers=0, decode="workers", accumulation=1, reps=1):
    """Train: ResumableSampler's full batches, ``accumulation`` a step. Val: this process's exact
    share. ``decode`` device: batches of encoded JPEGs (mobilenet.data.device_decode)."""
    common = {"num_workers": workers, "pin_memory": pin_memory, "persistent_workers": workers > 0,
              "worker_init_fn": worker_signals.worker_init if worker_signals else None}
    if decode == "device":  # imported only then
        from mobilenet.data.device_decode import collate
        common["collate_fn"] = collate
    sampler = ResumableSampler(len(train_set), rank, world, seed, data["batch_size"], accumulation, reps)
    # generators of their own: an iteration's start draws from them, not from torch's global one,
    # which the model's own randomness (dropout) uses and checkpoints restore
    train = DataLoader(train_set, batch_size=data["batch_size"], sampler=sampler, drop_last=True,
                       generator=torch.Generator().manual_seed(seed), **common)
    val = DataLoader(val_set, batch_size=data["val_batch_size"], sampler=ShardSampler(len(val_set), rank, world),
                     generator=torch.Generator().manual_seed(seed + 1), **common)
    if sampler.steps == 0:
        raise UsageError(f"data.batch_size={data['batch_size']} x {world} process(es) x {accumulation} forward(s) "
                         f"is larger than the {len(train_set)} training images")
    return train, val


class ResumableSampler(Sampler):
    """DistributedSampler's seeded shuffle and shard (drop_last) over virtual ranks: forward m of
    ``rank`` holds virtual rank ``rank x accumulation + m``'s share, so 1 process accumulating 2
    forwards trains what 2 processes train. It starts at any step and yields (index, seed).
    ``reps`` > 1 (RASampler): each image ``reps`` times in a row, each copy its own seed."""

    def __init__(self, length, rank=0, world=1, seed=0, batch=1, accumulation=1, reps=1):
        self.length, self.seed, self.batch, self.reps = length, seed, batch, reps
        self.virtual = range(rank * accumulation, (rank + 1) * accumulation)  # this process's virtual ranks
        self.ranks = world * accumulation
        self.steps = length // self.ranks // batch  # optimizer steps an epoch (global batches)
        self.epoch = self.start = 0

    def set_epoch(self, epoch, start=0):
        """``start``: global steps already trained in this epoch."""
        self.epoch, self.start = epoch, start

    def __iter__(self):
        order = torch.randperm(self.length, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        order = order[torch.arange(self.length // self.ranks * self.ranks) // self.reps]  # each reps times in a row
        shares = {v: order[v::self.ranks].tolist() for v in self.virtual}
        b, reps = self.batch, self.reps
        base = (self.seed * 1_000_003 + self.epoch) * self.length * reps
        # the k-th image of rank v's batch sits at v + (step x b + k) x ranks of the order: its copy
        return ((index, base + index * reps + (v + (step * b + k) * self.ranks) % reps)
                for step in range(self.start, self.steps) for v in self.virtual
                for k, index in enumerate(shares[v][step * b:(step + 1) * b]))

    def __len__(self):
        return (self.steps - self.start) * len(self.virtual) * self.batch


class ShardSampler(Sampler):
    """Every ``world``-th index from ``rank``: each val image is seen exactly once, no padding."""

    def __init__(self, length, rank, world):
        self.indices = range(rank, length, world)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)
