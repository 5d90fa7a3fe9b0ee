"""Run output of rank 0: console lines, TensorBoard scalars and metrics.jsonl."""
import json
from pathlib import Path

from mobilenet.config import UsageError


class RunLogger:
    """Writes nothing on ranks other than 0 (``enabled=False``) except errors."""

    def __init__(self, run_dir, enabled=True):
        self.enabled = enabled
        self.tensorboard = self.metrics = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter
            try:
                Path(run_dir).mkdir(parents=True, exist_ok=True)
                self.metrics = open(Path(run_dir) / "metrics.jsonl", "a")
            except OSError as e:
                raise UsageError(f"--output {run_dir}: cannot write there ({e.strerror})") from None
            self.tensorboard = SummaryWriter(str(run_dir))

    def info(self, message):
        if self.enabled:
            print(message, flush=True)

    def record(self, kind, step, **values):
        """One metrics.jsonl line and one TensorBoard scalar per value, tagged ``kind/name``."""
        if not self.enabled:
            return
        for name, value in values.items():
            if name != "epoch":
                self.tensorboard.add_scalar(f"{kind}/{name}", value, step)
        self.metrics.write(json.dumps({"kind": kind, "step": step, **values}) + "\n")
        self.metrics.flush()

    def close(self):
        if self.enabled:
            self.tensorboard.close()
            self.metrics.close()
