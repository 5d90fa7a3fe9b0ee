"""Measurement helpers: dispatched-op counts (per step phase), the step's time breakdown, benchmark
rounds that stay true on a shared machine, profiler traces."""
import contextlib
import os
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
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


@dataclass
class Rounds:
    """Measurements of variants taken in interleaved rounds; rounds in which other processes took
    more than ``max_other`` of the machine are dropped (all kept if every round was loaded)."""
    values: list          # per round: {variant: measurement}
    other: list           # per round: the other processes' share of the machine
    max_other: float

    @property
    def kept(self):
        kept = [i for i, share in enumerate(self.other) if share <= self.max_other]
        return kept or list(range(len(self.values)))

    def median(self, name):
        return statistics.median(self.values[i][name] for i in self.kept)

    def spread(self, name):
        """(min, max) over the kept rounds."""
        kept = [self.values[i][name] for i in self.kept]
        return min(kept), max(kept)

    def ratios(self, name, base):
        """Per kept round: measurement of ``name`` / that of ``base`` (the same round)."""
        return [self.values[i][name] / self.values[i][base] for i in self.kept]

    def ratio(self, name, base):
        """(median, min, max) of the per-round ratios."""
        ratios = self.ratios(name, base)
        return statistics.median(ratios), min(ratios), max(ratios)

    def describe(self):
        dropped = len(self.values) - len(self.kept)
        loads = ", ".join(f"{share:.0%}" for share in self.other)
        note = (f"{dropped} dropped for other load above {self.max_other:.0%}" if len(self.kept) < len(self.values)
                else f"none above {self.max_other:.0%}" if max(self.other) <= self.max_other
                else f"all above {self.max_other:.0%}: none dropped, read with care")
        return f"{len(self.values)} interleaved rounds; other processes' CPU per round: {loads} ({note})"

    def to_json(self):
        return {"rounds": self.values, "other_cpu_share": self.other, "max_other": self.max_other,
                "kept_rounds": self.kept}


def interleave(variants, rounds=5, max_other=0.25):
    """Runs every variant (name -> function returning a measurement) once per round, in the given
    order on even rounds and reversed on odd ones, so that a slow spell hits all of them; records
    the other processes' CPU share in each round."""
    values, other = [], []
    names = list(variants)
    for r in range(rounds):
        with OtherLoad() as load:
            values.append({name: variants[name]() for name in (names if r % 2 == 0 else names[::-1])})
        other.append(load.share)
    return Rounds(values, other, max_other)


def training_img_per_s(config, overrides, steps=12, log_every=4):
    """img/s of the app's own loop (engine.run, in this process) over a short run of ``config`` with
    ``overrides``: ``steps`` steps of one epoch, from its progress intervals after the first (the
    warm-up); writes nothing that stays."""
    import contextlib
    import io
    import json
    import tempfile

    from mobilenet.config import build_config, resolve
    from mobilenet.engine import run
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
        cfg = build_config(config, [*overrides, "train.epochs=1", f"train.max_steps_per_epoch={steps}",
                                    f"train.log_every={log_every}"], settings={"output": out})
        run(resolve(cfg))
        records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    rates = [r["img_per_s"] for r in records if r["kind"] == "train"]
    rates = rates[1:] or rates  # without the warm-up interval where there are others
    return len(rates) / sum(1 / rate for rate in rates)  # equal images per interval


PHASES = ("input", "forward", "loss", "backward", "unscale", "optimizer", "zero_grad", "ema",
          "scheduler")
OPTIMIZER_PHASES = ("unscale", "optimizer", "zero_grad")


def op_budget(cfg, device, warmup=3):
    """{phase: aten ops dispatched} of one training step of the resolved ``cfg`` on ``device``,
    after ``warmup`` steps (lazy optimizer state): the input copy and normalisation, the
    TrainStep's phases and the LR schedule's step. Each op is a kernel launch on an accelerator."""
    from mobilenet.data.prefetch import DevicePrefetcher
    from mobilenet.optim import build_scheduler
    from mobilenet.step import build_train_step, no_phase
    step = build_train_step(cfg, device)
    step.train()
    scheduler = build_scheduler(step.optimizer, schedule=cfg["schedule"], base_lr=cfg["derived"]["lr"],
                                steps_per_epoch=100, epochs=1)
    size, batch = cfg["model"]["resolution"], cfg["data"]["batch_size"]
    generator = torch.Generator().manual_seed(0)
    raw = [(torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, generator=generator),
            torch.randint(0, cfg["model"]["num_classes"], (batch,), generator=generator))]

    def prefetch():
        return next(iter(DevicePrefetcher(raw, device, cfg["derived"]["channels_last"],
                                          step.precision.input_dtype)))
    for _ in range(warmup):
        step(*prefetch())
        scheduler.step()
    with OpCounter() as counter:
        images, labels = prefetch()
    counts = dict.fromkeys(PHASES, 0)
    counts["input"] = counter.count
    phases = PhaseOps()
    step.phase = phases.phase
    step(images, labels)
    step.phase = no_phase
    counts.update(phases.counts)
    counts["scheduler"] = count_ops(scheduler.step)
    return counts


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
        if self.steps == 3:
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
