"""The training step and what it owns, built once from a resolved config (``build_train_step``),
and its input on the device (``DevicePrefetcher``)."""
import contextlib
import copy
import functools
import hashlib
import itertools
import types
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from mobilenet import checkpoint as ckpt
from mobilenet.amp import build_precision
from mobilenet.data.transforms import IMAGENET_MEAN, IMAGENET_STD, ValCrop, drawn_from
from mobilenet.device import compiled
from mobilenet.distributed import broadcast_from_rank0, wrap_ddp
from mobilenet.model import build_model, load_weights
from mobilenet.optim import IMPLEMENTATIONS, build_optimizer, hold_lr_in_tensors, hyperparameters, parameter_decays

NO_PHASE = contextlib.nullcontext()


def no_phase(name):
    return NO_PHASE


class TrainStep:
    """``loss = step(images, labels)``: forward, loss, backward, unscale, optimizer step, zero_grad
    and the EMA update in one call, reading nothing back to the host but the loss scaler's check.
    ``net`` is the bare network, ``wrapped`` the one called (DDP, compiled); ``phase``: name ->
    context manager around each phase (mobilenet.measure)."""

    def __init__(self, *, net, wrapped, optimizer, precision, criterion, implementation, ema=None, compiled=False,
                 device=None, channels_last=False, decode_on_device=False, mix=None, clip_grad_norm=0.0):
        self.net, self.wrapped, self.optimizer = net, wrapped, optimizer
        self.precision, self.criterion, self.ema = precision, criterion, ema
        self.implementation, self.compiled = implementation, compiled
        self.mix, self.clip_grad_norm = mix, clip_grad_norm  # a BatchMix; train.clip_grad_norm
        self.device, self.channels_last, self.decode_on_device = device, channels_last, decode_on_device
        self.set_to_none = IMPLEMENTATIONS[implementation].grads_to_none
        self.phase = no_phase

    def __call__(self, images, labels):
        return self.accumulated([(images, labels)])

    def accumulated(self, batches, after_each=lambda: None, *, epoch=0, step=0, first_rank=0, ema_due=True):
        """One optimizer step over the forwards of ``batches``, each loss divided by their number,
        DDP's all-reduce at the last alone; then one unscale, clip, step and zero_grad, and the EMA
        where ``ema_due``. ``epoch``, ``step`` and ``first_rank`` (the first forward's virtual rank)
        seed the batch mix. Returns the mean loss."""
        phase, precision, optimizer = self.phase, self.precision, self.optimizer
        total = None
        for position, (images, labels) in enumerate(batches):
            if self.mix is not None:
                images, labels = self.mix(images, labels, epoch=epoch, step=step, virtual_rank=first_rank + position)
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
            if self.clip_grad_norm:
                torch.nn.utils.clip_grad_norm_(list(self.optimizer_params()), self.clip_grad_norm)
        with phase("optimizer"):
            precision.step(optimizer)
        with phase("zero_grad"):
            precision.zero_grad(self.net, optimizer, self.set_to_none)
        if self.ema is not None and ema_due:
            with phase("ema"):
                self.ema.update()
        return total

    def without_sync(self, last):
        """DDP's no_sync() but for the ``last`` forward, unless apex moves the grads."""
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

    def sync_buffers(self):
        """Rank 0's BatchNorm statistics (the network's and the EMA's) on every rank, which then
        validates what rank 0 saves. Not an average: DDP broadcasts rank 0's buffers each forward,
        and the EMA's stay a function of rank 0's history, which a checkpoint holds."""
        broadcast_from_rank0([*self.net.buffers(), *(self.ema.module.buffers() if self.ema else ())])

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


class BatchMix:
    """MixUp and CutMix of a batch (torchvision's v2.MixUp and v2.CutMix; with both, one of them a
    batch, as the references choose), the labels becoming soft targets of ``num_classes``."""

    def __init__(self, augment, num_classes, seed):
        from torchvision.transforms import v2
        mixes = [cls(alpha=augment[key], num_classes=num_classes)
                 for cls, key in ((v2.MixUp, "mixup_alpha"), (v2.CutMix, "cutmix_alpha")) if augment[key] > 0]
        self.mix, self.seed = mixes[0] if len(mixes) == 1 else v2.RandomChoice(mixes), seed

    def __call__(self, images, labels, *, epoch, step, virtual_rank):
        draw = hashlib.sha256(f"mix {self.seed} {epoch} {step} {virtual_rank}".encode()).digest()[:8]
        with drawn_from(int.from_bytes(draw, "little")):
            return self.mix(images, labels)


def build_batch_mix(augment, num_classes, seed):
    """The BatchMix of the ``augment`` section, or None (both alphas 0)."""
    return BatchMix(augment, num_classes, seed) if augment["mixup_alpha"] or augment["cutmix_alpha"] else None


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
    # rank 0's weights before the O2 masters and the EMA clone them (DDP's wrap reaches the module alone)
    broadcast_from_rank0(net.state_dict().values())
    precision = build_precision(cfg["amp"], backend=derived["amp_backend"], device=device, net=net,
                                skip_on_device=IMPLEMENTATIONS[implementation].skip_on_device)
    optimizer = build_optimizer(precision.params(net), implementation=implementation, name=optim["name"],
                                lr=derived["lr"], weight_decay=optim["weight_decay"],
                                decays=parameter_decays(net, optim), **hyperparameters(optim))
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
                     precision=precision, ema=ema, implementation=implementation,
                     criterion=nn.CrossEntropyLoss(label_smoothing=cfg["train"]["label_smoothing"]),
                     device=device, channels_last=derived["channels_last"],
                     decode_on_device=derived["decode"] == "device", clip_grad_norm=cfg["train"]["clip_grad_norm"],
                     mix=build_batch_mix(cfg["augment"], model_cfg["num_classes"], cfg["seed"]))


