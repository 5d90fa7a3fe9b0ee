"""Optimizers: one table of algorithms, one of implementations, and one of LR schedules.

An implementation is how an algorithm's step runs, from most launches to fewest: loop (foreach=False:
several ops per tensor), foreach (one op per operation for all tensors), torch_fused (fused=True: one
kernel), npu_fused (torch_npu's NpuFused*: params, grads and state in contiguous buffers),
apex_npu_fused (Ascend apex's, whose buffers apex amp combines), plain (the class's own step).
``optim.impl=standard`` runs what torch runs unmodified; ``fused`` the device's fused one.
"""
import importlib
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.optim.optimizer as torch_optimizer  # the module torch_npu patches

from mobilenet.device import import_torch_npu
from mobilenet.errors import UsageError
from mobilenet.tables import Setting, row_settings


@dataclass(frozen=True)
class Algorithm:
    torch_class: type        # any torch.optim.Optimizer: a class outside torch too
    hyperparameters: dict    # {name: Setting}: the optim.* settings it takes besides lr and weight_decay
    kernels: tuple = ("foreach", "fused")  # the implementation flags its class takes
    npu_fused: str = None    # its class in torch_npu.optim and in apex.optimizers, where there is one


MOMENTUM, EPS = Setting(0.9, "[0, 1)"), Setting(1.0e-8, "(0, inf)")
BETAS = Setting([0.9, 0.999], "[0, 1)")  # adam's two running-average factors

# The algorithms (optim.name): config's schema and checks take each row's own settings.
ALGORITHMS = {
    "sgd": Algorithm(torch.optim.SGD, {"momentum": MOMENTUM, "nesterov": Setting(False)}, npu_fused="NpuFusedSGD"),
    "adam": Algorithm(torch.optim.Adam, {"betas": BETAS, "eps": EPS}, npu_fused="NpuFusedAdam"),
    "adamw": Algorithm(torch.optim.AdamW, {"betas": BETAS, "eps": EPS}, npu_fused="NpuFusedAdamW"),
    "rmsprop": Algorithm(torch.optim.RMSprop, {"momentum": MOMENTUM, "alpha": Setting(0.99, "[0, 1)"), "eps": EPS},
                         ("foreach",), "NpuFusedRMSprop"),
}


def algorithm_settings():
    """{name: Setting} of every algorithm's own settings: the optim.* schema they add to config."""
    return row_settings("optim.ALGORITHMS", {name: row.hyperparameters for name, row in ALGORITHMS.items()})


def schedule_settings():
    """{name: Setting} of every schedule's own settings and the warm-up's: the schedule.* schema."""
    return {**row_settings("optim.SCHEDULES", {name: row.settings for name, row in SCHEDULES.items()}), **WARMUP}


def npu_fused_class(module_name):
    def build(algorithm, groups, kwargs):
        module = import_torch_npu().optim if module_name == "torch_npu" else importlib.import_module(module_name)
        return getattr(module, algorithm.npu_fused)(groups, **kwargs)
    return build


@dataclass(frozen=True)
class Implementation:
    """How an algorithm's step runs, and what that implies for the rest of the step. ``settings``:
    the optim.* overrides that select it (compare_optimizers.sh and the benchmarks)."""
    build: Callable
    describe: str
    grads_to_none: bool      # zero_grad(set_to_none=True); NpuFused* reject it (combined grads)
    skip_on_device: bool     # the scaler's overflow skip stays on the device (found_inf)
    compile_step: bool       # train.compile compiles optimizer.step (not NpuFused*, not under apex)
    settings: tuple = ()


IMPLEMENTATIONS = {
    "loop": Implementation(lambda a, groups, kw: a.torch_class(groups, foreach=False, **kw),
                           "per-parameter loop, foreach=False", True, False, True,
                           ("optim.impl=standard", "optim.foreach=false")),
    "foreach": Implementation(lambda a, groups, kw: a.torch_class(groups, foreach=True, **kw),
                              "multi-tensor foreach", True, False, True, ("optim.impl=standard", "optim.foreach=true")),
    "torch_fused": Implementation(lambda a, groups, kw: a.torch_class(groups, fused=True, **kw), "fused kernel",
                                  True, True, True, ("optim.impl=fused",)),
    "npu_fused": Implementation(npu_fused_class("torch_npu"), "torch_npu combined buffers", False, False, False),
    "apex_npu_fused": Implementation(npu_fused_class("apex.optimizers"), "buffers combined by apex amp",
                                     False, False, False),
    "plain": Implementation(lambda a, groups, kw: a.torch_class(groups, **kw), "its own step: it takes neither "
                            "foreach nor fused", True, False, True),
}
SETTINGS = {name: list(impl.settings) for name, impl in IMPLEMENTATIONS.items() if impl.settings}  # a view


def torch_default_foreach(device):
    """Whether torch's optimizers take foreach here: its list, which torch_npu patches (A2/A3, not 910A)."""
    return device in torch_optimizer._get_foreach_kernels_supported_devices()


def choose_implementation(*, name, impl, device, foreach="auto", amp_backend="none"):
    """The key of IMPLEMENTATIONS for the algorithm, optim.impl, the device, foreach and amp backend."""
    kernels, npu_fused = ALGORITHMS[name].kernels, ALGORITHMS[name].npu_fused
    if impl == "fused":
        if amp_backend == "apex" and npu_fused:
            return "apex_npu_fused"
        if device == "npu" and npu_fused:
            return "npu_fused"
        return "torch_fused" if "fused" in kernels else "foreach" if "foreach" in kernels else "plain"
    if "foreach" not in kernels:
        return "plain"
    if foreach == "auto":
        foreach = torch_default_foreach(device)
    return "foreach" if foreach else "loop"


