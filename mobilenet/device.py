"""The device (npu with torch_npu imported lazily, cuda, cpu), compiling for it, the host's cores."""
import importlib
import importlib.util
import math
import os
import shutil
from pathlib import Path

import torch

from mobilenet.errors import UsageError


DIST_BACKENDS = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}
DEVICES = ("auto", *DIST_BACKENDS)  # what device= and --device take (the one list)


def import_torch_npu():
    """torch_npu if it is installed and imports (it needs CANN and an Ascend card), else None."""
    try:
        return importlib.import_module("torch_npu")
    except ImportError:
        return None


def npu_available():
    return import_torch_npu() is not None and torch.npu.is_available()


def choose_device(name):
    """'auto' | 'npu' | 'cuda' | 'cpu' -> the device type this machine trains on."""
    if name == "auto":
        return "npu" if npu_available() else "cuda" if torch.cuda.is_available() else "cpu"
    if name == "npu" and not npu_available():
        raise UsageError("--device npu: torch_npu is not importable or no Ascend card is visible")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible")
    return name


def open_device(device_type, local_rank=0, deterministic=False):
    """This process's torch.device, made current; ``deterministic``: torch's deterministic kernels only."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    if device_type == "cpu":
        return torch.device("cpu")
    if device_type == "npu":
        import_torch_npu().npu.set_compile_mode(jit_compile=False)
    device_module(device_type).set_device(local_rank)
    return torch.device(device_type, local_rank)


def card_count(device_type):
    return device_module(device_type).device_count()


def device_module(device):
    """torch.cuda / torch.npu for accelerators (a torch.device or its type), None for cpu."""
    kind = getattr(device, "type", device)
    return getattr(torch, kind) if kind in ("cuda", "npu") else None


def synchronize(device):
    module = device_module(device)
    if module is not None:
        module.synchronize()


def peak_memory_mb(device):
    """Peak allocated device memory (accelerators) or peak resident set size (cpu), in MiB."""
    module = device_module(device)
    if module is not None:
        return module.max_memory_allocated(device) / 2**20
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def describe(device):
    if device.type == "cuda":
        return f"cuda:{device.index} ({torch.cuda.get_device_name(device)})"
    if device.type == "npu":
        cards = os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "all")
        return f"npu:{device.index} ({torch.npu.get_device_name(device)}, visible cards {cards})"
    return f"cpu ({torch.get_num_threads()} threads)"


def compile_backend(device_type):
    """torch.compile's {backend, mode} for the device type; a UsageError where that is missing."""
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


# train.compile auto on cuda, from one H200 (2026-12-04, torch 2.11, scripts/bench_device.sh): compiling
# took 28.5 s against 3.3 s eager; an eager step is the host's floor (9-15 ms at batch 64) or MobileNetV1's
# rate (9,450-14,443 img/s at batch 256) scaled by the model's multiply-adds.
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
    """({backend, mode} or None, why) for train.compile. auto: on for cuda when compiling is at most
    COMPILE_MAX_SHARE of the run's estimated eager time (``steps``, ``batch``, ``cost()``); off on
    cpu (measured slower), on npu (unrun) and where ``eager_only`` names what needs eager."""
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
    """``choice`` without CUDA graphs under accumulation, whose grads replays lose (pytorch/pytorch#169545)."""
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


def usable_cores():
    """The cores this process may use: its affinity and its cgroup's CPU quota, rounded up."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else cores


def cpu_quota():
    """The CPUs this process's cgroup may use (2.5, say), or None; cgroup v2 or v1."""
    try:
        memberships = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
        mounts = [line.split(" - ") for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    except OSError:
        return None
    limits = []
    for before, after in (m for m in mounts if len(m) == 2):
        fields, (fstype, _, options) = before.split(), after.split()[:3]
        root, mount_point = fields[3], fields[4]
        for _, controllers, path in memberships:
            if fstype == "cgroup2" and controllers == "":
                files = ("cpu.max",)
            elif fstype == "cgroup" and "cpu" in controllers.split(",") and "cpu" in options.split(","):
                files = ("cpu.cfs_quota_us", "cpu.cfs_period_us")
            else:
                continue
            folder = Path(mount_point) / os.path.relpath(path, root)
            while folder.is_relative_to(mount_point):  # this cgroup and the ones above it
                limits.append(quota_in(folder, files))
                folder = folder.parent
    limits = [limit for limit in limits if limit]
    return min(limits) if limits else None


def quota_in(folder, files):
    """CPUs of the quota that ``files`` in a cgroup ``folder`` set, or None (none, or unreadable)."""
    try:
        values = " ".join((folder / name).read_text().strip() for name in files).split()
        quota, period = int(values[0]), int(values[1])  # cpu.max: 'max 100000' when there is none
    except (OSError, ValueError, IndexError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def cpuinfo_field(name):
    """The first value of ``name`` in /proc/cpuinfo ('' where there is none)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo
                         if line.split(":", 1)[0].strip() == name), "")
    except OSError:
        return ""


def cpu_bf16_features():
    """This CPU's bfloat16 units that torch uses (AMX, AVX512-BF16), from /proc/cpuinfo; [] elsewhere."""
    flags = cpuinfo_field("flags").split()
    return [name for flag, name in (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"))
            if flag in flags]


def cpu_model():
    """The CPU and its bfloat16 units, for benchmark tables: 'CPU AMD EPYC, bf16 units: none'."""
    return (f"CPU {cpuinfo_field('model name') or 'unknown'}, bf16 units: "
            f"{', '.join(cpu_bf16_features()) or 'none'}")
