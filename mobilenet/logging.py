"""The run directory: held by one live run (its lock); rank 0's console lines, TensorBoard scalars
and metrics.jsonl there. The lines keep the fields ModelZoo's test scripts read with awk:
``Epoch: [e][s/n] ...`` has img/s as field 9 and the loss as field 14, `` * Prec@1 X Prec@5 Y`` the
top-1 as field 3; no other line has ``img/s`` or ``Epoch:``.
"""
import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import threading
from pathlib import Path

import yaml

from mobilenet.checkpoint import save_atomic
from mobilenet.errors import TrainingFailure, UsageError


def hms(seconds):
    """H:MM:SS (hours unbounded, no spaces: the line's fields stay at fixed positions)."""
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def progress_line(*, epoch, step, steps, eta_epoch, eta_run, img_per_s, data_wait, loss, lr,
                  elapsed, extras):
    """``Epoch: [e][s/n]  eta E epoch, R run  img/s X  data wait W%  loss L  lr ...  elapsed T``;
    awk fields: 9 img/s (running), 14 loss."""
    tail = "".join(f"  {k} {v:g}" for k, v in extras.items())
    return (f"Epoch: [{epoch}][{step}/{steps}]  eta {hms(eta_epoch)} epoch, {hms(eta_run)} run  "
            f"img/s {img_per_s:.1f}  data wait {data_wait:.0%}  loss {loss:.4f}  lr {lr:.5f}  "
            f"elapsed {hms(elapsed)}{tail}")


def trim_records_after(path, global_step):
    """metrics.jsonl rewritten without records after ``global_step`` or a line a crash cut short."""
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            if record.get("global_step", record.get("step")) <= global_step:
                kept.append(line + "\n")
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    save_atomic("".join(kept).encode(), path, "the trimmed metrics")


def quiet_writer_errors(args, default=threading.excepthook):
    """A full disk in TensorBoard's thread is raised again by the next add_scalar: one line."""
    if not issubclass(args.exc_type, OSError):
        default(args)


def write_failure(run_dir, error):
    """The line for metrics that cannot be written: why, what was saved, what to do."""
    if not run_dir.is_dir():
        return (f"{run_dir}: the run directory was removed while the run wrote to it; stopped (nothing more "
                f"can be saved there)")
    saved = ("the checkpoints saved before are intact" if (run_dir / "checkpoints" / "last.pt").exists()
             else "no checkpoint had been saved yet")
    fix = ("free some space and resume with --resume auto" if error.errno in (errno.ENOSPC, errno.EDQUOT)
           else "resume with --resume auto once it can be written")
    return f"{run_dir / 'metrics.jsonl'}: cannot write the metrics ({error.strerror}); stopped, {saved}; {fix}"


class RunLogger:
    """Rank 0's console lines and, from ``start()``, metrics.jsonl and TensorBoard in ``run_dir``."""

    def __init__(self, run_dir, enabled=True):
        self.run_dir, self.enabled = Path(run_dir), enabled
        self.console = enabled
        self.tensorboard = self.metrics = None

    def start(self, config, resumed_at=None):
        """config.yaml, then metrics.jsonl and TensorBoard, the records after ``resumed_at`` gone."""
        if not self.enabled:
            return
        from torch.utils.tensorboard import SummaryWriter
        resolved = yaml.safe_dump(config, sort_keys=False).encode()
        path = self.run_dir / "metrics.jsonl"
        try:
            if resumed_at is not None and path.exists():
                trim_records_after(path, resumed_at)
            self.metrics = open(path, "a")
        except OSError as e:
            raise UsageError(f"--output {self.run_dir}: cannot write there ({e.strerror})") from None
        save_atomic(resolved, self.run_dir / "config.yaml", "the config")
        purge = {} if resumed_at is None else {"purge_step": resumed_at + 1}
        self.tensorboard = SummaryWriter(str(self.run_dir), **purge)
        threading.excepthook = quiet_writer_errors

    def info(self, message):
        if not self.console:
            return
        try:
            print(message, flush=True)
        except OSError:  # the terminal is gone (EIO after a hangup, a closed pipe): the run goes on
            self.console = False  # and saves; what it would print goes to metrics.jsonl and TensorBoard
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    def scalars(self, kind, global_step, **values):
        """One metrics.jsonl line and one TensorBoard scalar per value, tagged ``kind/name``."""
        if self.metrics is None:
            return
        try:
            self.metrics.write(json.dumps({"kind": kind, "global_step": global_step, **values}) + "\n")
            self.metrics.flush()
            for name, value in values.items():  # raises what TensorBoard's writer thread met
                if name != "epoch":
                    self.tensorboard.add_scalar(f"{kind}/{name}", value, global_step)
        except OSError as e:  # a full disk, say: stop while the last checkpoint is still good
            raise TrainingFailure(write_failure(self.run_dir, e)) from None

    def close(self):
        if self.metrics is not None:
            self.tensorboard.close()
            self.metrics.close()
            self.metrics = None


def run_files(run_dir):
    """The files a run leaves in ``run_dir`` (checkpoints, metrics, TensorBoard events, summary)."""
    run_dir = Path(run_dir)
    found = [run_dir / name for name in ("checkpoints", "metrics.jsonl", "summary.json")
             if (run_dir / name).exists()]
    return found + sorted(run_dir.glob("events.out.tfevents.*"))


def remove_temporaries(run_dir):
    """Deletes the temporary files of saves that a crash interrupted; returns their paths."""
    stale = sorted((Path(run_dir) / "checkpoints").glob(".*.tmp"))
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


class RunLock:
    """An flock on ``run_dir``/.lock: a second live run stops; a dead run's goes with its process."""

    def __init__(self, run_dir):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / ".lock"
        self.file = None

    def __enter__(self):
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.file = open(self.path, "a+")
        except OSError as e:
            raise UsageError(f"--output {self.run_dir}: cannot write there ({e.strerror})") from None
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            holder = self.file.read().strip() or "another process"
            self.file.close()
            raise UsageError(f"--output {self.run_dir}: another run is using it ({holder}); wait for "
                             f"it to end or stop it, or pass another --output") from None
        try:
            os.ftruncate(self.file.fileno(), 0)
            os.write(self.file.fileno(), f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        except OSError as e:  # a full disk, say: found before anything is trained
            self.file.close()
            raise UsageError(f"--output {self.run_dir}: cannot write there ({e.strerror}); free some "
                             f"space or pass another --output") from None
        return self

    def __exit__(self, *exc):
        self.file.close()  # releases the lock


@contextlib.contextmanager
def run_directory(run_dir, *, resume, start_over, main=True, claim=True):
    """The run directory, held while the run lasts: its RunLogger (rank 0, ``main``, writes) and its
    lock (``claim``: rank 0 unless it only evaluates); a run in it is trained over only to resume it."""
    if not claim:
        yield RunLogger(run_dir, enabled=main)
        return
    with RunLock(run_dir):
        for path in remove_temporaries(run_dir):
            print(f"removed {path}, left by an interrupted save", flush=True)
        previous = run_files(run_dir)
        if previous and not resume:
            if not start_over:
                raise UsageError(f"--output {run_dir} holds a run ({previous[0].name}, ...); continue it "
                                 f"with --resume auto, start over there with --start-over (its files go), "
                                 f"or pass another --output")
            for path in previous:
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            print(f"--start-over: removed the previous run's files from {run_dir}", flush=True)
        yield RunLogger(run_dir, enabled=main)
