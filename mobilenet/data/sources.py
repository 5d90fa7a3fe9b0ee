"""Where the data comes from: the table of the kinds of data.path (SOURCES), the crops a config
asks for, data.workers and data.decode auto. A source's dataset class has ``record_lines()``,
``__len__``, ``classes`` and ``unreadable`` (a flag per file), as ImageSamples has."""
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from PIL import Image

from mobilenet.data import prepared
from mobilenet.data.transforms import crops
from mobilenet.data.datasets import EncodedImage, SyntheticImages, checked, image_folder, read_regular_file
from mobilenet.device import usable_cores
from mobilenet.errors import UsageError


@dataclass(frozen=True)
class Source:
    """``claims(path)``: whether data.path is of this source (the ``fallback`` takes what none
    claims); ``datasets(path, data, model, crops)``: (train, val); ``train_images(path, data,
    limit)``: counted up to ``limit``; ``decoded_bytes(path)``: an image's, estimated; ``recipe``:
    configs/NAME.yaml; ``takes``: its settings of DATA_OPTIONAL; ``example(folder)``: a small one
    made there, its data.path (every row trains from one in the tests); ``preparable``: by
    scripts/prepare_data.py."""
    claims: Callable
    datasets: Callable
    train_images: Callable
    decoded_bytes: Callable
    recipe: str
    takes: tuple
    example: Callable
    preparable: bool = False
    fallback: bool = False


# of files' images: data.* settings, and the augment.* ones that transform each image
IMAGE_SETTINGS = ("hflip", "min_scale", "val_resize_ratio", "strict", "cache_mb", "decode", "train_resolution",
                  "interpolation", "augment.policy", "augment.random_erase")
DATA_OPTIONAL = (*IMAGE_SETTINGS, "synthetic_size")  # the data.* settings a source may take or not


