"""TrainStep: the training step and everything it owns, built once from the resolved config."""
import contextlib
import types

import torch
from torch import nn

from mobilenet.amp import build_precision
from mobilenet.checkpoint import load_checkpoint
from mobilenet.device import compiled
from mobilenet.distributed import wrap_ddp
from mobilenet.ema import WeightEMA
from mobilenet.model import MobileNetV1, load_weights
from mobilenet.optim import build_optimizer, hold_lr_in_tensors, hyperparameters, zero_grad_to_none

NO_PHASE = contextlib.nullcontext()


def no_phase(name):
    return NO_PHASE


class TrainStep:
    """``loss = step(images, labels)``: forward, loss, backward, unscale, optimizer step, zero_grad
    and the EMA update, in one call, for the loop to call and for a device graph to capture.

    Owns the model (``net`` bare, ``model`` as called: DDP-wrapped in distributed runs), the
    optimizer (``implementation``: loop|foreach|fused|npu_fused, as resolved), the precision (amp
    level, loss scaling, O2 masters) and the EMA. The step reads nothing back to the host, except
    the loss scaler's overflow check for optimizers without a device-side skip (documented there). ``phase``: a function name -> context manager that wraps each
    phase (timing and op counts in mobilenet.measure); a no-op by default.
    """

    def __init__(self, *, net, model, optimizer, precision, criterion, implementation, algorithm="sgd",
                 ema=None, compiled=False):
        self.net, self.model, self.optimizer = net, model, optimizer
        self.precision, self.criterion, self.ema = precision, criterion, ema
        self.implementation, self.algorithm, self.compiled = implementation, algorithm, compiled
        self.set_to_none = zero_grad_to_none(implementation)
        self.phase = no_phase

    def __call__(self, images, labels):
        phase, precision, optimizer = self.phase, self.precision, self.optimizer
        with phase("forward"), precision.autocast():
            logits = self.model(images)
        with phase("loss"), precision.autocast():
            loss = self.criterion(logits.float(), labels)
        with phase("backward"):
            precision.backward(loss, optimizer)
        with phase("unscale"):
            precision.unscale(optimizer)
        with phase("optimizer"):
            precision.step(optimizer)
        with phase("zero_grad"):
            precision.zero_grad(self.net, optimizer, self.set_to_none)
        if self.ema is not None:
            with phase("ema"):
                self.ema.update()
        return loss.detach()

    def train(self, freeze_bn=False):
        """Training mode; ``freeze_bn``: BatchNorm layers keep using their running statistics."""
        self.model.train()
        if freeze_bn:
            for module in self.net.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()

    def eval_nets(self):
        """{label: network} to validate: the model, and its EMA when there is one."""
        return {"": self.net, **({"EMA": self.ema.module} if self.ema is not None else {})}

    def optimizer_params(self):
        """The tensors the optimizer updates (the fp32 masters under O2)."""
        return (p for group in self.optimizer.param_groups for p in group["params"])

    def metrics(self):
        return self.precision.metrics()


def build_train_step(cfg, device):
    """The TrainStep for a resolved config, on ``device`` (the process's card)."""
    derived, model_cfg, optim = cfg["derived"], cfg["model"], cfg["optim"]
    net = MobileNetV1(width_mult=model_cfg["width_mult"], num_classes=model_cfg["num_classes"])
    if model_cfg["pretrained"]:
        load_weights(net, load_checkpoint(model_cfg["pretrained"]), model_cfg["pretrained"])
    if model_cfg["sync_bn"] and derived["world_size"] > 1:
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    layout = torch.channels_last if derived["channels_last"] else torch.contiguous_format
    net = net.to(device, memory_format=layout)
    precision = build_precision(cfg["amp"], backend=derived["amp_backend"], device=device, net=net,
                                skip_on_device=derived["optimizer_implementation"] == "torch_fused")
    optimizer = build_optimizer(precision.params(net), implementation=derived["optimizer_implementation"],
                                name=optim["name"], lr=derived["lr"],
                                weight_decay=optim["weight_decay"],
                                no_decay_bn_bias=optim["no_decay_bn_bias"], **hyperparameters(optim))
    net, optimizer = precision.initialize(net, optimizer)
    decay = cfg["train"]["ema_decay"]
    ema = WeightEMA(net, decay) if decay > 0 else None
    model = wrap_ddp(net, derived["world_size"], device)
    if derived["compile"]:  # net stays eager: checkpoints keep their keys, validation runs it
        model = compiled(model, **derived["compile"])
        if derived["optimizer_implementation"] != "npu_fused":  # NpuFused* manage their own combined buffers
            hold_lr_in_tensors(optimizer)
            # a bound method again, as LR schedulers expect to find and wrap
            optimizer.step = types.MethodType(torch.compile(type(optimizer).step), optimizer)
    return TrainStep(net=net, model=model, optimizer=optimizer, compiled=derived["compile"] is not None,
                     precision=precision, ema=ema, implementation=derived["optimizer_implementation"],
                     algorithm=optim["name"],
                     criterion=nn.CrossEntropyLoss(label_smoothing=cfg["train"]["label_smoothing"]))
