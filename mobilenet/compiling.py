"""torch.compile for the run (train.compile): its backend per device, the auto decision from a
cost model measured on an H200, and compiling a module with the resolved backend."""
import importlib.util
import os
import shutil

import torch

from mobilenet.errors import UsageError


def compile_backend(device_type):
    """torch.compile's {backend, mode} for a device type (train.compile): inductor with CUDA graphs
    on cuda (the step's launches collapse into one replay), inductor's C++ code on cpu (needs a
    C++ compiler), torch_npu's torchair on npu; a UsageError where that is missing."""
    if device_type == "cuda":
        return {"backend": "inductor", "mode": "reduce-overhead"}
    if device_type == "npu":
        if importlib.util.find_spec("torchair") is None:
            raise UsageError("train.compile on npu needs torchair (torch_npu's torch.compile backend), "
                             "which is not installed; leave train.compile off")
        return {"backend": "torchair", "mode": None}
    if not (os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        raise UsageError("train.compile on cpu: inductor needs a C++ compiler (g++ or clang++, or CXX), "
                         "and none was found; install one or leave train.compile off")
    return {"backend": "inductor", "mode": None}


# train.compile auto on cuda, from one H200 (2026-12-04, torch 2.11, scripts/bench_device.sh
# compiled, ceiling, loop): compiling the model and the optimizer step (the app's first compiled
# run took 28.5 s, an eager one 3.3 s), and the eager step: the host's floor (batch 64 took 9-15
# ms, host-bound) or the images of MobileNetV1 at width 1.0 / 224 px at the eager rate (9,450-14,443
# img/s at batch 256), scaled by the model's multiply-adds (model.relative_cost).
COMPILE_SECONDS = 25.0
EAGER_HOST_STEP_S = 0.010
EAGER_IMG_PER_S = 12000.0
COMPILE_MAX_SHARE = 0.05  # compiling is worth it when it is at most this share of the run


def eager_seconds_estimate(steps, batch, cost):
    """A cuda run's eager training time, estimated: per step, the host floor or the work of
    ``batch`` images of a model ``cost`` times MobileNetV1's at width 1.0 / 224 px."""
    return steps * max(EAGER_HOST_STEP_S, batch * cost / EAGER_IMG_PER_S)


def choose_compile(setting, device_type, *, steps, batch, cost, eager_only=None, accumulation=1):
    """The compile choice (see auto_compile), without CUDA graphs under gradient accumulation."""
    return without_cuda_graphs(*auto_compile(setting, device_type, steps=steps, batch=batch, cost=cost,
                                             eager_only=eager_only), accumulation)


def auto_compile(setting, device_type, *, steps, batch, cost, eager_only=None):
    """(torch.compile's {backend, mode} or None, why) for train.compile ``setting`` (auto, true,
    false), the one home of that decision. auto: on for cuda when compiling is at most
    COMPILE_MAX_SHARE of the run, whose eager time is estimated from ``steps(limit)`` (the run's
    steps, counted up to ``limit``: a long run's figure is a lower bound), ``batch`` and the model's
    ``cost()`` (model.relative_cost, asked only here); off on cpu (measured slower), on npu (torchair
    has not run here) and where
    ``eager_only`` names what needs the eager step."""
    if setting is not True and setting != "auto":
        return None, "off (train.compile=false)"
    if setting is True:
        return compile_backend(device_type), "on (train.compile=true)"
    if eager_only:
        return None, f"off (auto: {eager_only})"
    if device_type == "cpu":
        return None, "off (auto: on cpu the compiled step measured 0.77x eager at width 1.0 / 224)"
    if device_type == "npu":
        return None, "off (auto: torchair, the npu backend, has not run on an Ascend card here)"
    worth, cost = COMPILE_SECONDS / COMPILE_MAX_SHARE - COMPILE_SECONDS, cost()  # from which it pays
    eager_seconds = eager_seconds_estimate(steps(int(worth / eager_seconds_estimate(1, batch, cost)) + 1), batch, cost)
    share = COMPILE_SECONDS / (COMPILE_SECONDS + eager_seconds)
    if share > COMPILE_MAX_SHARE:
        return None, (f"off (auto: compiling (~{COMPILE_SECONDS:.0f} s) is ~{share:.0%} of this run "
                      f"(~{eager_seconds:.0f} s eager, estimated)")
    return compile_backend(device_type), (f"on (auto: compiling (~{COMPILE_SECONDS:.0f} s) is ~{share:.0%} "
                                          f"or less of this run (~{eager_seconds:.0f} s or more eager, "
                                          f"estimated)")


def without_cuda_graphs(choice, why, accumulation):
    """``choice`` without CUDA graphs when a step accumulates micro-steps' grads (train.grad_accum_steps
    > 1): grads accumulated across graph replays are lost or wrong (pytorch/pytorch#169545, #96693)."""
    if accumulation > 1 and choice and choice.get("mode") == "reduce-overhead":
        return {**choice, "mode": None}, why + (f"; without CUDA graphs: {accumulation} micro-steps accumulate "
                                                f"grads, which graph replays lose (pytorch/pytorch#169545)")
    return choice, why


def compiled(module, backend, mode):
    """``module`` under torch.compile with the resolved backend (torchair's built here, on npu)."""
    if backend == "torchair":  # unrun here: no Ascend device
        import torchair
        return torch.compile(module, backend=torchair.get_npu_backend())
    return torch.compile(module, backend=backend, mode=mode)
