"""Measurement helpers: dispatched-op counts, the step's time breakdown, profiler traces."""
import contextlib
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mobilenet.device import import_torch_npu, synchronize


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside the ``with`` block (what an accelerator launches)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn):
    with OpCounter() as counter:
        fn()
    return counter.count


class StepBreakdown:
    """A TrainStep phase hook: seconds in the optimizer's phases (unscale, step, master copy,
    zero_grad), with the device synchronized around them, which costs some speed (for
    comparisons: train.measure_breakdown, not production runs). The ops of those phases are
    counted once, on the third step (after lazy state init), which is then not timed."""

    OPTIMIZER_PHASES = ("unscale", "optimizer", "zero_grad")

    def __init__(self, device):
        self.device = device
        self.optimizer_s = 0.0
        self.steps = self.timed_steps = 0
        self.optimizer_ops = None

    @contextlib.contextmanager
    def phase(self, name):
        if name == "forward":
            self.steps += 1
        if name not in self.OPTIMIZER_PHASES:
            yield
        elif self.steps == 3:
            with OpCounter() as counter:
                yield
            self.optimizer_ops = (self.optimizer_ops or 0) + counter.count
        else:
            self.timed_steps += name == "unscale"
            synchronize(self.device)
            start = time.perf_counter()
            yield
            synchronize(self.device)
            self.optimizer_s += time.perf_counter() - start

    def summary(self, train_time, data_wait_s, steps):
        """Shares of the training time and per-step figures, for summary.json."""
        if not steps or not train_time:
            return {}
        optimizer_ms = 1000 * self.optimizer_s / max(1, self.timed_steps)
        return {"step_ms": 1000 * train_time / steps, "optimizer_ms": optimizer_ms,
                "optimizer_share": optimizer_ms / 1000 * steps / train_time,
                "data_wait_share": data_wait_s / train_time,
                "optimizer_ops_per_step": self.optimizer_ops}


def profiler(device, folder, enabled):
    """torch.profiler (torch_npu.profiler on npu) over steps 2-6, TensorBoard traces in
    ``folder``; call .step() after every training step. A no-op when not enabled."""
    if not enabled:
        return contextlib.nullcontext(NoProfiler())
    module = import_torch_npu().profiler if device.type == "npu" else torch.profiler
    activities = [module.ProfilerActivity.CPU]
    if device.type in ("cuda", "npu"):
        activities.append(getattr(module.ProfilerActivity, device.type.upper()))
    return module.profile(activities=activities,
                          schedule=module.schedule(wait=1, warmup=1, active=5, repeat=1),
                          on_trace_ready=module.tensorboard_trace_handler(str(folder)))


class NoProfiler:
    def step(self):
        pass
