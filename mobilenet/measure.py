"""What the training loop measures about itself: dispatched-op counts (per step phase), the step's
time breakdown, the other processes' share of the CPU, profiler traces. Below the engine; the
benchmark harness that drives whole runs is mobilenet.harness, above it."""
import contextlib
import os
import time
from collections import defaultdict
from pathlib import Path

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


class PhaseOps:
    """A TrainStep phase hook that counts the aten ops of each phase (forward, loss, backward,
    unscale, optimizer, zero_grad, ema) into ``counts``."""

    def __init__(self):
        self.counts = defaultdict(int)

    @contextlib.contextmanager
    def phase(self, name):
        with OpCounter() as counter:
            yield
        self.counts[name] += counter.count


def cpu_seconds():
    """(CPU seconds the whole machine has been busy, steal included, as /proc/stat counts them;
    CPU seconds of this process and its reaped children)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    own = os.times()
    return busy, own.user + own.system + own.children_user + own.children_system


class OtherLoad:
    """The share of the machine's CPU that other processes (and the hypervisor's steal) took since
    it was made (``so_far()``) or while the ``with`` block ran (``share``): (busy - own) /
    (wall x cores), from /proc/stat."""

    def __init__(self):
        self.start = (time.perf_counter(), *cpu_seconds())

    def so_far(self):
        wall, busy, own = (b - a for a, b in zip(self.start, (time.perf_counter(), *cpu_seconds())))
        return max(0.0, busy - own) / max(wall * os.cpu_count(), 1e-9)

    def __enter__(self):
        self.start = (time.perf_counter(), *cpu_seconds())
        return self

    def __exit__(self, *exc):
        self.share = self.so_far()


PHASES = ("input", "forward", "loss", "backward", "unscale", "optimizer", "zero_grad", "ema",
          "scheduler")
OPTIMIZER_PHASES = ("unscale", "optimizer", "zero_grad")


class StepBreakdown:
    """A TrainStep phase hook: seconds in the optimizer's phases (unscale, step, master copy,
    zero_grad), with the device synchronized around them, which costs some speed (for
    comparisons: train.measure_breakdown, not production runs). The ops of every phase are
    counted once, on the third step (after lazy state init), which is then not timed."""

    def __init__(self, device):
        self.device = device
        self.optimizer_s = 0.0
        self.steps = self.timed_steps = 0
        self.ops = PhaseOps()

    @contextlib.contextmanager
    def phase(self, name):
        if name == "forward":
            self.steps += 1
        if self.steps == 3 and name in PHASES:  # not the loop's wait for data
            with self.ops.phase(name):
                yield
        elif name not in OPTIMIZER_PHASES:
            yield
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
        counted = self.steps >= 3
        return {"step_ms": 1000 * train_time / steps, "optimizer_ms": optimizer_ms,
                "optimizer_share": optimizer_ms / 1000 * steps / train_time,
                "data_wait_share": data_wait_s / train_time,
                "optimizer_ops_per_step": sum(self.ops.counts[p] for p in OPTIMIZER_PHASES) if counted else None,
                "step_ops_per_step": sum(self.ops.counts.values()) if counted else None}


PROFILED_STEPS = 10


def profiler(device, folder, enabled):
    """torch.profiler (torch_npu.profiler on npu) over steps 3-12 (PROFILED_STEPS), a TensorBoard
    trace in ``folder``; call .step() after every training step. A no-op when not enabled."""
    if not enabled:
        return contextlib.nullcontext(NoProfiler())
    module = import_torch_npu().profiler if device.type == "npu" else torch.profiler
    activities = [module.ProfilerActivity.CPU]
    if device.type in ("cuda", "npu"):
        activities.append(getattr(module.ProfilerActivity, device.type.upper()))
    return module.profile(activities=activities,
                          schedule=module.schedule(wait=1, warmup=1, active=PROFILED_STEPS, repeat=1),
                          on_trace_ready=module.tensorboard_trace_handler(str(folder)))


def named_phase(name):
    """A TrainStep phase hook that marks each phase as a range in a profiler trace."""
    return torch.profiler.record_function(name)


class NoProfiler:
    def step(self):
        pass
