"""Rank 0's output: console lines, TensorBoard scalars and metrics.jsonl. The lines keep the fields
ModelZoo's test scripts read with awk: ``Epoch: [e][s/n] ...`` has img/s as field 9 and the loss
as field 14, `` * Prec@1 X Prec@5 Y`` the top-1 as field 3; no other line has ``img/s`` or ``Epoch:``.
"""
import errno
import json
import os
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
