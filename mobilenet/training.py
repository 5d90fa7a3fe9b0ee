"""The training step and what it owns, wired once from a resolved config (``build_train_step``).

``loss = step(images, labels)`` is the unit a device graph captures; ``step.batches(loader)`` gives
it its input on the device. The run's position, the schedule and the checkpoint are
mobilenet/state.py's; the benchmarks that measure the app build through that too (the ceiling
benchmark's plain loops build their own, on purpose: they are what the app is measured against).
"""
import contextlib
import types

import torch
from torch import nn

from mobilenet import checkpoint as ckpt
from mobilenet.amp import build_precision
from mobilenet.compiling import compiled
from mobilenet.data.prefetch import DevicePrefetcher
from mobilenet.distributed import broadcast_from_rank0, wrap_ddp
from mobilenet.ema import WeightEMA
from mobilenet.model import build_model, load_weights
from mobilenet.optim import IMPLEMENTATIONS, build_optimizer, hold_lr_in_tensors, hyperparameters

NO_PHASE = contextlib.nullcontext()


def no_phase(name):
    return NO_PHASE


class TrainStep:
    """``loss = step(images, labels)``: forward, loss, backward, unscale, optimizer step, zero_grad
    and the EMA update, in one call, for the loop to call and for a device graph to capture.

    Owns the network (``net`` bare; ``wrapped``, the one the step calls: DDP-wrapped in distributed
    runs, compiled under train.compile), the optimizer (``implementation``: loop|foreach|torch_fused|npu_fused|
    apex_npu_fused|plain, as resolved), the precision (amp level, loss scaling, O2 masters) and the EMA.
    The step reads nothing back to the host, except the loss scaler's overflow check for
    optimizers without a device-side skip (documented there). ``phase``: a function name ->
    context manager that wraps each phase (timing and op counts in mobilenet.measure); a no-op by
    default. ``device``, ``channels_last`` and ``decode_on_device``: the input it takes (``batches``).
    """

    def __init__(self, *, net, wrapped, optimizer, precision, criterion, implementation, algorithm="sgd",
                 ema=None, compiled=False, device=None, channels_last=False, decode_on_device=False):
        self.net, self.wrapped, self.optimizer = net, wrapped, optimizer
        self.precision, self.criterion, self.ema = precision, criterion, ema
        self.implementation, self.algorithm, self.compiled = implementation, algorithm, compiled
        self.device, self.channels_last, self.decode_on_device = device, channels_last, decode_on_device
        self.set_to_none = IMPLEMENTATIONS[implementation].grads_to_none
        self.phase = no_phase

    def __call__(self, images, labels):
        return self.accumulated([(images, labels)])

    def accumulated(self, batches, after_each=lambda: None):
        """One optimizer step over the forwards of ``batches`` (train.grad_accum_steps of them): each
        one's loss divided by their number and its grads added, DDP's all-reduce at the last alone,
        then one unscale and finite check, one step, one zero_grad, one EMA update; ``after_each()``
        after each forward and backward (the watchdog's beat). Returns the step's loss (the mean)."""
        phase, precision, optimizer = self.phase, self.precision, self.optimizer
        total = None
        for position, (images, labels) in enumerate(batches):
            with self.without_sync(last=position == len(batches) - 1):
                with phase("forward"), precision.autocast():
                    logits = self.wrapped(images)
                with phase("loss"), precision.autocast():
                    loss = self.criterion(logits.float(), labels)
                    loss = loss / len(batches) if len(batches) > 1 else loss
                with phase("backward"):
                    precision.backward(loss, optimizer)
            total = loss.detach() if total is None else total + loss.detach()
            after_each()
        with phase("unscale"):
            precision.unscale(optimizer)
        with phase("optimizer"):
            precision.step(optimizer)
        with phase("zero_grad"):
            precision.zero_grad(self.net, optimizer, self.set_to_none)
        if self.ema is not None:
            with phase("ema"):
                self.ema.update()
        return total

    def without_sync(self, last):
        """DDP's no_sync() for a forward whose grads the next ones add to (not the ``last``), where
        the precision leaves them in the model's grads (apex moves them: each forward all-reduces)."""
        no_sync = getattr(self.wrapped, "no_sync", None)
        if last or no_sync is None or not self.precision.grads_stay_in_the_model:
            return contextlib.nullcontext()
        return no_sync()

    def batches(self, loader):
        """``loader``'s uint8 batches on the device, normalised, in the layout and dtype the step takes."""
        return DevicePrefetcher(loader, self.device, self.channels_last, self.precision.input_dtype,
                                decode_on_device=self.decode_on_device)

    def train(self, freeze_bn=False):
        """Training mode; ``freeze_bn``: BatchNorm layers keep using their running statistics."""
        self.wrapped.train()
        if freeze_bn:
            for module in self.net.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()

    def eval_nets(self):
        """{label: network} to validate: the network, and its EMA when there is one."""
        return {"": self.net, **({"EMA": self.ema.module} if self.ema is not None else {})}

    def optimizer_params(self):
        """The tensors the optimizer updates (the fp32 masters under O2)."""
        return (p for group in self.optimizer.param_groups for p in group["params"])

    def weights_finite(self):
        """Whether every weight is finite (one device read: for saves between loss checks)."""
        return bool(torch.stack([p.detach().isfinite().all() for p in self.optimizer_params()]).all())

    def lr(self):
        return float(self.optimizer.param_groups[0]["lr"])  # a tensor under train.compile

    def metrics(self):
        """The precision's own metrics (loss scale, skipped steps) as numbers."""
        return {name: float(value) for name, value in self.precision.metrics().items()}

    def skips_bad_steps(self):
        """Whether a non-finite loss is a step the dynamic loss scaler skips (else the run diverged)."""
        return self.precision.dynamic_loss_scale


