"""Mixed precision, Ascend's apex amp (combine_grad=True, on npu where it imports) or torch's: O0
fp32; O1 autocast; O2 a half model (BatchNorm fp32) with fp32 masters. A step whose grads are not
finite is skipped and counted (but under apex at a static scale). TrainStep calls, in order:
autocast, backward, unscale, step, zero_grad."""
import contextlib
import importlib

import torch

from mobilenet.errors import UsageError

LEVELS = ("O0", "O1", "O2")  # amp.level: fp32, autocast, half model with fp32 masters


def import_ascend_apex():
    """apex if it is Ascend's fork (its amp and apex.optimizers.NpuFusedSGD import), else None."""
    try:
        apex = importlib.import_module("apex")
        importlib.import_module("apex.amp")
        importlib.import_module("apex.optimizers").NpuFusedSGD
    except (ImportError, AttributeError):
        return None
    return apex


def apex_amp_importable():
    try:
        importlib.import_module("apex.amp")
    except ImportError:
        return False
    return True


def choose_backend(level, backend, device):
    """none (O0) | native | apex; auto takes apex on npu only, and only Ascend's fork."""
    if backend == "apex" and level == "O0":
        raise UsageError("amp.backend=apex at amp.level O0: apex amp has nothing to do at O0 and refuses "
                         "npu fused optimizers there; use --amp O1|O2, or amp.backend=auto")
    if level == "O0":
        return "none"
    if backend == "native":
        return "native"
    ascend = import_ascend_apex() is not None
    if backend == "apex" and not ascend:
        if apex_amp_importable():
            raise UsageError("amp.backend=apex: the installed apex is not Ascend's fork (it has no "
                             "apex.optimizers.NpuFusedSGD, and NVIDIA apex's amp has no combine_grad); "
                             "install github.com/Ascend/apex, or use amp.backend=native")
        raise UsageError("amp.backend=apex: apex (Ascend's fork, github.com/Ascend/apex) is not "
                         "importable; install it, or use amp.backend=native")
    return "apex" if backend == "apex" or (ascend and device == "npu") else "native"


# Not torch.amp.GradScaler, which (tests/test_amp.py::test_gradscaler_cannot_keep_these_guarantees)
# refuses ModelZoo's static 1024, counts no skipped steps, and lets a fused optimizer's skipped first
# step leave its momentum uninitialised; the kernels below are the ones GradScaler calls.
class LossScaler:
    """Loss scale, non-finite check and skip counting with torch's own amp kernels; dynamic: halve on
    overflow, double after ``growth_interval`` clean steps. ``skip_on_device``: a torch fused
    optimizer skips inside its kernel (``found_inf``); others take one host read a step."""

    def __init__(self, loss_scale, device, skip_on_device=False, growth_interval=2000):
        self.dynamic = loss_scale == "dynamic"
        self.skip_on_device = skip_on_device
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
        """optimizer.step() unless found_inf. A fused optimizer's first step reads it on the host: a
        skipped first step would leave its momentum uninitialised (empty_like)."""
        if self.skip_on_device and optimizer.state:
            optimizer.found_inf = self.found_inf
            try:
                optimizer.step()
            finally:
                del optimizer.found_inf
        elif not self.found_inf.item():  # the documented host read of this level
            optimizer.step()
        self.skipped += self.found_inf
        if self.dynamic:
            torch._amp_update_scale_(self.scale, self.growth_tracker, self.found_inf,
                                     2.0, 0.5, self.growth_interval)

    def state_dict(self):
        return {"scale": self.scale.item(), "growth_tracker": int(self.growth_tracker.item()),
                "skipped": self.skipped.item()}

    def load_state_dict(self, state):
        """A checkpoint's scaler state; a static scale stays this run's (the note that says so)."""
        self.growth_tracker.fill_(state["growth_tracker"])
        self.skipped.fill_(state["skipped"])
        if self.dynamic:
            self.scale.fill_(state["scale"])
        elif state["scale"] != self.scale.item():
            return (f"amp.loss_scale: the checkpoint's scale was {state['scale']:g}, this run's is "
                    f"{self.scale.item():g} (config.yaml), which it trains with")
        return None


def flat_views(tensors, dtype):
    """(a zeroed flat buffer of ``dtype``, views of it as ``tensors``): one launch copies them all."""
    flat = torch.zeros(sum(t.numel() for t in tensors), dtype=dtype, device=tensors[0].device)
    views, offset = [], 0
    for t in tensors:
        views.append(flat.as_strided(t.size(), t.stride(), offset))
        offset += t.numel()
    return flat, views


