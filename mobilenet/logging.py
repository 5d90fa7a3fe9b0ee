"""Run output of rank 0: console lines, TensorBoard scalars and metrics.jsonl.

Console lines keep the fields that Ascend ModelZoo's MobileNetV1 test scripts read with awk:
progress lines ``Epoch: [e][s/n] ...`` carry the epoch's running img/s as field 9 and the
interval's loss as field 14; validation lines `` * Prec@1 X Prec@5 Y`` the top-1 as field 3. No
other line contains ``img/s`` or ``Epoch:``.
"""
import errno
import json
import os
import sys
import threading
from pathlib import Path

import yaml

from mobilenet.checkpoint import save_atomic
from mobilenet.config import thaw
from mobilenet.device import bf16_hint, describe
from mobilenet.errors import TrainingFailure, UsageError
from mobilenet.model import MODELS


def clock(seconds):
    """H:MM:SS (hours unbounded, no spaces: the line's fields stay at fixed positions)."""
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def progress_line(*, epoch, step, steps, eta_epoch, eta_run, img_per_s, data_wait, loss, lr,
                  elapsed, extras):
    """``Epoch: [e][s/n]  eta E epoch, R run  img/s X  data wait W%  loss L  lr ...  elapsed T``;
    awk fields: 9 img/s (running), 14 loss."""
    tail = "".join(f"  {k} {v:g}" for k, v in extras.items())
    return (f"Epoch: [{epoch}][{step}/{steps}]  eta {clock(eta_epoch)} epoch, {clock(eta_run)} run  "
            f"img/s {img_per_s:.1f}  data wait {data_wait:.0%}  loss {loss:.4f}  lr {lr:.5f}  "
            f"elapsed {clock(elapsed)}{tail}")


def accuracy_line(top1, top5, note="", prefix=""):
    """`` * Prec@1 X Prec@5 Y  (note)``; awk field 3 is the top-1 (without ``prefix``)."""
    return f" *{prefix} Prec@1 {top1:.3f} Prec@5 {top5:.3f}" + (f"  ({note})" if note else "")


def run_description(cfg, *, device, images, steps):
    """The lines that open a run's log: the device and precision, the data and batch, the loader
    and compile choices, the command line's notes and a bf16 hint. ``images``: (train, val)."""
    derived, data, optim = cfg["derived"], cfg["data"], cfg["optim"]
    hint, optimizer = bf16_hint(cfg), derived["optimizer_class"]
    scaled = f" ({optim['lr']:g} per {optim['lr_scale_batch']} images)" if optim["lr_scale_batch"] else ""
    auto = " (auto: from the usable cores)" if data["workers"] == "auto" else ""
    return [f"device {describe(device)}, {derived['world_size']} process(es); optimizer {optimizer}; amp "
            f"{cfg['amp']['level']} ({derived['amp_backend']})",
            f"data {data['path']}: {images[0]} train / {images[1]} val images, batch {data['batch_size']} per "
            f"process x {derived['world_size']} = {derived['global_batch']} global, {steps} steps/epoch, "
            f"lr {derived['lr']:g}{scaled}",
            f"data.workers {derived['workers']}{auto}; data.decode {derived['decode_why']}; "
            f"train.compile {derived['compile_why']}",
            *(f"command line: {note}" for note in derived["command_line"]),
            *([f"model.width_mult {cfg['model']['width_mult']:g}: {cfg['model']['name']} has no width "
               f"multiplier; it is built at its own width (the setting is ignored)"]
              if not MODELS[cfg["model"]["name"]].has_width and cfg["model"]["width_mult"] != 1.0 else []),
            *([hint] if hint else [])]


class DataWaitHint:
    """One line, once a run, when the loader stays the bottleneck: a data wait of at least SHARE of
    the step for INTERVALS log intervals in a row."""
    SHARE, INTERVALS = 0.3, 3

    def __init__(self):
        self.slow, self.given = 0, False

    def line(self, data_wait, workers, cores, prepared):
        """The hint after an interval with ``data_wait``, or None. ``cores``: the usable cores of
        each process; ``prepared``: the data is a prepared set already."""
        self.slow = self.slow + 1 if data_wait >= self.SHARE else 0
        if self.slow < self.INTERVALS or self.given:
            return None
        self.given = True
        prepare = "" if prepared else ("prepare the data once (python scripts/prepare_data.py DIR DST, then "
                                       "--data DST: about half the CPU per image), ")
        more = f"give it more cores (data.workers is {workers}" + (
            f", of {cores} usable: raise it)" if workers < cores - 1 else f" of {cores} usable cores)")
        return (f"hint: the loop waited for data {data_wait:.0%} of the time for {self.INTERVALS} log intervals: "
                f"the loader cannot keep up; {prepare}{more}, keep a small dataset in memory "
                f"(data.cache_mb) or use faster storage")


def read_summary(path, say):
    """A finished run's summary.json; {} (said) when it is missing or damaged."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        say(f"note: {path} is unreadable ({type(e).__name__}); the checkpoints are intact")
        return {}


def keep_records_up_to(path, global_step):
    """Rewrites metrics.jsonl (atomically) without the records of global steps after
    ``global_step`` and without a line a crash cut short (records written before the key was
    named global_step hold it as step)."""
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
    """An OSError in TensorBoard's writer thread (a full disk) is raised again by its next
    add_scalar in the run's own thread, which reports it in one line: no thread traceback."""
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
    """Console lines from rank 0 (``enabled=False``: none), and, once ``start()`` is called (after
    the run has checked it can resume), metrics.jsonl and TensorBoard event files in ``run_dir``."""

    def __init__(self, run_dir, enabled=True):
        self.run_dir, self.enabled = Path(run_dir), enabled
        self.console = enabled
        self.tensorboard = self.metrics = None
        self.data_hint = DataWaitHint()
        self.said = set()  # what a run says once (the classes found wholly unreadable)

    def start(self, config, resumed_at=None):
        """Writes ``config`` (resolved) to config.yaml, opens metrics.jsonl and TensorBoard.
        ``resumed_at``: the global step a resumed run continues after; the records of later steps
        (written after that checkpoint, and replayed now) go."""
        if not self.enabled:
            return
        from torch.utils.tensorboard import SummaryWriter
        resolved = yaml.safe_dump(thaw(config), sort_keys=False).encode()
        path = self.run_dir / "metrics.jsonl"
        try:
            if resumed_at is not None and path.exists():
                keep_records_up_to(path, resumed_at)
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

    def record(self, kind, global_step, **values):
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
