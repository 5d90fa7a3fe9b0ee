"""Mixed precision: apex amp (Ascend fork, combine_grad=True) when importable, else native torch.

Levels: O0 fp32; O1 autocast with fp32 weights; O2 (native: NativeMasterWeights) half model except
BatchNorm, fp32 master weights owned by the optimizer. Loss scaling is static or dynamic; a step
whose grads are not finite is skipped and counted, the check staying on the device.
"""
import contextlib
import importlib

import torch

from mobilenet.config import UsageError
from mobilenet.optim import zero_grad


def import_apex_amp():
    """apex.amp if an apex with amp (Ascend's fork) is installed; NVIDIA apex no longer has it."""
    try:
        return importlib.import_module("apex.amp")
    except ImportError:
        return None


class LossScaler:
    """Loss scale, non-finite check and skip counting with torch's own amp kernels, no host sync.

    dynamic: halve on overflow, double after ``growth_interval`` clean steps. static: fixed scale,
    overflow steps still skipped.
    """

    def __init__(self, loss_scale, device, growth_interval=2000):
        self.dynamic = loss_scale == "dynamic"
        self.scale = torch.full((), 2.0**16 if self.dynamic else float(loss_scale), device=device)
        self.growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
        self.found_inf = torch.zeros((), device=device)
        self.skipped = torch.zeros((), device=device)
        self.growth_interval = growth_interval

    def unscale_and_check(self, grads):
        """grads /= scale in place; sets found_inf to 1.0 if any of them is inf or nan."""
        self.found_inf.zero_()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found_inf,
                                                         self.scale.double().reciprocal().float())

    def step(self, optimizer):
        """optimizer.step() unless found_inf. Fused torch optimizers read ``found_inf`` and skip on
        the device; others need one host read. So does a fused optimizer's first step: torch's
        fused SGD allocates its momentum buffers uninitialised (empty_like) and a skipped first
        step would leave them so (common: 2**16 often overflows at the start)."""
        if optimizer.defaults.get("fused") and optimizer.state:
            optimizer.found_inf = self.found_inf
            try:
                optimizer.step()
            finally:
                del optimizer.found_inf
        elif not self.found_inf.item():
            optimizer.step()
        self.skipped += self.found_inf
        if self.dynamic:
            torch._amp_update_scale_(self.scale, self.growth_tracker, self.found_inf,
                                     2.0, 0.5, self.growth_interval)

    def state_dict(self):
        return {"scale": self.scale.item(), "growth_tracker": int(self.growth_tracker.item()),
                "skipped": self.skipped.item()}

    def load_state_dict(self, state):
        self.scale.fill_(state["scale"])
        self.growth_tracker.fill_(state["growth_tracker"])
        self.skipped.fill_(state["skipped"])


class Precision:
    """O0: plain fp32 training. Subclasses override the hooks the engine calls."""

    level, backend = "O0", "none"
    input_dtype = torch.float32  # what the prefetcher hands the model
    dynamic_loss_scale = False   # True: steps with non-finite grads are skipped, not fatal

    def optimizer_params(self, model):
        """The tensors the optimizer updates (prepares the model first where a level needs it)."""
        return model.parameters()

    def initialize(self, model, optimizer):
        return model, optimizer

    def autocast(self):
        return contextlib.nullcontext()

    def backward(self, loss, optimizer):
        loss.backward()

    def step(self, model, optimizer):
        optimizer.step()

    def zero_grad(self, model, optimizer):
        zero_grad(optimizer)

    def metrics(self):
        """Scalars for the log: loss scale and skipped steps (tensors, read when logged)."""
        return {}

    def model_state_dict(self, model):
        """The weights a checkpoint holds (fp32 where the level keeps fp32 masters)."""
        return model.state_dict()

    def load_model_state_dict(self, model, state):
        """After the model loaded ``state`` (a full-precision state dict)."""

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class NativeAutocast(Precision):
    """O1: torch.autocast around forward and loss, fp32 weights, loss scaling."""

    backend = "native"

    def __init__(self, level, dtype, loss_scale, device):
        self.level, self.dtype, self.device_type = level, dtype, device.type
        self.scaler = LossScaler(loss_scale, device)
        self.dynamic_loss_scale = self.scaler.dynamic

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss, optimizer):
        (loss.float() * self.scaler.scale).backward()

    def step(self, model, optimizer):
        self.scaler.unscale_and_check(grads_of(optimizer))
        self.scaler.step(optimizer)

    def metrics(self):
        return {"loss_scale": self.scaler.scale, "skipped_steps": self.scaler.skipped}

    def state_dict(self):
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state):
        self.scaler.load_state_dict(state["scaler"])


