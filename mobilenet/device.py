"""Backends: npu (torch_npu, imported lazily), cuda and cpu."""
import importlib
import os

import torch

from mobilenet.config import UsageError

DIST_BACKENDS = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}


def import_torch_npu():
    """torch_npu if it is installed and imports (it needs CANN and an Ascend card), else None."""
    try:
        return importlib.import_module("torch_npu")
    except ImportError:
        return None


def npu_available():
    return import_torch_npu() is not None and torch.npu.is_available()


def resolve_device(name, local_rank=0):
    """'auto' | 'npu' | 'cuda' | 'cpu' -> the torch.device this process trains on."""
    if name == "auto":
        name = "npu" if npu_available() else "cuda" if torch.cuda.is_available() else "cpu"
    if name == "npu":
        if not npu_available():
            raise UsageError("--device npu: torch_npu is not importable or no Ascend card is visible")
        torch_npu = import_torch_npu()
        torch_npu.npu.set_compile_mode(jit_compile=False)
        torch.npu.set_device(local_rank)
        return torch.device(f"npu:{local_rank}")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is visible")
        torch.cuda.set_device(local_rank)
        return torch.device(f"cuda:{local_rank}")
    return torch.device("cpu")


def device_module(device):
    """torch.cuda / torch.npu for accelerators, None for cpu."""
    return getattr(torch, device.type) if device.type in ("cuda", "npu") else None


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
        return f"cuda ({torch.cuda.get_device_name(device)})"
    if device.type == "npu":
        cards = os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "all")
        return f"npu ({torch.npu.get_device_name(device)}, visible cards {cards})"
    return f"cpu ({torch.get_num_threads()} threads)"
