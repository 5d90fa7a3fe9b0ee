"""Profiler traces of a few steps (train.profile): torch.profiler (torch_npu.profiler on npu) with
the step's phases marked as ranges, written for TensorBoard."""
import contextlib

import torch

from mobilenet.device import import_torch_npu

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
