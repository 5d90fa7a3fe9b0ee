"""What the training loop measures about itself: an epoch's time, the run's clock, op counts and
the step's breakdown, the other processes' share of the CPU, profiler traces."""
import contextlib
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mobilenet.device import synchronize
from mobilenet.device import import_torch_npu
from mobilenet.distributed import all_reduce_sum


class Interval(NamedTuple):
    """One log interval, measured: what the progress line and the records report."""
    img_per_s: float   # this interval's own rate
    data_wait: float   # share of the interval spent waiting for data
    step_time: float   # steady seconds per step (the rates and ETAs of the progress line)
    elapsed: float     # seconds since the run started


class EpochMeter:
    """Where one epoch's time goes: data waits (``waiting``), the interval's loss (``add``, on the
    device) and timing (``end_interval``), in global steps from ``at_step``."""

    def __init__(self, *, device, world_size, global_batch, run_start, at_step, sync_wait=False):
        self.device, self.world_size, self.global_batch = device, world_size, global_batch
        self.sync_wait = sync_wait  # under train.measure_breakdown: compute does not count as wait
        self.run_start, self.first = run_start, at_step
        self.start = self.interval_start = time.perf_counter()
        self.loss_sum = torch.zeros((), device=device)
        self.interval_steps = 0
        self.wait_s = self.interval_wait_s = 0.0
        self.steady = None  # (time, step) at the end of the first logged interval
        self.compile_s = 0.0
        self.seconds = 0.0

    def elapsed(self):
        """Seconds since the epoch began, the device's work included (a sync)."""
        synchronize(self.device)
        return time.perf_counter() - self.start

    @contextlib.contextmanager
    def waiting(self):
        """A wait for data, timed on the host (after a device sync with ``sync_wait``)."""
        if self.sync_wait:
            synchronize(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            waited = time.perf_counter() - start
            self.wait_s += waited
            self.interval_wait_s += waited

    def add(self, loss):
        self.loss_sum += loss.float()
        self.interval_steps += 1

    def interval_loss(self):
        """The mean loss of the interval that ends now, over all processes (reads the device)."""
        return all_reduce_sum(self.loss_sum).item() / self.interval_steps / self.world_size

    def end_interval(self, step):
        """The interval that ends at ``step``: its img/s and data wait, and the steady seconds a step
        (counted from the first interval's end, which has its own rate)."""
        synchronize(self.device)
        now = time.perf_counter()
        seconds = now - self.interval_start
        if self.steady is None:
            self.steady = (now, step)
            step_time = seconds / self.interval_steps
        else:
            step_time = (now - self.steady[0]) / (step - self.steady[1])
        interval = Interval(img_per_s=self.global_batch * self.interval_steps / seconds,
                            data_wait=self.interval_wait_s / seconds, step_time=step_time,
                            elapsed=now - self.run_start)
        self.loss_sum.zero_()
        self.interval_start, self.interval_steps, self.interval_wait_s = now, 0, 0.0
        return interval

    def leave_out(self, step):
        """After a step that compiled: the clocks start again; returns such steps' seconds so far."""
        synchronize(self.device)
        now = time.perf_counter()
        self.compile_s += now - self.start
        self.start = self.interval_start = now
        self.first, self.wait_s, self.interval_wait_s = step, 0.0, 0.0
        return self.compile_s

    def totals(self, step):
        """Images all processes trained, seconds and data wait of this epoch, up to ``step``."""
        self.seconds = self.elapsed()
        return {"images": (step - self.first) * self.global_batch, "seconds": self.seconds,
                "data_wait_s": self.wait_s}


# Steps that compile under train.compile: the model and the optimizer at the first, the optimizer
# again at the second (its momentum/moment state exists from then on, another code path).
COMPILE_STEPS = 2


class RunClock:
    """The first step's time, the compiling steps (left out of the rates) and the last validation's."""

    def __init__(self, compiled):
        self.compiling = COMPILE_STEPS if compiled else 0
        self.first_step_s, self.val_seconds = None, 0.0

    def after_step(self, meter, global_step, mid_epoch):
        """(whether the step compiled, all compiling steps' seconds after the last one, else None)."""
        if self.first_step_s is None:
            self.first_step_s = meter.elapsed()
        if not (self.compiling and mid_epoch):
            return False, None
        self.compiling -= 1
        seconds = meter.leave_out(global_step)
        return True, None if self.compiling else seconds


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside the ``with`` block (what an accelerator launches)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


class PhaseOps:
    """A TrainStep phase hook that counts each phase's aten ops into ``counts``."""

    def __init__(self):
        self.counts = defaultdict(int)

    @contextlib.contextmanager
    def phase(self, name):
        with OpCounter() as counter:
            yield
        self.counts[name] += counter.count


def cpu_seconds():
    """(the machine's busy CPU seconds, steal included; this process's and its children's)."""
    tick = os.sysconf("SC_CLK_TCK")
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    own = os.times()
    return ((user + nice + system + irq + softirq + steal) / tick,
            own.user + own.system + own.children_user + own.children_system + live_children_ticks() / tick)


def live_children_ticks():
    """CPU clock ticks (user and system) of this process's live children, from /proc."""
    me, ticks = str(os.getpid()), 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if fields[1] == me:  # fields after the name: state, ppid, ..., utime (12), stime (13)
            ticks += int(fields[11]) + int(fields[12])
    return ticks


class OtherLoad:
    """The CPU share others took since it was made (``so_far()``) or in the block (``share``)."""

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


PHASES = ("forward", "loss", "backward", "unscale", "optimizer", "zero_grad", "ema")  # a TrainStep's
OPTIMIZER_PHASES = ("unscale", "optimizer", "zero_grad")


class StepBreakdown:
    """A TrainStep phase hook (train.measure_breakdown): the optimizer phases' seconds, the device
    synchronized around them; each phase's ops counted over the third optimizer step (all its
    forwards), which is not timed."""

    def __init__(self, device):
        self.device = device
        self.optimizer_s = 0.0
        self.steps = self.timed_steps = 0  # optimizer steps begun; timed
        self.stepped = True  # the last phase was the optimizer's: the next forward begins a step
        self.ops = PhaseOps()

    @contextlib.contextmanager
    def phase(self, name):
        if name == "forward" and self.stepped:
            self.steps, self.stepped = self.steps + 1, False
        self.stepped = self.stepped or name == "unscale"
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
    """torch.profiler (torch_npu's on npu) over steps 3-12, a TensorBoard trace in ``folder``."""
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
