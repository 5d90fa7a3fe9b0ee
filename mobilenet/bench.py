"""Measurement helpers: dispatched-op counts, step-time breakdown, profiler traces."""
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
    """Seconds waiting for data and in the optimizer step (unscale, step, master copy, zero_grad).

    Enabled, it synchronizes the device around both, which costs some speed: for comparisons
    (train.measure_breakdown), not for production runs. Disabled, it only calls the step.
    The ops of one optimizer step are counted once, on the third step (after lazy state init)."""

    def __init__(self, device, enabled):
        self.device, self.enabled = device, enabled
        self.data_s = self.optimizer_s = 0.0
        self.steps = 0
        self.optimizer_ops = None

    def start_wait(self):
        if self.enabled:
            synchronize(self.device)
            self._wait_start = time.perf_counter()

    def end_wait(self):
        if self.enabled:
            self.data_s += time.perf_counter() - self._wait_start

    def optimizer_step(self, step):
        if not self.enabled:
            return step()
        self.steps += 1
        if self.steps == 3 and self.optimizer_ops is None:
            self.optimizer_ops = count_ops(step)
            return
        synchronize(self.device)
        start = time.perf_counter()
        step()
        synchronize(self.device)
        self.optimizer_s += time.perf_counter() - start

    def summary(self, train_time, steps):
        """Shares of the training time and per-step figures, for summary.json."""
        if not self.enabled or not steps:
            return {}
        timed = max(1, self.steps - (self.optimizer_ops is not None))
        return {"step_ms": 1000 * train_time / steps,
                "optimizer_ms": 1000 * self.optimizer_s / timed,
                "optimizer_share": self.optimizer_s / timed * steps / train_time,
                "data_wait_share": self.data_s / train_time,
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