class MasterWeights:
    """O2 as apex's combine_grad does it: ``net`` cast to ``dtype`` but BatchNorm, fp32 masters for the
    optimizer, each side in one flat buffer per dtype, so each step's grad copy, weight copy and
    zeroing are one launch per dtype (torch's foreach copy does not cast)."""

    def __init__(self, net, dtype):
        self.names = [name for name, _ in net.named_parameters()]
        weights = [p.detach().clone() for p in net.parameters()]  # fp32, before the cast
        net.to(dtype)
        for module in net.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.float()
        self.model_params = list(net.parameters())
        self.params = [None] * len(self.model_params)
        self.groups = []  # (model flat, model grads flat, masters flat, master grads flat) per dtype
        for group_dtype in sorted({p.dtype for p in self.model_params}, key=str):
            index = [i for i, p in enumerate(self.model_params) if p.dtype == group_dtype]
            members = [self.model_params[i] for i in index]
            model_flat, model_views = flat_views(members, group_dtype)
            grads_flat, grad_views = flat_views(members, group_dtype)
            masters_flat, master_views = flat_views(members, torch.float32)
            master_grads_flat, master_grad_views = flat_views(members, torch.float32)
            for i, param, view, grad, master, master_grad in zip(index, members, model_views, grad_views,
                                                                 master_views, master_grad_views):
                master.copy_(weights[i])
                view.copy_(weights[i])
                param.data, param.grad = view, grad  # backward accumulates into the flat grads
                master.requires_grad_()
                master.grad = master_grad
                self.params[i] = master
            self.groups.append((model_flat, grads_flat, masters_flat, master_grads_flat))
        self.grads = [master.grad for master in self.params]

    def grads_from_model(self):
        for _, grads, _, master_grads in self.groups:
            master_grads.copy_(grads)

    @torch.no_grad()
    def weights_to_model(self):
        for model, _, masters, _ in self.groups:
            model.copy_(masters)

    def zero_model_grads(self):
        for _, grads, _, _ in self.groups:
            grads.zero_()

    def state_dict(self, net):
        """``net``'s state dict with the fp32 masters in place of its half parameters."""
        return {**net.state_dict(), **dict(zip(self.names, (m.detach() for m in self.params)))}

    @torch.no_grad()
    def load_state_dict(self, state):
        for name, master in zip(self.names, self.params):
            master.copy_(state[name])


class NativePrecision:
    """torch's own: O0 plain fp32; O1 autocast; O2 MasterWeights. Loss scaling at O1 and O2."""

    backend = "native"
    grads_stay_in_the_model = True  # a forward's grads add to the last ones' in param.grad (DDP's no_sync)

    def __init__(self, *, level, dtype, loss_scale, device, net, skip_on_device=False):
        self.level, self.device_type = level, device.type
        self.autocast_dtype = dtype if level == "O1" else None
        self.masters = MasterWeights(net, dtype) if level == "O2" else None
        self.scaler = LossScaler(loss_scale, device, skip_on_device) if level != "O0" else None
        self.input_dtype = dtype if level == "O2" else torch.float32  # what the prefetcher makes
        self.dynamic_loss_scale = self.scaler is not None and self.scaler.dynamic

    def params(self, net):
        """The tensors the optimizer updates."""
        return self.masters.params if self.masters else list(net.parameters())

    def initialize(self, net, optimizer):
        return net, optimizer

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def backward(self, loss, optimizer):
        (loss.float() * self.scaler.scale if self.scaler else loss).backward()

    def unscale(self, optimizer):
        """The optimizer's grads, unscaled, and found_inf set (O2: copied from the model first)."""
        if self.masters:
            self.masters.grads_from_model()
        if self.scaler:
            self.scaler.unscale_and_check(grads_of(optimizer))

    def step(self, optimizer):
        if self.scaler:
            self.scaler.step(optimizer)
        else:
            optimizer.step()
        if self.masters:
            self.masters.weights_to_model()

    def zero_grad(self, net, optimizer, set_to_none):
        if self.masters:
            self.masters.zero_model_grads()  # the master grads are overwritten each step
        else:
            optimizer.zero_grad(set_to_none=set_to_none)

    def metrics(self):
        """Scalars for the log: loss scale and skipped steps (tensors, read when logged)."""
        return {"loss_scale": self.scaler.scale, "skipped_steps": self.scaler.skipped} if self.scaler else {}

    def weights(self, net):
        """The weights a checkpoint holds (the fp32 masters under O2)."""
        return self.masters.state_dict(net) if self.masters else net.state_dict()

    def load_weights(self, state):
        """After the model has loaded ``state`` (full precision): the masters too."""
        if self.masters:
            self.masters.load_state_dict(state)

    def state_dict(self):
        return {"scaler": self.scaler.state_dict()} if self.scaler else {}

    def load_state_dict(self, state):
        """A checkpoint's amp state; returns notes where a setting of this run's stays (the scale)."""
        if self.scaler and state.get("scaler"):
            note = self.scaler.load_state_dict(state["scaler"])
            return [note] if note else []
        return []


