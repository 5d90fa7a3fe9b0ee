"""What trains and all of its state, wired once from a resolved config.

``TrainStep``: the training step and what it owns (network, optimizer, precision, EMA).
``TrainingState``: the step, its LR schedule, the input path to the device, the run's position
(epoch, epoch_step, global_step, best top-1, finished), every piece of state a resume needs (one
``state_dict()``, the checkpoint) and the resume policy (which checkpoint, when to refuse and why).
The engine and the benchmarks that measure the app build their training through ``TrainingState``,
so a change to the schedule, the input dtype or the layout is made here once (the ceiling
benchmark's plain loops build their own, on purpose: they are what the app is measured against).
"""
import contextlib
import hashlib
import re
import types
import warnings

import torch
from torch import nn

from mobilenet import checkpoint as ckpt
from mobilenet.amp import build_precision
from mobilenet.config import thaw
from mobilenet.data.prefetch import DevicePrefetcher
from mobilenet.device import compiled, device_module
from mobilenet.distributed import broadcast_from_rank0, every_rank, first_disagreement, from_rank0, wrap_ddp
from mobilenet.ema import WeightEMA
from mobilenet.errors import TrainingFailure, UsageError
from mobilenet.model import build_model, check_same_model, load_weights, unwrap_state_dict
from mobilenet.optim import (ALGORITHMS, IMPLEMENTATIONS, build_optimizer, build_scheduler, hold_lr_in_tensors,
                             hyperparameters, plain_numbers)

NO_PHASE = contextlib.nullcontext()


def no_phase(name):
    return NO_PHASE


class TrainStep:
    """``loss = step(images, labels)``: forward, loss, backward, unscale, optimizer step, zero_grad
    and the EMA update, in one call, for the loop to call and for a device graph to capture.

    Owns the network (``net`` bare; ``wrapped``, the one the step calls: DDP-wrapped in distributed
    runs, compiled under train.compile), the optimizer (``implementation``: loop|foreach|torch_fused|npu_fused|
    apex_npu_fused, as resolved), the precision (amp level, loss scaling, O2 masters) and the EMA.
    The step reads nothing back to the host, except the loss scaler's overflow check for
    optimizers without a device-side skip (documented there). ``phase``: a function name ->
    context manager that wraps each phase (timing and op counts in mobilenet.measure); a no-op by
    default.
    """

    def __init__(self, *, net, wrapped, optimizer, precision, criterion, implementation, algorithm="sgd",
                 ema=None, compiled=False):
        self.net, self.wrapped, self.optimizer = net, wrapped, optimizer
        self.precision, self.criterion, self.ema = precision, criterion, ema
        self.implementation, self.algorithm, self.compiled = implementation, algorithm, compiled
        self.set_to_none = IMPLEMENTATIONS[implementation].grads_to_none
        self.phase = no_phase

    def __call__(self, images, labels):
        phase, precision, optimizer = self.phase, self.precision, self.optimizer
        with phase("forward"), precision.autocast():
            logits = self.wrapped(images)
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

    def metrics(self):
        return self.precision.metrics()


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
                     criterion=nn.CrossEntropyLoss(label_smoothing=cfg["train"]["label_smoothing"]))