class NativeMasterWeights(NativeAutocast):
    """O2: the model in half precision except BatchNorm (as apex O2 does), fp32 master copies of
    all parameters owned by the optimizer. Per step, with multi-tensor ops only: copy the half
    grads into the fp32 master grads, unscale and check them, step, copy the masters back."""

    def __init__(self, level, dtype, loss_scale, device):
        super().__init__(level, dtype, loss_scale, device)
        self.input_dtype = dtype

    def optimizer_params(self, model):
        self.names = [name for name, _ in model.named_parameters()]
        self.masters = [p.detach().clone().float().requires_grad_() for p in model.parameters()]
        for master in self.masters:
            master.grad = torch.zeros_like(master)
        model.to(self.dtype)
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.float()
        self.model_params = list(model.parameters())
        return self.masters

    def autocast(self):
        return contextlib.nullcontext()

    def step(self, model, optimizer):
        master_grads = [m.grad for m in self.masters]
        torch._foreach_copy_(master_grads, [p.grad for p in self.model_params])
        self.scaler.unscale_and_check(master_grads)
        self.scaler.step(optimizer)
        with torch.no_grad():
            torch._foreach_copy_(self.model_params, self.masters)

    def zero_grad(self, model, optimizer):
        model.zero_grad(set_to_none=True)  # the master grads are overwritten each step

    def model_state_dict(self, model):
        return {**model.state_dict(), **dict(zip(self.names, (m.detach() for m in self.masters)))}

    def load_model_state_dict(self, model, state):
        with torch.no_grad():
            for name, master in zip(self.names, self.masters):
                master.copy_(state[name])


class ApexAmp(Precision):
    """Ascend's apex: amp.initialize(..., combine_grad=True) before DDP, amp.scale_loss backward."""

    backend = "apex"

    def __init__(self, amp_module, level, loss_scale):
        self.amp, self.level, self.loss_scale = amp_module, level, loss_scale
        self.dynamic_loss_scale = loss_scale == "dynamic"

    def initialize(self, model, optimizer):
        return self.amp.initialize(model, optimizer, opt_level=self.level,
                                   loss_scale=self.loss_scale, combine_grad=True)

    def backward(self, loss, optimizer):
        with self.amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()

    def state_dict(self):
        return {"apex": self.amp.state_dict()}

    def load_state_dict(self, state):
        self.amp.load_state_dict(state["apex"])


def grads_of(optimizer):
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def build_precision(amp_cfg, device):
    level = amp_cfg["level"]
    if level == "O0":
        return Precision()
    backend = amp_cfg["backend"]
    apex_amp = import_apex_amp() if backend in ("auto", "apex") else None
    if backend == "apex" and apex_amp is None:
        raise UsageError("amp.backend=apex: apex with amp (Ascend's fork) is not importable")
    if apex_amp is not None:
        return ApexAmp(apex_amp, level, amp_cfg["loss_scale"])
    dtype = getattr(torch, amp_cfg["dtype"])
    native = NativeAutocast if level == "O1" else NativeMasterWeights
    return native(level, dtype, amp_cfg["loss_scale"], device)