class ApexPrecision:
    """Ascend's apex as ModelZoo runs it: amp.initialize(..., combine_grad=True) before DDP, then
    amp.scale_loss's backward, which unscales and, at a dynamic scale, makes an overflow's next step
    a skip. At O2 the optimizer's param_groups hold the fp32 masters, which checkpoints hold."""

    backend = "apex"
    input_dtype = torch.float32  # apex O2 casts the model's inputs itself
    # apex's prepare_backward stashes the grads so far and zeroes the model's before each backward,
    # adding them back after it: DDP's deferred all-reduce would reduce the last forward's grads alone
    grads_stay_in_the_model = False

    def __init__(self, amp_module, level, loss_scale):
        self.amp, self.level, self.loss_scale = amp_module, level, loss_scale
        self.dynamic_loss_scale = loss_scale == "dynamic"
        self.skipped, self.overflowed = 0, False
        self.optimizer = self.names = None

    def params(self, net):
        return list(net.parameters())

    def initialize(self, net, optimizer):
        by_id = {id(p): name for name, p in net.named_parameters()}
        self.names = [by_id[id(p)] for group in optimizer.param_groups for p in group["params"]]
        net, optimizer = self.amp.initialize(net, optimizer, opt_level=self.level,
                                             loss_scale=self.loss_scale, combine_grad=True)
        # apex makes its O2 masters lazily, at the first zero_grad or backward: now, so that a
        # checkpoint's weights and optimizer state load into them (not into the half weights)
        optimizer.zero_grad()
        self.optimizer = optimizer
        return net, optimizer

    def current_scale(self):
        return self.amp.state_dict()["loss_scaler0"]["loss_scale"]

    def autocast(self):
        return contextlib.nullcontext()

    def backward(self, loss, optimizer):
        scale = self.current_scale()
        with self.amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        # apex halves its scale at each overflowing backward and then skips the next step (once)
        self.overflowed |= self.current_scale() < scale

    def unscale(self, optimizer):
        pass

    def step(self, optimizer):
        optimizer.step()
        self.skipped += self.overflowed
        self.overflowed = False

    def zero_grad(self, net, optimizer, set_to_none):
        optimizer.zero_grad()

    def metrics(self):
        return {"loss_scale": self.current_scale(), "skipped_steps": self.skipped}

    def masters(self):
        """{name: the fp32 tensor the optimizer updates}, at O2 (apex's masters)."""
        owned = [p for group in self.optimizer.param_groups for p in group["params"]]
        return dict(zip(self.names, owned))

    def weights(self, net):
        if self.level != "O2":
            return net.state_dict()
        return {**net.state_dict(), **{name: m.detach() for name, m in self.masters().items()}}

    @torch.no_grad()
    def load_weights(self, state):
        if self.level == "O2":
            for name, master in self.masters().items():
                master.copy_(state[name])

    def state_dict(self):
        return {"apex": self.amp.state_dict(), "skipped": self.skipped}

    def load_state_dict(self, state):
        if state.get("apex"):
            self.amp.load_state_dict(state["apex"])
            self.skipped = state.get("skipped", 0)
        return []


def grads_of(optimizer):
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def build_precision(amp_cfg, *, backend, device, net, skip_on_device=False):
    """The precision for the ``amp`` section; native O2 casts ``net``: build it before the optimizer."""
    if backend == "apex":
        return ApexPrecision(importlib.import_module("apex.amp"), amp_cfg["level"], amp_cfg["loss_scale"])
    return NativePrecision(level=amp_cfg["level"], dtype=getattr(torch, amp_cfg["dtype"]),
                           loss_scale=amp_cfg["loss_scale"], device=device, net=net,
                           skip_on_device=skip_on_device)