def build_train_step(cfg, device):
    """The TrainStep for a resolved config, on ``device`` (the process's card)."""
    derived, model_cfg, optim = cfg["derived"], cfg["model"], cfg["optim"]
    implementation = derived["optimizer_implementation"]
    torch.manual_seed(cfg["seed"])  # the initial weights, whatever this process drew from before
    net = build_model(model_cfg)
    if model_cfg["pretrained"]:
        load_weights(net, ckpt.load_checkpoint(model_cfg["pretrained"]), model_cfg["pretrained"], model_cfg["name"])
    if model_cfg["sync_bn"] and derived["world_size"] > 1:
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    layout = torch.channels_last if derived["channels_last"] else torch.contiguous_format
    net = net.to(device, memory_format=layout)
    # every rank starts from rank 0's weights before anything is cloned from them (the O2 masters,
    # the EMA): DDP's own broadcast at the wrap reaches only the module
    broadcast_from_rank0(net.state_dict().values())
    precision = build_precision(cfg["amp"], backend=derived["amp_backend"], device=device, net=net,
                                skip_on_device=IMPLEMENTATIONS[implementation].skip_on_device)
    optimizer = build_optimizer(precision.params(net), implementation=implementation, name=optim["name"],
                                lr=derived["lr"], weight_decay=optim["weight_decay"],
                                no_decay_bn_bias=optim["no_decay_bn_bias"], **hyperparameters(optim))
    net, optimizer = precision.initialize(net, optimizer)
    decay = cfg["train"]["ema_decay"]
    ema = WeightEMA(net, decay) if decay > 0 else None
    wrapped = wrap_ddp(net, derived["world_size"], device)
    if derived["compile"]:  # net stays eager: checkpoints keep their keys, validation runs it
        wrapped = compiled(wrapped, **derived["compile"])
        if IMPLEMENTATIONS[implementation].compile_step:
            hold_lr_in_tensors(optimizer)
            # a bound method again, as LR schedulers expect to find and wrap
            optimizer.step = types.MethodType(torch.compile(type(optimizer).step), optimizer)
    return TrainStep(net=net, wrapped=wrapped, optimizer=optimizer, compiled=derived["compile"] is not None,
                     precision=precision, ema=ema, implementation=implementation, algorithm=optim["name"],
                     criterion=nn.CrossEntropyLoss(label_smoothing=cfg["train"]["label_smoothing"]),
                     device=device, channels_last=derived["channels_last"],
                     decode_on_device=derived["decode"] == "device")
