"""A STAND-IN for Ascend's apex, only to test our wiring of ModelZoo's path on cpu: tests put it into
sys.modules["apex"] (with ``install``) where they ask for it. It proves nothing about apex's kernels.

Written from the source of Ascend/apex, branch 5.0.0 (= master, 2023-11-23): patch/npu.patch over
NVIDIA apex's amp (_initialize.py, _process_optimizer.py, handle.py, scaler.py, frontend.py) and
src/apex/optimizers/npu_fused_*.py. What it models, as apex does it:
- amp.initialize(model, optimizer, opt_level, loss_scale, combine_grad): refuses a model already
  wrapped in DistributedDataParallel or DataParallel (check_models: the wrap comes after), a model
  already in half precision and an optimizer passed twice; O1 and O2 default to a dynamic loss scale. O2 casts
  the model to float16 except BatchNorm, casts its floating inputs to float16 and its outputs to
  float32, and its state_dict() returns float32 (the half weights, cast). O1 keeps fp32 weights
  (apex patches torch's functions to run in float16 from its cast lists; the stand-in runs the
  forward under torch.autocast instead).
- The optimizer's patched methods: zero_grad(self), taking no argument (every branch of apex), which
  runs amp's lazy init; at O2 that init puts fp32 masters, cloned from the HALF weights, in place of
  the half parameters in param_groups (their state moves with them). step() then copies the
  masters into the model.
- combine_grad=True or an npu fused optimizer: at the first backward the model's grads (per dtype),
  the master grads and, for an npu fused optimizer, the master parameters move into one flat buffer
  each (combine_npu: every tensor becomes a view of it, values kept); zero_grad zeroes the buffers;
  and amp.initialize replaces torch.nn.Module.zero_grad for the whole process with one that asserts
  set_to_none is False (new in 5.0).
- amp.scale_loss(loss, optimizer): yields loss.float() * scale; on exit, at a dynamic scale, checks
  the model's grads for inf/nan (apex's is_support_inf_nan path) and on an overflow halves the scale
  and turns the next optimizer.step() into a skip that prints apex's line; 2000 clean steps double it
  (at most 2**24). At a STATIC scale apex checks nothing (check_overflow_and_sync sets _has_overflow
  False) and an overflowing step is applied. Without an overflow, the grads are unscaled into the
  masters' grads (O2) or in place (O1).
- Accumulation (backwards without zero_grad between): each backward's grads, unscaled, are added
  to the stashed grads so far (prepare_backward_* stashes them and zeroes the model's grads first).
- amp.state_dict() / amp.load_state_dict(): {"loss_scaler0": {"loss_scale", "unskipped"}}.
- apex.optimizers.NpuFusedSGD / Adam / AdamW / RMSprop set is_npu_fused_optimizer; their step()
  raises without amp ("... should be used with AMP."), and amp refuses them at O0.

Not modelled: the NPU itself (apex refuses tensors that are not on an npu; its float-status
overflow flag; storage formats; combine_npu's 16-element alignment), the fused optimizers' own
arithmetic (the stand-ins run torch's per-tensor update over the combined views; for SGD apex's
npu_fused_sgd.py computes the same: buf = grad + wd*p at the first step, then momentum*buf + grad,
p -= lr*buf), the cross-rank overflow all_reduce, combine_ddp, check_combined_tensors, several losses
or optimizers, O3.
"""
import contextlib
import sys
import types
from collections import OrderedDict

import torch

HALF = torch.float16
amp = types.ModuleType("apex.amp")
optimizers = types.ModuleType("apex.optimizers")
_state = types.SimpleNamespace(properties=None, scaler=None)


def install(monkeypatch):
    """Put the stand-in where ``import apex`` finds it, for one test; torch.nn.Module.zero_grad,
    which amp.initialize replaces, is restored afterwards."""
    monkeypatch.setattr(torch.nn.Module, "zero_grad", torch.nn.Module.zero_grad)
    for name, module in modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    return sys.modules["apex"]


def modules():
    """{module name: module} of the stand-in, for sys.modules (a process of its own may just update it)."""
    apex = types.ModuleType("apex")
    apex.amp, apex.optimizers = amp, optimizers
    return {"apex": apex, "apex.amp": amp, "apex.optimizers": optimizers}