class TrainingState:
    """Owns the TrainStep, the per-iteration LR schedule over ``steps_per_epoch`` steps an epoch,
    and the run's position: ``epoch`` (epochs completed), ``epoch_step`` (batches done in the epoch
    under way), ``global_step`` (steps trained since the run began), the best top-1, and
    ``resumed_at`` (the global step a resumed run continues after; None for a fresh run).
    ``state_dict()`` is the checkpoint (Ascend ModelZoo's keys epoch, arch, state_dict,
    best_prec1, optimizer, plus ours); ``resume()`` picks and restores one."""

    def __init__(self, cfg, device, steps_per_epoch, rank=0):
        self.cfg, self.device, self.steps_per_epoch, self.rank = cfg, device, steps_per_epoch, rank
        self.train_step = build_train_step(cfg, device)
        self.scheduler = build_scheduler(self.train_step.optimizer, schedule=cfg["schedule"],
                                         base_lr=cfg["derived"]["lr"], steps_per_epoch=steps_per_epoch,
                                         epochs=cfg["train"]["epochs"])
        self.epoch, self.epoch_step, self.best_top1 = 0, 0, 0.0
        self.global_step = 0        # steps trained since the run began (counted: an epoch skipped on a
                                    # resume, or a changed epoch length, does not renumber them)
        self.awaiting_validation = False  # the last step ended an epoch (or the run) not yet validated
        self.resumed_at = None
        self.settings_kept = []  # notes: this run's settings where a resumed checkpoint had others
        # this rank's random generators at the first step (dropout's draws): seeded, or a checkpoint's
        self.rng_start = training_seed(cfg["seed"], rank, 0)
        self.data = None  # {"train": data_record, "val": ...}: what the run trains on (set by its builder)

    def start_random_states(self):
        """This rank's random generators as the position says (before the first step): whatever
        the process drew from them before (another run, a cost estimate) changes no draw."""
        if isinstance(self.rng_start, int):
            torch.manual_seed(self.rng_start)
        else:
            set_rng_states(self.rng_start, self.device)

    # What the loop needs of the step, so that it never reaches into it.
    def batches(self, loader):
        """``loader``'s uint8 batches on the device, normalised, in the layout and dtype the step takes."""
        return DevicePrefetcher(loader, self.device, self.cfg["derived"]["channels_last"],
                                self.train_step.precision.input_dtype,
                                decode_on_device=self.cfg["derived"]["decode"] == "device")

    def train_on(self, images, labels):
        """One training step and the schedule's; returns the loss (on the device)."""
        loss = self.train_step(images, labels)
        self.step_schedule()
        self.epoch_step += 1
        self.global_step += 1
        self.awaiting_validation = self.epoch_step == self.steps_per_epoch or self.finished
        return loss

    def step_schedule(self, at=None):
        """The LR schedule's step; ``at``: to the LR of that position's step instead (a resume)."""
        if at is not None:
            self.scheduler.last_epoch = at - 1
        elif self.global_step:  # torch checks the order at a schedule's first step only
            self.scheduler.step()
            return
        with warnings.catch_warnings():
            # A step the loss scaler skipped (or a resume's repositioning) made no optimizer.step(),
            # on purpose: the LR follows the step count. torch warns about that order; here it is no mistake.
            warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()`"))
            self.scheduler.step()

    def train(self, freeze_bn=False):
        self.train_step.train(freeze_bn)

    def eval_nets(self):
        return self.train_step.eval_nets()

    def autocast(self):
        return self.train_step.precision.autocast()

    def lr(self):
        return float(self.train_step.optimizer.param_groups[0]["lr"])  # a tensor under train.compile

    def metrics(self):
        """The precision's own metrics (loss scale, skipped steps) as numbers."""
        return {name: float(value) for name, value in self.train_step.metrics().items()}

    def skips_bad_steps(self):
        """Whether a non-finite loss is a step the dynamic loss scaler skips (else the run diverged)."""
        return self.train_step.precision.dynamic_loss_scale

    def set_phase_hook(self, hook):
        """``hook(name)``: a context manager around each phase of the step (mobilenet.measure)."""
        self.train_step.phase = hook

    def phase(self, name):
        """The phase hook around a phase of the loop's own (its wait for data)."""
        return self.train_step.phase(name)

    def sync_buffers(self):
        """Rank 0's BatchNorm statistics (the network's and the EMA's) on every rank, so that every
        rank validates the model that rank 0 saves. Rank 0's, not an average: DDP broadcasts rank
        0's buffers at each training forward already, so only the last step's batch differs, and
        the EMA's average of them stays a function of rank 0's history, which a checkpoint holds
        (a mid-epoch resume stays exact)."""
        step = self.train_step
        broadcast_from_rank0([*step.net.buffers(), *(step.ema.module.buffers() if step.ema else ())])

    def check_ranks_agree(self):
        """Every rank must hold what rank 0 saves for all of them: the checkpoint's state (weights or
        O2 masters, buffers, optimizer, scheduler, loss scaler, EMA; not the RNG states, per rank by
        design) and the network the step trains. A TrainingFailure names the first that differs."""
        found = first_disagreement(self.shared_state(), self.device)
        if found:
            name, ranks = found
            raise TrainingFailure(f"the ranks disagree at the end of epoch {self.epoch}: {name} differs on "
                                  f"rank(s) {', '.join(map(str, ranks))} from rank 0 (a rank's memory, "
                                  f"kernel or code went its own way); stopped before saving, the "
                                  f"checkpoints written before stay valid")

    def shared_state(self):
        """[(name, tensor or number)] of what must be equal on every rank (check_ranks_agree)."""
        checkpoint = {k: v for k, v in self.state_dict(every_rank_rng=False).items() if k not in PER_RANK_KEYS}
        items = list(flat_items(checkpoint))
        seen = {where(value) for _, value in items if isinstance(value, torch.Tensor)}
        # the network's tensors that the checkpoint does not hold already (O2's half weights)
        return items + [(f"network.{name}", value) for name, value in self.train_step.net.state_dict().items()
                        if where(value) not in seen]

    def weights_finite(self):
        """Whether every weight is finite (one device read: for saves between loss checks)."""
        params = list(self.train_step.optimizer_params())
        return bool(torch.stack([p.detach().isfinite().all() for p in params]).all())

    # The position.
    @property
    def steps_left(self):
        """Steps the run still trains: to the end of its epochs, or of train.max_steps when sooner."""
        train = self.cfg["train"]
        left = (train["epochs"] - self.epoch) * self.steps_per_epoch - self.epoch_step
        return min(left, train["max_steps"] - self.global_step) if train["max_steps"] else left

    @property
    def finished(self):
        return self.steps_left <= 0

    @property
    def mid_epoch(self):
        """Whether the epoch under way has batches left (a signal stopped it, or it has not begun)."""
        return self.epoch_step < self.steps_per_epoch and not self.finished

    def end_epoch(self, top1, scored):
        """After an epoch's validation: the best top-1 kept and, when the epoch is whole, the next
        one begun (one that train.max_steps cut short stays where it is). Returns whether it is a
        new best."""
        self.awaiting_validation = False
        if self.epoch_step == self.steps_per_epoch:
            self.epoch, self.epoch_step = self.epoch + 1, 0
        is_best = scored > 0 and top1 > self.best_top1
        self.best_top1 = max(self.best_top1, top1)
        return is_best

    # The checkpoint.
    def state_dict(self, every_rank_rng=True):
        """The checkpoint. ``rng``: every rank's random generators, by rank (a collective: every
        rank calls it at once); without ``every_rank_rng``, this rank's alone (no collective)."""
        step = self.train_step
        rng = every_rank(rng_states(self.device)) if every_rank_rng else [rng_states(self.device)]
        return {"arch": self.cfg["model"]["name"], "epoch": self.epoch, "epoch_step": self.epoch_step,
                "global_step": self.global_step, "validated": not self.awaiting_validation,
                "best_prec1": self.best_top1, "rng": rng,
                "state_dict": step.precision.weights(step.net),  # the fp32 masters under O2
                "optimizer": plain_numbers(step.optimizer.state_dict()),
                "scheduler": plain_numbers(self.scheduler.state_dict()),
                "amp": step.precision.state_dict(),
                "ema": step.ema.state_dict() if step.ema is not None else None,
                "data": self.data, "config": thaw(self.cfg)}

    def load_state_dict(self, checkpoint, source="checkpoint"):
        """The weights of ``checkpoint`` (ours or ModelZoo's); all the rest too when it is a
        training checkpoint, which this run must be able to continue (a UsageError says what
        differs). Returns whether it was a training checkpoint."""
        step = self.train_step
        if is_training_checkpoint(checkpoint):  # checked before any weight is loaded
            self.check_resumable(checkpoint, source)
        load_weights(step.net, checkpoint, source, self.cfg["model"]["name"])
        step.precision.load_weights(unwrap_state_dict(checkpoint))
        if not is_training_checkpoint(checkpoint):
            return False
        self.settings_kept = load_optimizer_state(step, checkpoint["optimizer"], self.cfg["optim"])
        self.settings_kept += step.precision.load_state_dict(checkpoint.get("amp") or {})
        if step.ema is not None and checkpoint.get("ema"):
            step.ema.load_state_dict(checkpoint["ema"])
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        self.epoch, self.epoch_step = checkpoint["epoch"], checkpoint["epoch_step"]
        # written before these were recorded: counted as the position, and an epoch's last step
        # not validated (a save after validation has begun the next epoch, or stopped short of it)
        self.global_step = checkpoint.get("global_step", self.epoch * self.steps_per_epoch + self.epoch_step)
        self.awaiting_validation = not checkpoint.get("validated", self.epoch_step < self.steps_per_epoch)
        self.best_top1 = float(checkpoint["best_prec1"])
        self.rng_start = rank_rng(checkpoint["rng"], self.rank) or training_seed(self.cfg["seed"], self.rank,
                                                                                   self.global_step)
        if self.epoch_step and self.cfg["train"]["resume_next_epoch"] and not self.awaiting_validation:
            # the rest of the epoch is skipped
            self.epoch, self.epoch_step = self.epoch + 1, 0
            self.step_schedule(at=self.epoch * self.steps_per_epoch)  # the next epoch's first step
        return True

    def continue_modelzoo(self, checkpoint):
        """After the weights of a checkpoint of ModelZoo's main.py (epoch, arch, state_dict,
        best_prec1, optimizer; no scheduler): its position (its epoch is the next to train), its
        best top-1 and its optimizer's state where it fits this run's; returns what could not be
        taken, for one line."""
        if not (whole(checkpoint.get("epoch")) and isinstance(checkpoint.get("best_prec1"), (int, float))):
            return ["its position and best top-1 (epoch and best_prec1 are not numbers)"]
        self.epoch, self.epoch_step = checkpoint["epoch"], 0
        self.global_step = self.epoch * self.steps_per_epoch
        self.best_top1 = float(checkpoint["best_prec1"])
        self.rng_start = training_seed(self.cfg["seed"], self.rank, self.global_step)
        self.step_schedule(at=self.global_step)  # the LR of that epoch's first step
        left = ["the loss scaler's and the random generators' states (ModelZoo's checkpoints hold neither)"]
        misfit = optimizer_misfit(checkpoint.get("optimizer"), self.train_step.optimizer, self.cfg["optim"]["name"])
        if misfit:
            left.insert(0, f"its optimizer state ({misfit})")
        else:
            lrs = [group["lr"] for group in self.train_step.optimizer.param_groups]
            self.settings_kept = load_optimizer_state(self.train_step, checkpoint["optimizer"], self.cfg["optim"])
            for group, lr in zip(self.train_step.optimizer.param_groups, lrs):
                group["lr"] = lr  # the schedule's, for that epoch
        return left

    # The resume policy.
    def resume(self, resume, *, fallback=None, evaluate_only=False, say=print):
        """Loads a checkpoint ('auto': the one of the run directory that got furthest, else
        ``fallback``; none: a fresh start, said). Rank 0 reads it and sends it to the others: every
        rank continues from the same state, and nodes without a shared file system need no copy of
        the run directory. Sets ``resumed_at`` unless it gave only weights."""
        output = self.cfg["output"]
        path, checkpoint = from_rank0(lambda: choose_checkpoint(resume, fallback, evaluate_only, output, say))
        if checkpoint is None:  # a restart before the first save, say: the first round's records go
            self.resumed_at = 0
            return
        left = None
        if self.load_state_dict(checkpoint, path):
            self.resumed_at = self.global_step
        elif is_modelzoo_checkpoint(checkpoint) and not evaluate_only:
            left = self.continue_modelzoo(checkpoint)
            self.resumed_at = self.global_step
        say(f"resumed from {path} (epoch {self.epoch}, batch {self.epoch_step}; global step {self.global_step})")
        if left:
            say(f"note: {path} is a checkpoint of ModelZoo's main.py: its weights, epoch and best top-1 "
                f"{self.best_top1:.3f} are taken, not {' nor '.join(left)}")
        for change in self.settings_kept + self.changes_since(checkpoint):
            say(f"note: {change}")

    def changes_since(self, checkpoint):
        """What a resume of ``checkpoint`` changes (global batch, LR, data order, the data), as notes."""
        notes = []
        derived = (checkpoint.get("config") or {}).get("derived") or {}
        was = (derived.get("world_size"), derived.get("global_batch"), derived.get("lr"))
        now = tuple(self.cfg["derived"][key] for key in ("world_size", "global_batch", "lr"))
        if None not in was and was != now:
            notes.append(f"the checkpoint trained with {was[0]} process(es), global batch {was[1]}, lr {was[2]:g}; "
                         f"this run has {now[0]}, {now[1]}, lr {now[2]:g}, and so another data order")
        unknown = sorted(str(key) for key in checkpoint if key not in KNOWN_KEYS)
        if unknown:
            notes.append(f"the checkpoint's keys {', '.join(unknown[:8])} are not this app's; ignored")
        changed = data_changes(checkpoint.get("data"), self.data)
        if not checkpoint.get("data"):
            notes.append("the checkpoint records no description of its data (written before they were "
                         "recorded), so whether the data changed could not be checked")
        elif changed:
            notes.append(f"the data changed since the checkpoint: {changed}")
        if checkpoint.get("epoch_step") and self.cfg["train"]["resume_next_epoch"]:
            notes.append(f"train.resume_next_epoch: the rest of epoch {checkpoint['epoch']} (from batch "
                         f"{checkpoint['epoch_step']}) is skipped; training goes on at epoch {self.epoch}")
        return notes

    def check_resumable(self, checkpoint, source):
        """The one place that says why a training checkpoint cannot continue in this run."""
        weights_only = f"to start from its weights only, pass model.pretrained={source} instead of --resume"
        check_same_model(checkpoint, self.cfg["model"]["name"], source)
        for key, expected, fits in FIELDS:
            if not fits(checkpoint.get(key)):
                raise UsageError(f"{source}: not a checkpoint this app can resume: its '{key}' is "
                                 f"{str(checkpoint.get(key))[:40]!r} ({type(checkpoint.get(key)).__name__}), "
                                 f"expected {expected}; {weights_only}")
        saved = ((checkpoint.get("config") or {}).get("optim") or {}).get("name")
        algorithm = self.cfg["optim"]["name"]
        if saved and saved != algorithm:
            raise UsageError(f"{source}: trained with optimizer {saved}, this run uses {algorithm} "
                             f"(optim.name); {weights_only}")
        saved = checkpoint.get("config") or {}
        was = ((saved.get("derived") or {}).get("world_size"), (saved.get("data") or {}).get("batch_size"))
        now = (self.cfg["derived"]["world_size"], self.cfg["data"]["batch_size"])
        epoch, epoch_step = checkpoint["epoch"], checkpoint["epoch_step"]
        if epoch_step and None not in was and was != now:
            raise UsageError(f"{source}: stopped mid-epoch (batch {epoch_step}) with {was[0]} process(es) x "
                             f"data.batch_size {was[1]}; this run has {now[0]} x {now[1]}, so the epoch would "
                             f"go on from another place; resume with {was[0]} x {was[1]}, or from a checkpoint "
                             f"written at an epoch's end")
        changed = data_changes(checkpoint.get("data"), self.data)
        if epoch_step and changed and "train:" in changed and not self.cfg["train"]["resume_next_epoch"]:
            raise UsageError(f"{source}: stopped mid-epoch (epoch {epoch}, batch {epoch_step}) on "
                             f"other data ({changed}), so that epoch cannot go on; restore the data, or go on "
                             f"from the start of epoch {epoch + 1} with train.resume_next_epoch=true")
        groups = [len(group["params"]) for group in checkpoint["optimizer"].get("param_groups", [])]
        own = [len(group["params"]) for group in self.train_step.optimizer.param_groups]
        if groups != own:
            raise UsageError(f"{source}: its optimizer has parameter groups of {groups} tensors, this "
                             f"run's of {own} (optim.no_decay_bn_bias differs?); {weights_only}")


def load_optimizer_state(step, saved, optim):
    """``saved`` (an optimizer state dict) into ``step``'s optimizer, whose settings stay this run's
    (torch's load_state_dict takes the checkpoint's: its momentum, weight decay, its foreach or
    fused flag); the LR is the schedule's. Returns a note per optim.* setting the checkpoint had
    another value of."""
    optimizer = step.optimizer
    own = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(saved)
    named = {"weight_decay", *ALGORITHMS[optim["name"]].hyperparameters}
    notes = {}
    for group, settings in zip(optimizer.param_groups, own):
        for key, value in settings.items():
            if key not in ("lr", "initial_lr") and group.get(key) != value:
                if key in named:
                    notes.setdefault(key, f"optim.{key}: the checkpoint's optimizer had {group.get(key)}, this "
                                          f"run's is {value} (config.yaml), which it trains with")
                group[key] = value
    if step.compiled:  # load_state_dict put the saved float LRs where the tensors were
        hold_lr_in_tensors(optimizer)
    return [notes[key] for key in sorted(notes)]


def choose_checkpoint(resume, fallback, evaluate_only, output, say):
    """(path, checkpoint dict) to resume from, or (None, None) to start fresh (said)."""
    if resume != "auto":
        checkpoint = ckpt.load_checkpoint(resume)
        if not evaluate_only:
            refuse_going_back(resume, checkpoint, output)
        return str(resume), checkpoint
    found = ckpt.load_latest(output, say, is_training_checkpoint)
    if found is not None:
        return str(found[0]), found[1]
    if fallback:
        return str(fallback), ckpt.load_checkpoint(fallback)
    if evaluate_only:  # random weights are nothing to evaluate
        raise UsageError(f"--evaluate --resume auto: no checkpoint in {output}/checkpoints; "
                         f"pass --output of a run that has one, or --resume FILE")
    say(f"--resume auto: no checkpoint in {output}, starting fresh")
    return None, None


def refuse_going_back(resume, checkpoint, output):
    """A run resumed from ``resume`` saves over the run directory's last.pt: refused when that
    directory holds a checkpoint of a later position (it would be replaced by an earlier one)."""
    if not is_training_checkpoint(checkpoint):
        return
    try:
        later = ckpt.load_latest(output, lambda line: None, is_training_checkpoint)
    except UsageError:  # nothing there can continue a run: nothing to lose
        return
    at = (checkpoint["epoch"], checkpoint["epoch_step"])
    if later and (later[1]["epoch"], later[1]["epoch_step"]) > at:
        raise UsageError(f"--resume {resume} is at epoch {at[0]} batch {at[1]}, but {later[0]} is further "
                         f"(epoch {later[1]['epoch']} batch {later[1]['epoch_step']}) and this run would save "
                         f"over it; to branch from {resume}, pass another --output")


# Checkpoint keys that are per rank by design (the RNG states) or not state (the data record, the config).
PER_RANK_KEYS = {"rng", "data", "config"}


def flat_items(tree, prefix=""):
    """(dotted name, tensor or number) of every tensor and number in nested dicts and lists."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list, tuple)):
            yield from flat_items(value, name + ".")
        elif isinstance(value, (torch.Tensor, int, float)):
            yield name, value


def where(tensor):
    """What tells two views of the same values apart from a copy."""
    return tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride()


def whole(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# The fields of a training checkpoint that a resume reads, what each must be, and the test.
FIELDS = [("epoch", "a whole number", whole), ("epoch_step", "a whole number", whole),
          ("best_prec1", "a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
          ("optimizer", "an optimizer state dict", lambda v: isinstance(v, dict) and "param_groups" in v),
          ("scheduler", "a scheduler state dict", lambda v: isinstance(v, dict)),
          ("rng", "the random generators' states", lambda v: rng_field(v)),
          ("global_step", "a whole number (or absent)", lambda v: v is None or whole(v)),
          ("validated", "true or false (or absent)", lambda v: v is None or isinstance(v, bool))]
KNOWN_KEYS = {"arch", "epoch", "epoch_step", "global_step", "validated", "best_prec1", "rng", "state_dict",
              "optimizer", "scheduler", "amp", "ema", "data", "config"}


def data_changes(was, now, then="then", here="now"):
    """'train: 1437 images then, 718 now; val: the same count, other files' for the splits that
    differ between two data records, or '' (also when one is missing); ``then`` and ``here`` name them."""
    if not was or not now:
        return ""
    changes = []
    for split in ("train", "val"):
        before, after = was.get(split) or {}, now[split]
        if before != after:
            counts = (f"the same {after['images']} images, other files or labels"
                      if before.get("images") == after["images"]
                      else f"{before.get('images')} images {then}, {after['images']} {here}")
            changes.append(f"{split}: {counts}")
    return "; ".join(changes)


def is_modelzoo_checkpoint(checkpoint):
    """A checkpoint of ModelZoo's main.py (epoch, arch, state_dict, best_prec1, optimizer)."""
    return not is_training_checkpoint(checkpoint) and {"epoch", "state_dict", "best_prec1"} <= checkpoint.keys()


def optimizer_misfit(saved, optimizer, algorithm):
    """Why ``saved`` (the optimizer state of ModelZoo's main.py: SGD's momentum buffers) cannot go
    into ``optimizer`` (of ``algorithm``), or '' when it fits: SGD, the same parameter groups, a
    momentum buffer of each tensor's shape."""
    if not (isinstance(saved, dict) and isinstance(saved.get("state"), dict) and saved.get("param_groups")):
        return "it holds none"
    if algorithm != "sgd":
        return f"SGD's momentum, and this run's optimizer is {algorithm}"
    own = optimizer.param_groups
    if [len(group.get("params", ())) for group in saved["param_groups"]] != [len(group["params"]) for group in own]:
        return "its parameter groups differ from this run's"
    params = [p for group in own for p in group["params"]]
    for index, state in saved["state"].items():
        buffer = state.get("momentum_buffer") if isinstance(state, dict) else None
        if not (isinstance(index, int) and 0 <= index < len(params) and set(state) == {"momentum_buffer"}
                and isinstance(buffer, torch.Tensor) and buffer.shape == params[index].shape):
            return f"its state of tensor {index} is not a momentum buffer of that tensor's shape"
    return ""


def is_training_checkpoint(checkpoint):
    """Whether a checkpoint dict can continue a run (ours), not only give weights (ModelZoo's own
    and weights files have no scheduler)."""
    return bool(checkpoint.get("optimizer")) and bool(checkpoint.get("scheduler"))


def training_seed(seed, rank, global_step):
    """The seed of ``rank``'s random generators for training from ``global_step`` where no state of
    them was saved: a stream of its own per (seed, rank, step), apart from the initial weights'."""
    return int.from_bytes(hashlib.sha256(f"train {seed} {rank} {global_step}".encode()).digest()[:8], "little")


def rng_field(value):
    """Whether ``value`` is a checkpoint's random states: a list by rank (or one rank's, written
    before every rank's were kept)."""
    states = [value] if isinstance(value, dict) else value
    return isinstance(states, list) and bool(states) and all(isinstance(s, dict) and "torch" in s for s in states)


def rank_rng(saved, rank):
    """``rank``'s states among a checkpoint's (a list by rank; a checkpoint written before every
    rank's were kept holds rank 0's alone), or None where it holds none of that rank."""
    states = [saved] if isinstance(saved, dict) else saved
    return states[rank] if rank < len(states) else None


def rng_states(device):
    """This process's random generators: torch's (cpu) and its device's."""
    states = {"torch": torch.get_rng_state()}
    module = device_module(device)
    if module is not None:
        states["device"] = module.get_rng_state()
    return states


def set_rng_states(states, device):
    torch.set_rng_state(states["torch"])
    if "device" in states and device_module(device) is not None:
        device_module(device).set_rng_state(states["device"])
