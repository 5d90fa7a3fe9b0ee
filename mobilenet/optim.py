"""Optimizer factory (standard per-parameter loop vs fused, per device) and LR schedules."""
import math

import torch

from mobilenet.device import import_torch_npu

TORCH_OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam,
                    "adamw": torch.optim.AdamW, "rmsprop": torch.optim.RMSprop}
# torch_npu.optim classes: combined contiguous buffers, a few ops per step for all parameters.
NPU_FUSED = {"sgd": "NpuFusedSGD", "adam": "NpuFusedAdam",
             "adamw": "NpuFusedAdamW", "rmsprop": "NpuFusedRMSprop"}


def param_groups(params, weight_decay, no_decay_bn_bias):
    """One group, or two when BatchNorm and bias parameters (the 1-d ones) get no weight decay."""
    params = [p for p in params if p.requires_grad]
    if not no_decay_bn_bias:
        return [{"params": params, "weight_decay": weight_decay}]
    return [{"params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}]


def hyperparameters(name, lr, momentum, nesterov, betas, eps, alpha):
    if name == "sgd":
        return {"lr": lr, "momentum": momentum, "nesterov": nesterov}
    if name in ("adam", "adamw"):
        return {"lr": lr, "betas": tuple(betas), "eps": eps}
    return {"lr": lr, "momentum": momentum, "alpha": alpha, "eps": eps}


def build_optimizer(model, name="sgd", impl="standard", lr=0.1, momentum=0.9, weight_decay=0.0,
                    device="cpu", nesterov=False, no_decay_bn_bias=False, betas=(0.9, 0.999),
                    eps=1e-8, alpha=0.99, params=None):
    """The optimizer for ``name`` in the ``impl`` flavour that suits ``device``.

    standard: torch's per-parameter loop (foreach=False), several small ops per tensor.
    fused: torch_npu.optim.NpuFused* on npu; torch's fused kernel (fused=True) on cuda and cpu;
    RMSprop has no torch fused kernel, so it takes the multi-tensor (foreach) path there.
    ``params`` replaces ``model.parameters()`` (amp O2 passes its fp32 master copies).
    """
    if name not in TORCH_OPTIMIZERS or impl not in ("standard", "fused"):
        raise ValueError(f"unknown optimizer {name!r}/{impl!r}")
    groups = param_groups(model.parameters() if params is None else params,
                          weight_decay, no_decay_bn_bias)
    kwargs = hyperparameters(name, lr, momentum, nesterov, betas, eps, alpha)
    if impl == "standard":
        return TORCH_OPTIMIZERS[name](groups, foreach=False, **kwargs)
    if str(device).split(":")[0] == "npu":
        return getattr(import_torch_npu().optim, NPU_FUSED[name])(groups, **kwargs)
    if name == "rmsprop":
        return torch.optim.RMSprop(groups, foreach=True, **kwargs)
    return TORCH_OPTIMIZERS[name](groups, fused=True, **kwargs)


def is_npu_fused(optimizer):
    return type(optimizer).__name__.startswith("NpuFused")


def describe_optimizer(optimizer):
    """Which implementation runs, for the log: e.g. 'SGD (fused kernel)'."""
    cls = type(optimizer).__name__
    if is_npu_fused(optimizer):
        return f"{cls} (torch_npu combined buffers)"
    if optimizer.defaults.get("fused"):
        return f"{cls} (fused kernel)"
    if optimizer.defaults.get("foreach"):
        return f"{cls} (multi-tensor foreach: torch has no fused {cls} kernel)"
    return f"{cls} (per-parameter loop, foreach=False)"


def zero_grad(optimizer):
    """NpuFused* keep the grads inside their combined buffer and reject set_to_none=True."""
    optimizer.zero_grad(set_to_none=not is_npu_fused(optimizer))


def lr_factor_fn(name, steps_per_epoch, epochs, step_epochs=30, gamma=0.1, warmup_epochs=0.0,
                 warmup_start_factor=0.1, min_factor=0.0):
    """Multiplier of the base LR at each iteration: linear warm-up, then step or cosine decay."""
    warmup = round(warmup_epochs * steps_per_epoch)
    total = epochs * steps_per_epoch

    def factor(step):
        if step < warmup:
            return warmup_start_factor + (1 - warmup_start_factor) * step / warmup
        if name == "step":
            return gamma ** (step // (step_epochs * steps_per_epoch))
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def build_scheduler(optimizer, schedule, base_lr, steps_per_epoch, epochs):
    """Per-iteration LambdaLR from the ``schedule`` config section."""
    factor = lr_factor_fn(schedule["name"], steps_per_epoch, epochs, schedule["step_epochs"],
                          schedule["gamma"], schedule["warmup_epochs"],
                          schedule["warmup_start_factor"], schedule["min_lr"] / base_lr)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