def synthetic_datasets(path, data, model, crops):
    return (SyntheticImages(data["synthetic_size"], model["resolution"], model["num_classes"]),
            SyntheticImages(max(1, data["synthetic_size"] // 8), model["resolution"], model["num_classes"], seed=1))


def folder_datasets(path, data, model, crops):
    leave_out = (3, model["resolution"], model["resolution"])
    train = image_folder(path, "train", crops[0], data["strict"], cache_mb=data["cache_mb"])
    val = image_folder(path, "val", crops[1], data["strict"], leave_out=leave_out, cache_mb=data["cache_mb"])
    return checked(train, val, path, model)


def prepared_datasets(path, data, model, crops):
    leave_out = (3, model["resolution"], model["resolution"])
    return checked(*prepared.prepared_datasets(path, *crops, data, leave_out), path, model)


def folder_images(path, data, limit):
    """A folder's training files, listed (not read) up to ``limit``."""
    count, folders = 0, [Path(path) / "train"]
    while folders and count < limit:
        try:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    if entry.is_dir():
                        folders.append(entry.path)
                    else:
                        count += 1
        except OSError:  # its datasets say what is wrong with the folder
            continue
    return min(count, limit)


def first_files(folder):
    """The files below ``folder``, the first class folders first, each listed as it is met."""
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError:
        return
    for entry in entries:
        if entry.is_dir():
            yield from first_files(entry.path)
        elif entry.is_file():
            yield Path(entry.path)


def folder_decoded_bytes(path, sample=16):
    """One image's bytes and pixels, the mean of the first ``sample`` files' headers."""
    sizes = []
    for file in itertools.islice(first_files(Path(path) / "train"), sample):
        try:
            sizes.append(EncodedImage(read_regular_file(file)).hold_full_scale())
        except Exception:  # noqa: BLE001  the loader says what is wrong with a file
            continue
    return sum(sizes) / len(sizes) if sizes else 3 * 32 * 32  # the digits before they are written: 32 px


def digits_root():
    return DIGITS_ROOT if DIGITS_ROOT.is_dir() else build_digits()


def prepared_example(folder):
    """The digits, prepared by scripts/prepare_data.py into ``folder``/prepared."""
    destination = Path(folder) / "prepared"
    script = Path(__file__).resolve().parents[2] / "scripts" / "prepare_data.py"
    subprocess.run([sys.executable, str(script), str(digits_root()), str(destination), "--workers", "1"],
                   check=True, stdout=subprocess.DEVNULL)  # its progress and any error on stderr
    return str(destination)


SOURCES = {
    "synthetic": Source(claims=lambda path: path == "synthetic", datasets=synthetic_datasets,
                        train_images=lambda path, data, limit: data["synthetic_size"],
                        decoded_bytes=lambda path: 0, recipe="synthetic", takes=("synthetic_size",),
                        example=lambda folder: "synthetic"),
    "digits": Source(claims=lambda path: path == "digits",
                     datasets=lambda path, *rest: folder_datasets(digits_root(), *rest),
                     train_images=lambda path, data, limit: DIGITS_TRAIN_IMAGES,
                     decoded_bytes=lambda path: folder_decoded_bytes(DIGITS_ROOT), recipe="demo",
                     takes=IMAGE_SETTINGS, example=lambda folder: "digits"),
    "prepared": Source(claims=lambda path: prepared.is_prepared(path) or prepared.is_unfinished(path),
                       datasets=prepared_datasets,
                       train_images=lambda path, data, limit: prepared.train_images(path),
                       decoded_bytes=lambda path: 3 * prepared.manifest(path)["settings"]["max_side"] ** 2 * 3 // 4,
                       recipe="imagenet", takes=IMAGE_SETTINGS, example=prepared_example),
    "folder": Source(claims=None, datasets=folder_datasets, train_images=folder_images,
                     decoded_bytes=folder_decoded_bytes, recipe="imagenet", takes=IMAGE_SETTINGS,
                     example=lambda folder: str(digits_root()), preparable=True, fallback=True),
}


def source_name(path):
    """The key of the source that claims data.path ``path`` (one at most), else the fallback's."""
    if path is None:
        raise UsageError("no dataset: pass --data /path/to/imagenet, --data synthetic or --data digits")
    claimed = [name for name, source in SOURCES.items() if not source.fallback and source.claims(path)]
    if len(claimed) > 1:
        raise UsageError(f"--data {path}: the sources {' and '.join(claimed)} of data.sources.SOURCES both claim "
                         f"it; make their claims exclusive")
    return claimed[0] if claimed else next(name for name, source in SOURCES.items() if source.fallback)


def source_of(path):
    return SOURCES[source_name(path)]


def build_datasets(data, model, augment, decode="workers"):
    """(train, val) datasets for ``data.path``; under device decode the workers hand JPEGs over."""
    transforms = crops(data, model, augment)
    if decode == "device":
        from mobilenet.data.device_decode import ScreenedCrop  # imported only then
        transforms = (ScreenedCrop(transforms[0], train=True), ScreenedCrop(transforms[1], train=False))
    return source_of(data["path"]).datasets(data["path"], data, model, transforms)


def train_images(data, limit):
    """The images of data.path's training set, counted up to ``limit`` (0 without a path)."""
    return source_of(data["path"]).train_images(data["path"], data, limit) if data["path"] is not None else 0


def choose_decode(setting, device_type, *, workers, card=0, probe=True, per_sample=""):
    """('workers' or 'device', why) for data.decode ``setting``; ``per_sample``: augmentation only the
    workers run. auto: device on cuda where a probe on the card decodes the workers' pixels faster
    than ``workers`` do; ``probe=False`` (the launcher's check) touches no card."""
    if setting == "device" and per_sample:
        raise UsageError(f"data.decode=device crops on the device, which takes no {per_sample}; use "
                         f"data.decode=workers (or auto) with them")
    if setting != "auto":
        return setting, f"{setting} (data.decode={setting})"
    if per_sample:
        return "workers", f"workers (auto: {per_sample} runs in the loader's workers)"
    if device_type != "cuda":
        return "workers", f"workers (auto: decoding on the device is for cuda; this is {device_type})"
    if not probe:
        return "workers", "workers (auto: decided by each training process's probe)"
    from mobilenet.data.device_decode import probe_choice  # imported only where it may run
    return probe_choice(card, workers)


SYNTHETIC_WORKERS = 4  # random images are only collated; more workers only add processes


def auto_workers(data, processes, cores=None):
    """data.workers auto: none when data.cache_mb holds the training set decoded (a crop costs less
    than a worker's hand-over: docs/performance.md), else this process's share of the usable
    cores less one for itself; SYNTHETIC_WORKERS at most for synthetic images."""
    source = source_of(data["path"]) if data["path"] is not None else SOURCES["folder"]
    if data["cache_mb"] and source is not SOURCES["synthetic"] and data["path"] is not None:
        per_image = source.decoded_bytes(data["path"])
        budget = data["cache_mb"] * 2**20
        if train_images(data, int(budget // per_image) + 1) * per_image <= budget:
            return 0
    workers = max(0, (cores or usable_cores()) // max(1, processes) - 1)
    return min(workers, SYNTHETIC_WORKERS) if source is SOURCES["synthetic"] else workers


DIGITS_ROOT = Path(__file__).resolve().parents[2] / "data" / "digits"
DIGITS_TRAIN_IMAGES = 1437  # of the 1,797, with build_digits' val_fraction 0.2


def build_digits(root=DIGITS_ROOT, size=32, val_fraction=0.2, seed=0):
    """scikit-learn's 1,797 digits as an ImageFolder of JPEGs, built aside and renamed (never partial)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images * (255 / 16)).round().astype("uint8")
    split = train_test_split(range(len(images)), test_size=val_fraction, random_state=seed,
                             stratify=digits.target)
    root = Path(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=".digits-"))
    for subset, indices in zip(("train", "val"), split):
        for i in indices:
            folder = tmp / subset / str(digits.target[i])
            folder.mkdir(parents=True, exist_ok=True)
            image = Image.fromarray(images[i]).resize((size, size), Image.BILINEAR).convert("RGB")
            image.save(folder / f"{i:04d}.jpg", quality=95)
    try:
        os.rename(tmp, root)
    except OSError:  # built meanwhile by another process
        shutil.rmtree(tmp)
    return root


if __name__ == "__main__":
    print(build_digits())
