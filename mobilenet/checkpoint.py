"""Checkpoints: atomic writes, last/best/keep-K, safe loading (weights_only=True).

The dict uses the Ascend ModelZoo keys (epoch, arch, state_dict, best_prec1, optimizer), so our
files and theirs load through the same code; ours add scheduler, amp and config.
"""
import os
from pathlib import Path

import torch

from mobilenet.errors import UsageError


def save_atomic(obj, path):
    """Temporary file, fsync, rename: a crash at any moment leaves the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(folder):
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_atomic(src, dst):
    """dst becomes another name of src's contents, atomically (hard link, else a copy)."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    try:
        os.link(src, tmp)
    except OSError:
        save_atomic(torch.load(src, map_location="cpu", weights_only=True), tmp)
    os.replace(tmp, dst)
    fsync_dir(dst.parent)


def load_checkpoint(path):
    """A checkpoint dict; a missing, corrupt or foreign file is a UsageError naming it."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such checkpoint") from None
    except Exception as e:  # torch raises several types for truncated or non-torch files
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"{path}: not a readable checkpoint ({reason[:120]})") from None
    if not isinstance(checkpoint, dict):
        raise UsageError(f"{path}: not a checkpoint dict")
    return checkpoint


class CheckpointSaver:
    """checkpoints/last.pt every epoch, best.pt on a new best top-1, epoch_NNN.pt for the last K."""

    def __init__(self, run_dir, keep=0):
        self.folder = Path(run_dir) / "checkpoints"
        self.keep = keep

    @property
    def last(self):
        return self.folder / "last.pt"

    def save_last(self, state):
        save_atomic(state, self.last)

    def save(self, state, epoch, is_best):
        save_atomic(state, self.last)
        if is_best:
            link_atomic(self.last, self.folder / "best.pt")
        if self.keep > 0:
            link_atomic(self.last, self.folder / f"epoch_{epoch:03d}.pt")
            for old in sorted(self.folder.glob("epoch_*.pt"))[:-self.keep]:
                old.unlink()


def load_latest(run_dir):
    """(path, checkpoint) of the newest loadable checkpoint in ``run_dir``/checkpoints, or None."""
    def newest_first(path):  # best.pt can be a hard link of last.pt: same mtime, prefer last
        return os.path.getmtime(path), path.name == "last.pt"
    candidates = sorted(Path(run_dir).glob("checkpoints/*.pt"), key=newest_first, reverse=True)
    for path in candidates:
        try:
            return path, load_checkpoint(path)
        except UsageError:
            continue
    return None