class LossScaler:
    """apex.amp.scaler.LossScaler's scale bookkeeping (update_scale)."""

    def __init__(self, loss_scale, init_scale=2.0**16, window=2000, max_scale=2.0**24):
        self.dynamic = loss_scale == "dynamic"
        self.loss_scale = min(max_scale, init_scale) if self.dynamic else float(loss_scale)
        self.unskipped, self.window, self.max_scale = 0, window, max_scale

    def update_scale(self, overflow):
        """Whether the step must be skipped."""
        if overflow and self.dynamic:
            self.loss_scale *= 0.5
            self.unskipped = 0
            return True
        self.unskipped += 1
        if self.unskipped == self.window and self.dynamic:
            self.loss_scale = min(self.max_scale, self.loss_scale * 2.0)
            self.unskipped = 0
        return False


def _combine(tensors):
    """combine_npu: one zeroed flat buffer holding ``tensors``, each now a view of it (same values,
    sizes and strides)."""
    if not tensors:
        return None
    flat = torch.zeros(sum(t.numel() for t in tensors), dtype=tensors[0].dtype, device=tensors[0].device)
    offset = 0
    for t in tensors:
        view = flat.as_strided(t.size(), t.stride(), offset)
        view.copy_(t.detach())
        t.data = view
        offset += t.numel()
    return flat


def _module_zero_grad(self, set_to_none=False):
    """apex 5.0's torch.nn.Module.zero_grad: grads stay (they may live in combined buffers)."""
    assert set_to_none is False, "For combined grad, `set_to_none` must be False."
    for p in self.parameters():
        if p.grad is not None:
            p.grad.detach_()
            p.grad.zero_()


