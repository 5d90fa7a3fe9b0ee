"""Checkpoints: their keys (KEYS: ModelZoo's, so theirs load through the same code, and ours),
atomic writes, safe loading, the newest-first saver and the periodic timer."""
import contextlib
import io
import os
import pickle
import re
import time
from pathlib import Path

import torch

from mobilenet.errors import TEMPORARIES, TrainingFailure, UsageError


def whole(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def rng_field(value):
    """Whether ``value`` is a checkpoint's random states: a list by rank, or one rank's."""
    states = [value] if isinstance(value, dict) else value
    return isinstance(states, list) and bool(states) and all(isinstance(s, dict) and "torch" in s for s in states)


# The keys of a training checkpoint (mobilenet.state.TrainingState.state_dict writes exactly these;
# a test ties them): {key: (what a resume requires of it, the test), or None where it takes any
# value or none}.
KEYS = {
    "arch": None,                  # model.name (ModelZoo's: "mobilenet")
    "epoch": ("a whole number", whole),  # epochs completed
    "epoch_step": ("a whole number", whole),  # batches done in the epoch under way
    "global_step": ("a whole number (or absent)", lambda v: v is None or whole(v)),
    "validated": ("true or false (or absent)", lambda v: v is None or isinstance(v, bool)),
    "best_prec1": ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    "rng": ("the random generators' states", rng_field),  # every rank's, by rank
    "state_dict": None,            # the weights (fp32: the masters under O2)
    "optimizer": ("an optimizer state dict", lambda v: isinstance(v, dict) and "param_groups" in v),
    "scheduler": ("a scheduler state dict", lambda v: isinstance(v, dict)),
    "amp": None, "ema": None,
    "data": None,                  # the data records of train and val
    "config": None,                # the resolved config it was trained with
}


def is_training_checkpoint(checkpoint):
    """Whether a checkpoint can continue a run (ours), not only give weights."""
    return bool(checkpoint.get("optimizer")) and bool(checkpoint.get("scheduler"))


def malformed_field(checkpoint):
    """(key, what it must be) of the first field of KEYS that ``checkpoint`` holds wrongly, or None."""
    for key, required in KEYS.items():
        if required and not required[1](checkpoint.get(key)):
            return key, required[0]
    return None


def serialize(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def save_atomic(data, path, what="the checkpoint"):
    """``data`` (bytes, or an object to torch.save) to ``path`` through a temporary file, fsync and
    rename; an OS error (a full disk) is a TrainingFailure, the previous file kept."""
    path = Path(path)
    data = data if isinstance(data, bytes) else serialize(data)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    TEMPORARIES.add(tmp)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        kept = f"the previous {path.name} is intact" if path.exists() else "nothing was saved there"
        raise TrainingFailure(f"{path}: cannot save {what} ({e.strerror or e}); {kept}") from None
    finally:
        TEMPORARIES.discard(tmp)


def fsync_dir(folder):
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(path):
    """A checkpoint dict; a missing, corrupt or foreign file is a UsageError naming it."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such checkpoint") from None
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        if not found:  # a damaged file (weights_only reports that as an unpickling error too)
            raise UsageError(f"{path}: not a readable checkpoint ({plain_reason(e)})") from None
        raise UsageError(f"{path}: not a checkpoint this app loads: it holds a {found.group(1)} object, which "
                         f"a safe load (torch.load weights_only) refuses; save its tensors and numbers as "
                         f"plain values") from None
    except Exception as e:  # noqa: BLE001  torch raises several types for truncated or non-torch files
        raise UsageError(f"{path}: not a readable checkpoint ({plain_reason(e)})") from None
    if not isinstance(checkpoint, dict):
        raise UsageError(f"{path}: not a checkpoint dict")
    for old, new in RENAMED_KEYS.items():  # written by an earlier version of the app
        if old in checkpoint and new not in checkpoint:
            checkpoint[new] = checkpoint.pop(old)
    return checkpoint


# Keys of checkpoints written before they were renamed: old -> new.
RENAMED_KEYS = {"step": "epoch_step"}


def plain_reason(error, limit=120):
    """An error's first line, without terminal escapes, cut at a word within ``limit`` characters."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip()
    line = text.splitlines()[0] if text else type(error).__name__
    return line if len(line) <= limit else line[:limit].rsplit(" ", 1)[0] + " ..."


class CheckpointSaver:
    """checkpoints/last.pt (every epoch, and within epochs on request), best.pt on a new best top-1,
    epoch_NNN.pt for the last K epochs: separate files, so one damaged file takes no other along."""

    def __init__(self, run_dir, keep=0, writing=None):
        """``writing(path)``: a context manager around each file's write (the stall watchdog's)."""
        self.folder = Path(run_dir) / "checkpoints"
        self.keep = keep
        self.writing = writing or (lambda path: contextlib.nullcontext())

    @property
    def last(self):
        return self.folder / "last.pt"

    def write(self, data, path):
        with self.writing(path):
            save_atomic(data, path)

    def save_last(self, state):
        self.write(state, self.last)

    def save(self, state, epoch, is_best):
        data = serialize(state)  # once, written to each file
        self.write(data, self.last)
        if is_best:
            self.write(data, self.folder / "best.pt")
        if self.keep > 0:
            self.write(data, self.folder / f"epoch_{epoch:03d}.pt")
            for old in sorted(self.folder.glob("epoch_*.pt"))[:-self.keep]:
                old.unlink()


class Every:
    """``due()`` is true once every ``minutes`` (never for 0): the periodic checkpoint's timer."""

    def __init__(self, minutes):
        self.seconds = minutes * 60
        self.next = time.monotonic() + self.seconds

    def due(self):
        if not self.seconds or time.monotonic() < self.next:
            return False
        self.next = time.monotonic() + self.seconds
        return True