def hyperparameters(optim):
    """The settings of the ``optim`` config section that its algorithm takes, as keyword arguments."""
    return {key: optim[key] for key in ALGORITHMS[optim["name"]].hyperparameters}


class SettingsAccepted(Exception):
    """Raised where the class first reads its parameters: it has checked its settings by then."""


def no_parameters():
    raise SettingsAccepted
    yield


def check_settings(optim):
    """One line where the algorithm's class refuses the settings together (SGD's nesterov without
    momentum): its own check, asked of no parameter (one imports torch's compiler: seconds)."""
    algorithm, hyper = ALGORITHMS[optim["name"]], hyperparameters(optim)
    try:
        algorithm.torch_class(no_parameters(), lr=optim["lr"], **hyper)  # weight decay is each group's
    except SettingsAccepted:
        pass
    except ValueError as e:
        given = ", ".join(f"optim.{key}={value}" for key, value in hyper.items())
        raise UsageError(f"optim.name={optim['name']} with {given}: {algorithm.torch_class.__name__} refuses "
                         f"them together ({e}); change one of them") from None


NORMS = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm,
         torch.nn.modules.instancenorm._InstanceNorm, torch.nn.LocalResponseNorm)


def parameter_decays(net, optim):
    """Each parameter's weight decay, as torchvision's references split them: optim.bias_weight_decay
    for a bias, optim.norm_weight_decay for a norm layer's, each where given; else weight_decay."""
    norm, bias, decays = optim["norm_weight_decay"], optim["bias_weight_decay"], {}
    for module in net.modules():
        for name, param in module.named_parameters(recurse=False):
            own = bias if name == "bias" and bias != "auto" else norm if isinstance(module, NORMS) else "auto"
            decays[id(param)] = optim["weight_decay"] if own == "auto" else own
    return [decays[id(param)] for param in net.parameters()]


def param_groups(params, weight_decay, decays=None):
    """A group per weight decay: ``decays`` (one per parameter; None: ``weight_decay`` for all)."""
    groups = {}
    for param, decay in zip(params, decays or [weight_decay] * len(params), strict=True):
        if param.requires_grad:
            groups.setdefault(decay, []).append(param)
    return [{"params": members, "weight_decay": decay} for decay, members in groups.items()]


def build_optimizer(params, *, implementation="loop", name="sgd", lr=0.1, weight_decay=0.0, decays=None, **hyper):
    """Algorithm ``name`` in ``implementation`` over ``params`` (a module or tensors)."""
    algorithm = ALGORITHMS[name]
    unknown = hyper.keys() - algorithm.hyperparameters.keys()
    if unknown:
        raise TypeError(f"{name} takes {', '.join(algorithm.hyperparameters)}, not {sorted(unknown)}")
    params = list(params.parameters() if isinstance(params, torch.nn.Module) else params)
    kwargs = {"lr": lr, **hyper}
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    return IMPLEMENTATIONS[implementation].build(algorithm, param_groups(params, weight_decay, decays),
                                                 kwargs)


def hold_lr_in_tensors(optimizer):
    """Each group's LR as a tensor, updated in place: a compiled step does not recompile for it."""
    for group in optimizer.param_groups:
        first = group["params"][0]
        group["lr"] = torch.tensor(float(group["lr"]), device=first.device, dtype=first.dtype)


def plain_numbers(state):
    """A state dict's one-element tensors outside ``state`` as floats, as eager runs write them."""
    def plain(value):
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return value.item()
        if isinstance(value, list):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value
    return {k: (v if k == "state" else plain(v)) for k, v in state.items()}


def describe_optimizer(name, implementation, impl="standard"):
    """What runs, for the log and summary.json: e.g. 'SGD (fused kernel)'."""
    algorithm = ALGORITHMS[name]
    what = IMPLEMENTATIONS[implementation].describe
    if implementation in ("npu_fused", "apex_npu_fused"):
        return f"{'apex ' if implementation == 'apex_npu_fused' else ''}{algorithm.npu_fused} ({what})"
    cls = algorithm.torch_class.__name__
    if impl == "fused" and implementation in ("foreach", "plain"):
        what += f"; {cls} has no fused kernel, so --optimizer fused runs this"
    return f"{cls} ({what})"


# The LR schedules (schedule.name): a row's ``factor(step, steps_per_epoch, total, s)`` multiplies the
# base LR after the warm-up (``s``: the section, min_lr as a share of the LR). A row must be a
# closed form of the step: a resume moves the schedule by the step alone (state.schedule_at), so a stateful
# scheduler (torch's StepLR) would go on from a wrong LR. tests/test_optim.py resumes every row.
@dataclass(frozen=True)
class Schedule:
    factor: Callable
    settings: dict           # {name: Setting}: the schedule.* settings it takes besides the warm-up


def step_decay(step, steps_per_epoch, total, s):
    return s["gamma"] ** (step // (s["step_epochs"] * steps_per_epoch))


def cosine(step, steps_per_epoch, total, s):
    progress = min(1.0, step / max(1, total))
    return s["min_lr"] + (1 - s["min_lr"]) * 0.5 * (1 + math.cos(math.pi * progress))


GAMMA = Setting(0.1, "(0, 1]")
SCHEDULES = {
    "step": Schedule(step_decay, {"step_epochs": Setting(30, "[1, inf)"), "gamma": GAMMA}),
    "cosine": Schedule(cosine, {"min_lr": Setting(0.0, "[0, inf)")}),
}
# The settings every schedule takes: the warm-up, and whether the LR moves once an epoch.
WARMUP = {"warmup_epochs": Setting(0.0, "[0, inf)"), "warmup_start_factor": Setting(0.1, "(0, 1]"),
          "warmup_method": Setting("linear"), "per_epoch": Setting(False)}