def _cast(value, dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _check_models(model):
    """check_models: parallel wrappers come after amp.initialize."""
    for wrapper in (torch.nn.parallel.DistributedDataParallel, torch.nn.parallel.DataParallel):
        if isinstance(model, wrapper):
            raise RuntimeError(f"Incoming model is an instance of torch.nn.parallel.{wrapper.__name__}. "
                               "Parallel wrappers should only be applied to the model(s) AFTER \n"
                               "the model(s) have been returned from amp.initialize.")


def _check_params_fp32(model):
    for name, param in model.named_parameters():
        if param.is_floating_point() and param.dtype == HALF:
            raise RuntimeError(f"Found param {name} with type {param.type()}, expected torch.npu.FloatTensor.\n"
                               "When using amp.initialize, you do not need to call .half() on your model\n"
                               "before passing it, no matter what optimization level you choose.")


def _cast_model_o2(model):
    """convert_network with keep_batchnorm_fp32, the forward's casts and the fp32 state dict."""
    model.half()
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.float()
    old_forward = model.forward

    def new_forward(*args, **kwargs):
        output = old_forward(*_cast(args, HALF), **{k: _cast(v, HALF) for k, v in kwargs.items()})
        return _cast(output, torch.float32)
    model.forward = new_forward

    def fp32_state_dict(module, state_dict, prefix, local_metadata):
        for key, value in state_dict.items():
            if isinstance(value, torch.Tensor) and value.dtype == HALF:
                state_dict[key] = value.float()
    model._register_state_dict_hook(fp32_state_dict)


def _autocast_model_o1(model):
    old_forward = model.forward
    device_type = next(model.parameters()).device.type

    def new_forward(*args, **kwargs):
        with torch.autocast(device_type, dtype=HALF):
            return old_forward(*args, **kwargs)
    model.forward = new_forward


def _lazy_init(optimizer):
    """amp's _amp_lazy_init: under master weights, fp32 masters in place of the half params."""
    stash = optimizer._amp_stash
    if stash.lazy_init_called:
        return
    stash.lazy_init_called = True
    for group in optimizer.param_groups:
        for i, param in enumerate(group["params"]):
            if not param.requires_grad:
                continue
            if param.dtype not in (HALF, torch.float32):
                raise TypeError("Optimizer's parameters must be either torch.npu.FloatTensor or "
                                f"torch.npu.HalfTensor. Received {param.type()}")
            master = param
            if stash.master_weights and param.dtype == HALF:
                master = param.detach().clone().float()
                master.requires_grad = True
                group["params"][i] = master
                if param in optimizer.state:
                    optimizer.state[master] = optimizer.state.pop(param)
            stash.model_params.append(param)
            stash.masters.append(master)
    # apex: "Leverage state_dict() and load_state_dict() to recast preexisting per-param state tensors"
    optimizer.load_state_dict(optimizer.state_dict())


def _combine_grads(optimizer):
    """_amp_combined_init: the grads (and an npu fused optimizer's masters) into flat buffers."""
    stash = optimizer._amp_stash
    pairs = [(p, m) for p, m in zip(stash.model_params, stash.masters) if p.grad is not None]
    stash.model_params, stash.masters = [p for p, _ in pairs], [m for _, m in pairs]
    stash.buffers = []
    for dtype in (HALF, torch.float32):
        stash.buffers.append(_combine([p.grad for p in stash.model_params if p.dtype == dtype]))
    separate = [m for p, m in pairs if m is not p]
    for master in separate:
        master.grad = torch.zeros_like(master)
    stash.buffers.append(_combine([m.grad for m in separate]))
    stash.buffers = [b for b in stash.buffers if b is not None]
    if optimizer.is_npu_fused_optimizer:
        _combine(separate)
        _combine([m for p, m in pairs if m is p])
    stash.already_combined = True


def _zero_grad(self):
    """new_zero_grad_accelerate_with_master_weights / _no_master_weights: takes only self."""
    stash = self._amp_stash
    _lazy_init(self)
    stash.process_zero_grad = True
    if stash.already_combined:
        for buffer in stash.buffers:
            buffer.zero_()
        return
    for param in stash.model_params + stash.masters:
        if param.grad is not None:
            param.grad.detach_()
            param.grad.zero_()


def _process_optimizer(optimizer, properties):
    if hasattr(optimizer, "_amp_stash"):
        raise RuntimeError("A given optimizer should only be passed through amp.initialize once.")
    optimizer.is_npu_fused_optimizer = getattr(optimizer, "is_npu_fused_optimizer", False) is True
    if optimizer.is_npu_fused_optimizer and properties.opt_level not in ("O1", "O2"):
        raise RuntimeError("Currently, npu fused optimizer can only be used when opt_level='O1' or "
                           "opt_level='O2'")
    optimizer.accelerate = properties.combine_grad
    optimizer._amp_stash = types.SimpleNamespace(
        lazy_init_called=False, already_combined=False, already_patched=False, process_zero_grad=True,
        master_weights=properties.opt_level == "O2", model_params=[], masters=[], buffers=[])
    old_step = optimizer.step

    def new_step(self, closure=None):
        if closure is not None:
            raise RuntimeError("Currently, Amp does not support closure use with optimizers.")
        result = old_step()
        with torch.no_grad():
            for param, master in zip(self._amp_stash.model_params, self._amp_stash.masters):
                if master is not param:
                    param.copy_(master)
                    master.grad.zero_()  # the master grads that model.zero_grad() would not zero
        return result
    optimizer.step = types.MethodType(new_step, optimizer)
    if properties.combine_grad or optimizer.is_npu_fused_optimizer or properties.opt_level == "O2":
        optimizer.zero_grad = types.MethodType(_zero_grad, optimizer)
    return optimizer


def initialize(models, optimizers=None, enabled=True, opt_level="O1", loss_scale=None,
               combine_grad=None, **unmodelled):
    if unmodelled:
        raise TypeError(f"the apex stand-in does not model {sorted(unmodelled)}")
    if opt_level not in ("O0", "O1", "O2"):
        raise RuntimeError(f"Unexpected optimization level {opt_level}. Options are 'O0', 'O1', 'O2'.")
    if loss_scale is None:
        loss_scale = 1.0 if opt_level == "O0" else "dynamic"
    _state.properties = types.SimpleNamespace(opt_level=opt_level, combine_grad=bool(combine_grad))
    _check_models(models)
    _check_params_fp32(models)
    if opt_level == "O2":
        _cast_model_o2(models)
    elif opt_level == "O1":
        _autocast_model_o1(models)
    if optimizers is not None:
        _process_optimizer(optimizers, _state.properties)
    _state.scaler = LossScaler(loss_scale)
    if combine_grad or getattr(optimizers, "is_npu_fused_optimizer", False):
        torch.nn.Module.zero_grad = _module_zero_grad
        print("Warning: Default value of `set_to_none` in torch.nn.Module.zero_grad() is set as False "
              "for combine grad, which is True since torch 2.0.")
    return models if optimizers is None else (models, optimizers)


def _prepare_backward(optimizer):
    """prepare_backward_with_master_weights / _no_master_weights: a backward that no zero_grad came
    before (accumulation) finds the model's grads zeroed, the unscaled grads so far stashed."""
    stash = optimizer._amp_stash
    keep = not stash.process_zero_grad
    stash.stashed = [m.grad.detach().clone() if keep and m.grad is not None else None for m in stash.masters]
    for param in stash.model_params:
        if param.grad is not None:
            param.grad.zero_()


def _post_backward(optimizer, scaler):
    """Unscale into the masters' grads and add the stashed ones (unscale_with_stashed,
    unscale_grad_O2), unless a dynamic scale finds an overflow in this backward's: returns whether."""
    stash = optimizer._amp_stash
    if not stash.already_combined and (optimizer.accelerate or optimizer.is_npu_fused_optimizer):
        _combine_grads(optimizer)
    grads = [p.grad for p in stash.model_params if p.grad is not None]
    if scaler.dynamic:
        found_inf = torch.zeros((), device=grads[0].device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, torch.ones((), device=found_inf.device))
        if found_inf.item():
            return True
    with torch.no_grad():
        for param, master in zip(stash.model_params, stash.masters):
            if master is param:
                param.grad.mul_(1.0 / scaler.loss_scale)
            else:
                master.grad.copy_(param.grad).mul_(1.0 / scaler.loss_scale)
        for master, stashed in zip(stash.masters, stash.stashed):
            if stashed is not None:
                master.grad.add_(stashed)
    return False


def _patch_skip(optimizer, scaler):
    """The next optimizer.step() only says so and clears the master grads (handle.py's skip_step)."""
    stash = optimizer._amp_stash
    if stash.already_patched:
        return
    step = optimizer.step

    def skip_step(closure=None):
        print(f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {scaler.loss_scale}")
        for param, master in zip(stash.model_params, stash.masters):
            if master is not param:
                master.grad.zero_()
        optimizer.step = step
        stash.already_patched = False
    optimizer.step = skip_step
    stash.already_patched = True


@contextlib.contextmanager
def scale_loss(loss, optimizer, loss_id=0, model=None, delay_unscale=False):
    if _state.properties is None:
        raise RuntimeError("Invoked 'with amp.scale_loss`, but internal Amp state has not been initialized.")
    scaler = _state.scaler
    _lazy_init(optimizer)
    _prepare_backward(optimizer)
    yield loss.float() * scaler.loss_scale
    overflow = _post_backward(optimizer, scaler)
    optimizer._amp_stash.process_zero_grad = False
    if scaler.update_scale(overflow):
        _patch_skip(optimizer, scaler)


def state_dict(destination=None):
    destination = OrderedDict() if destination is None else destination
    destination["loss_scaler0"] = {"loss_scale": _state.scaler.loss_scale, "unskipped": _state.scaler.unskipped}
    return destination


def load_state_dict(state):
    unexpected = [key for key in state if "loss_scaler" not in key]
    if unexpected:
        raise RuntimeError("Error(s) in loading state_dict. Unexpected key(s) in state_dict: "
                           + ", ".join(f'"{k}"' for k in unexpected) + ". ")
    _state.scaler.loss_scale = state["loss_scaler0"]["loss_scale"]
    _state.scaler.unskipped = state["loss_scaler0"]["unskipped"]


def _npu_fused(base, name):
    class NpuFused(base):
        def __init__(self, params, **kwargs):
            self.is_npu_fused_optimizer = True
            super().__init__(params, **kwargs)

        @torch.no_grad()
        def step(self, closure=None):
            if not hasattr(self, "_amp_stash"):
                raise RuntimeError(f"apex.optimizers.{name} should be used with AMP.")
            return super().step(closure)
    NpuFused.__name__ = NpuFused.__qualname__ = name
    return NpuFused


amp.initialize, amp.scale_loss = initialize, scale_loss
amp.state_dict, amp.load_state_dict = state_dict, load_state_dict
optimizers.NpuFusedSGD = _npu_fused(torch.optim.SGD, "NpuFusedSGD")
optimizers.NpuFusedAdam = _npu_fused(torch.optim.Adam, "NpuFusedAdam")
optimizers.NpuFusedAdamW = _npu_fused(torch.optim.AdamW, "NpuFusedAdamW")
optimizers.NpuFusedRMSprop = _npu_fused(torch.optim.RMSprop, "NpuFusedRMSprop")