class WeightEMA:
    """``module``: the averaged copy of ``net``. ``update()``: the first copies ``net``, later ones
    lerp each tensor by (1 - decay). The lists hold the Parameter objects, not their storage, so
    they follow NpuFused*'s move into combined buffers (unrun on npu)."""

    def __init__(self, net, decay):
        self.module = copy.deepcopy(net).eval().requires_grad_(False)
        self.decay, self.updates = decay, 0
        self.floating = defaultdict(lambda: ([], []))  # dtype -> (averaged, current)
        self.integer = ([], [])
        pairs = zip(tensors_of(self.module), tensors_of(net), strict=True)
        for averaged, current in pairs:
            lists = self.floating[averaged.dtype] if averaged.is_floating_point() else self.integer
            lists[0].append(averaged)
            lists[1].append(current)

    @torch.no_grad()
    def update(self):
        for averaged, current in self.floating.values():
            if self.updates == 0:
                torch._foreach_copy_(averaged, current)
            else:
                torch._foreach_lerp_(averaged, current, 1 - self.decay)
        if self.integer[0]:
            torch._foreach_copy_(*self.integer)
        self.updates += 1

    def state_dict(self):
        """AveragedModel's layout: ``n_averaged`` and the averaged module's tensors as ``module.*``."""
        return {"n_averaged": torch.tensor(self.updates),
                **{f"module.{k}": v for k, v in self.module.state_dict().items()}}

    def load_state_dict(self, state):
        self.module.load_state_dict({k.removeprefix("module."): v for k, v in state.items()
                                     if k.startswith("module.")})
        self.updates = int(state["n_averaged"])


def tensors_of(net):
    return itertools.chain(net.parameters(), net.buffers())


@functools.lru_cache(maxsize=None)
def copy_stream(device):
    """One side stream per device for the run: torch_npu leaks memory on streams made each epoch."""
    return getattr(torch, device.type).Stream(device)


class DevicePrefetcher:
    """A loader's uint8 batches on the device, normalised there in the step's layout and dtype; the
    next one's copy on a side stream (cuda, npu) while the current one trains. ``decode_on_device``:
    the batches hold JPEGs, decoded and cropped there first (mobilenet.data.device_decode)."""

    def __init__(self, loader, device, channels_last=False, dtype=torch.float32, decode_on_device=False):
        self.loader, self.device = loader, device
        self.decoder = None
        if decode_on_device:
            from mobilenet.data.device_decode import DeviceDecoder  # imported only then
            crop = loader.dataset.transform.crop  # a ScreenedCrop's TrainCrop or ValCrop
            self.decoder = DeviceDecoder(loader.dataset, device, crop.size, crop if isinstance(crop, ValCrop) else None)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.dtype = dtype
        mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1) * 255
        std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1) * 255
        self.scale, self.shift = 1 / std, -mean / std  # (x - mean) / std = x * scale + shift
        # torch.cuda and torch.npu (torch_npu) share the stream API used here
        self.streams = getattr(torch, device.type) if device.type in ("cuda", "npu") else None
        self.side_stream = copy_stream(device) if self.streams else None

    def __len__(self):
        return len(self.loader)

    def _to_device(self, batch):
        """The uint8 batch into the layout, then one fp32 multiply-add written in the step's dtype."""
        if self.decoder is not None:
            images, labels = self.decoder(batch)
        else:
            images, labels = batch
        images = images.to(self.device, non_blocking=True).contiguous(memory_format=self.memory_format)
        normalised = torch.empty(images.shape, dtype=self.dtype, device=self.device,
                                 memory_format=self.memory_format)
        torch.addcmul(self.shift, images, self.scale, out=normalised)
        return normalised, labels.to(self.device, non_blocking=True)

    def _start(self, batch):
        """Queues ``batch``'s copy and normalisation (on the side stream where there is one)."""
        if batch is None:
            return None
        if self.side_stream is None:
            return self._to_device(batch)
        with self.streams.stream(self.side_stream):
            return self._to_device(batch)

    def _ready(self, batch):
        """The compute stream waits for the side stream's work and holds the batch's memory."""
        if self.side_stream is not None:
            compute = self.streams.current_stream(self.device)
            compute.wait_stream(self.side_stream)
            for tensor in batch:
                tensor.record_stream(compute)
        return batch

    def __iter__(self):
        if self.side_stream is not None:  # scale and shift were made on the compute stream
            self.side_stream.wait_stream(self.streams.current_stream(self.device))
        iterator = iter(self.loader)
        if self.decoder is not None:
            yield from self.decoded(iterator)
            return
        upcoming = self._start(next(iterator, None))
        while upcoming is not None:
            current = self._ready(upcoming)  # before the next batch is queued behind it
            upcoming = self._start(next(iterator, None))
            yield current

    def decoded(self, iterator):
        """As __iter__, the next batch prepared in a thread of its own: decode_jpeg blocks its caller."""
        with ThreadPoolExecutor(1, thread_name_prefix="device-decode") as thread:
            upcoming = thread.submit(self._start, next(iterator, None))
            while (batch := upcoming.result()) is not None:
                current = self._ready(batch)
                upcoming = thread.submit(self._start, next(iterator, None))
                yield current
