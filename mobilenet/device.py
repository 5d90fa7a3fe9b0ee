"""The device: which one trains (npu with torch_npu imported lazily, cuda, cpu), opening its card,
and what the run asks of it (synchronize, peak memory, a description)."""
import importlib
import os

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


def open_device(device_type, local_rank=0):
    """The torch.device of this process (the card of its local rank), made current."""
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
