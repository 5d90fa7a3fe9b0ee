"""The run's training state: its position, its checkpoint and the resume policy.

``TrainingState`` owns the TrainStep (mobilenet/training.py) and the per-iteration LR schedule,
the position (epoch, epoch_step, global_step, best top-1, finished) and each rank's random
generators at the first step; ``state_dict()`` is the checkpoint (checkpoint.KEYS) and
``resume()`` picks one, checks that this run can continue it and restores it.
"""
import hashlib
import re
import warnings

import torch

from mobilenet import checkpoint as ckpt
from mobilenet.config import thaw, with_global_batch
from mobilenet.data.datasets import data_changes
from mobilenet.device import device_module
from mobilenet.distributed import broadcast_from_rank0, every_rank, from_rank0
from mobilenet.errors import UsageError
from mobilenet.model import check_same_model, load_weights, unwrap_state_dict
from mobilenet.optim import ALGORITHMS, build_scheduler, hold_lr_in_tensors, plain_numbers
from mobilenet.training import build_train_step


class TrainingState:
    """The TrainStep, the LR schedule over ``steps_per_epoch`` steps an epoch, and the run's
    position: ``epoch`` (epochs completed), ``epoch_step`` (batches done in the epoch under way),
    ``global_step`` (steps trained since the run began: counted, so an epoch skipped on a resume
    renumbers nothing), the best top-1, ``awaiting_validation`` (the last step ended an epoch, or
    the run, not yet validated) and ``resumed_at`` (the global step a resumed run continues after;
    None for a fresh run)."""

    def __init__(self, cfg, device, steps_per_epoch, rank=0):
        self.cfg, self.device, self.steps_per_epoch, self.rank = cfg, device, steps_per_epoch, rank
        self.train_step = build_train_step(cfg, device)
        self.scheduler = build_scheduler(self.train_step.optimizer, schedule=cfg["schedule"],
                                         base_lr=cfg["derived"]["lr"], steps_per_epoch=steps_per_epoch,
                                         epochs=cfg["train"]["epochs"])
        self.epoch, self.epoch_step, self.global_step, self.best_top1 = 0, 0, 0, 0.0
        self.awaiting_validation = False
        self.resumed_at = None
        self.notes = []  # what a resume said: this run's settings where its checkpoint had others
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

    def train_on(self, batches, after_each=lambda: None):
        """One optimizer step over ``batches`` (train.grad_accum_steps forwards) and the schedule's;
        returns the loss (on the device)."""
        loss = self.train_step.accumulated(batches, after_each)
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

    def sync_buffers(self):
        """Rank 0's BatchNorm statistics (the network's and the EMA's) on every rank, so that every
        rank validates the model that rank 0 saves. Rank 0's, not an average: DDP broadcasts rank
        0's buffers at each training forward already, so only the last step's batch differs, and
        the EMA's average of them stays a function of rank 0's history, which a checkpoint holds
        (a mid-epoch resume stays exact)."""
        step = self.train_step
        broadcast_from_rank0([*step.net.buffers(), *(step.ema.module.buffers() if step.ema else ())])

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

    def continue_at(self, epoch, best_top1):
        """Goes on from the start of ``epoch`` with ``best_top1`` (a checkpoint without our position:
        the LR of that epoch's first step, the random generators seeded for it)."""
        self.epoch, self.epoch_step, self.best_top1 = epoch, 0, best_top1
        self.global_step = epoch * self.steps_per_epoch
        self.rng_start = training_seed(self.cfg["seed"], self.rank, self.global_step)
        self.step_schedule(at=self.global_step)

    # The checkpoint.
    def state_dict(self, every_rank_rng=True):
        """The checkpoint (checkpoint.KEYS). ``rng``: every rank's random generators, by rank (a
        collective: every rank calls it at once); without ``every_rank_rng``, this rank's alone."""
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

    def load_state_dict(self, checkpoint, path="checkpoint"):
        """The weights of ``checkpoint`` (ours or ModelZoo's); all the rest too when it is a
        training checkpoint, which this run must be able to continue (a UsageError says what
        differs). Returns whether it was a training checkpoint."""
        step = self.train_step
        training = ckpt.is_training_checkpoint(checkpoint)
        if training:  # checked before any weight is loaded
            check_resumable(self, checkpoint, path)
        load_weights(step.net, checkpoint, path, self.cfg["model"]["name"])
        step.precision.load_weights(unwrap_state_dict(checkpoint))
        if not training:
            return False
        self.load_optimizer(checkpoint["optimizer"])
        self.notes += step.precision.load_state_dict(checkpoint.get("amp") or {})
        if step.ema is not None and checkpoint.get("ema"):
            step.ema.load_state_dict(checkpoint["ema"])
        own_lrs = self.scheduler.base_lrs  # derived.lr: this run's optim.lr at its global batch
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        self.scheduler.base_lrs = own_lrs
        self.epoch, self.epoch_step = checkpoint["epoch"], checkpoint["epoch_step"]
        # written before these were recorded: counted as the position, and an epoch's last step
        # not validated (a save after validation has begun the next epoch, or stopped short of it)
        self.global_step = checkpoint.get("global_step", self.epoch * self.steps_per_epoch + self.epoch_step)
        self.awaiting_validation = not checkpoint.get("validated", self.epoch_step < self.steps_per_epoch)
        self.best_top1 = float(checkpoint["best_prec1"])
        self.rng_start = rank_rng(checkpoint["rng"], self.rank) or training_seed(self.cfg["seed"], self.rank,
                                                                                   self.global_step)
        if self.epoch_step and self.cfg["train"]["resume_next_epoch"] and not self.awaiting_validation:
            self.epoch, self.epoch_step = self.epoch + 1, 0  # the rest of the epoch is skipped
        # the LR of this position in this run's steps (another global batch at an epoch's end has
        # other steps an epoch than the checkpoint's schedule counted)
        self.step_schedule(at=self.epoch * self.steps_per_epoch + self.epoch_step)
        return True

    def load_optimizer(self, saved):
        """``saved`` (an optimizer state dict) into the optimizer, whose settings stay this run's
        (torch's load_state_dict takes the checkpoint's: its momentum, weight decay, its foreach or
        fused flag, its LR; the LR is the schedule's). A note for each optim.* setting the checkpoint
        had another value of."""
        optimizer = self.train_step.optimizer
        own = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
        optimizer.load_state_dict(saved)
        named = {"weight_decay", *ALGORITHMS[self.cfg["optim"]["name"]].hyperparameters}
        notes = {}
        for group, settings in zip(optimizer.param_groups, own):
            for key, value in settings.items():
                if group.get(key) != value and key in named:
                    notes.setdefault(key, f"optim.{key}: the checkpoint's optimizer had {group.get(key)}, "
                                          f"this run's is {value} (config.yaml), which it trains with")
                group[key] = value
        if self.train_step.compiled:  # the LRs as tensors again
            hold_lr_in_tensors(optimizer)
        self.notes += [notes[key] for key in sorted(notes)]

    # The resume policy.
    def resume(self, chosen, *, evaluate_only=False, say=print, foreign=lambda path, checkpoint: None):
        """Loads the ``chosen`` (path, checkpoint) of choose_checkpoint ((None, None): none was
        found, a fresh start). ``foreign(path, checkpoint)``: for a checkpoint that gave weights
        only, a behaviour's notes if it took the rest (ModelZoo's position), else None. Sets
        ``resumed_at`` unless it gave only weights."""
        path, checkpoint = chosen
        if checkpoint is None:  # a restart before the first save, say: the first round's records go
            self.resumed_at = 0
            return
        taken = [] if self.load_state_dict(checkpoint, path) else None
        if taken is None and not evaluate_only:
            taken = foreign(path, checkpoint)
        if taken is not None:
            self.resumed_at = self.global_step
        say(f"resumed from {path} (epoch {self.epoch}, batch {self.epoch_step}; global step {self.global_step})")
        for note in (taken or []) + self.notes + changes_since(self, checkpoint):
            say(f"note: {note}")


def choose_checkpoint(cfg, resume, *, fallback=None, evaluate_only=False, say=print):
    """(path, checkpoint) to resume from ('auto': the one of the run directory that got furthest,
    else ``fallback``; (None, None): none, a fresh start, said). Rank 0 reads it and sends it to
    the others: every rank continues from the same state, and nodes without a shared file system
    need no copy of the run directory."""
    return from_rank0(lambda: ckpt.choose(resume, fallback, evaluate_only, cfg["output"], say))


def with_checkpoints_global_batch(cfg, checkpoint, path):
    """``cfg`` for resuming ``checkpoint``: where train.grad_accum_steps and data.global_batch are
    auto, its global batch (and so its LR) is kept on any number of processes, which accumulate
    as many forwards as fill it. One that this run's processes cannot fill stops a resume
    mid-epoch in one line; at an epoch's end the run goes on at its own (changes_since says so)."""
    global_batch = split_of((checkpoint or {}).get("config") or {})[3]
    auto = cfg["train"]["grad_accum_steps"] == "auto" and cfg["data"]["global_batch"] == "auto"
    if not (ckpt.is_training_checkpoint(checkpoint or {}) and auto and isinstance(global_batch, int)):
        return cfg
    if global_batch == cfg["derived"]["global_batch"]:
        return cfg
    per_step = cfg["derived"]["world_size"] * cfg["data"]["batch_size"]
    if global_batch % per_step == 0:
        return with_global_batch(cfg, global_batch)
    if checkpoint.get("epoch_step") and not skips_the_epochs_rest(cfg, checkpoint):
        processes = cfg["derived"]["world_size"]
        raise UsageError(f"{path}: stopped mid-epoch at global batch {global_batch}, which {processes} "
                         f"process(es) x data.batch_size {cfg['data']['batch_size']} cannot fill; give a "
                         f"data.batch_size that makes a divisor of it, or resume from a checkpoint written at an "
                         f"epoch's end")
    return cfg


def changes_since(state, checkpoint):
    """What a resume of ``checkpoint`` into ``state`` changes (global batch, LR, data order, the data),
    as notes."""
    notes = []
    was, now = split_of(checkpoint.get("config") or {}), split_of(state.cfg)
    if None not in was and was != now:
        same = was[3] == now[3]
        notes.append(f"the checkpoint trained with {was[0]} process(es) x data.batch_size {was[1]} x {was[2]} "
                     f"forward(s) = global batch {was[3]}, lr {was[4]:g}; this run has {now[0]} x {now[1]} x "
                     f"{now[2]} = {now[3]}, lr {now[4]:g}" + (", the same global batches" if same else
                                                               ", and so another data order"))
    if ckpt.is_training_checkpoint(checkpoint):
        unknown = sorted(str(key) for key in checkpoint if key not in ckpt.KEYS)
        if unknown:
            notes.append(f"the checkpoint's keys {', '.join(unknown[:8])} are not this app's; ignored")
    changed = data_changes(checkpoint.get("data"), state.data)
    if not checkpoint.get("data"):
        notes.append("the checkpoint records no description of its data (written before they were "
                     "recorded), so whether the data changed could not be checked")
    elif changed:
        notes.append(f"the data changed since the checkpoint: {changed}")
    if checkpoint.get("epoch_step") and state.cfg["train"]["resume_next_epoch"]:
        notes.append(f"train.resume_next_epoch: the rest of epoch {checkpoint['epoch']} (from batch "
                     f"{checkpoint['epoch_step']}) is skipped; training goes on at epoch {state.epoch}")
    return notes

def check_resumable(state, checkpoint, path):
    """The one place that says why a training checkpoint cannot continue in ``state``'s run."""
    weights_only = f"to start from its weights only, pass model.pretrained={path} instead of --resume"
    check_same_model(checkpoint, state.cfg["model"]["name"], path)
    malformed = ckpt.malformed_field(checkpoint)
    if malformed:
        key, expected = malformed
        raise UsageError(f"{path}: not a checkpoint this app can resume: its '{key}' is "
                         f"{str(checkpoint.get(key))[:40]!r} ({type(checkpoint.get(key)).__name__}), "
                         f"expected {expected}; {weights_only}")
    saved = ((checkpoint.get("config") or {}).get("optim") or {}).get("name")
    algorithm = state.cfg["optim"]["name"]
    if saved and saved != algorithm:
        raise UsageError(f"{path}: trained with optimizer {saved}, this run uses {algorithm} "
                         f"(optim.name); {weights_only}")
    was, now = split_of(checkpoint.get("config") or {})[3], state.cfg["derived"]["global_batch"]
    epoch, epoch_step = checkpoint["epoch"], checkpoint["epoch_step"]
    if epoch_step and was is not None and was != now and not skips_the_epochs_rest(state.cfg, checkpoint):
        raise UsageError(f"{path}: stopped mid-epoch (global step {epoch_step}) at global batch {was}; this run's is "
                         f"{now}, so the epoch would go on from another place; leave train.grad_accum_steps and "
                         f"data.global_batch at auto to keep the checkpoint's, or resume from a checkpoint written "
                         f"at an epoch's end")
    changed = data_changes(checkpoint.get("data"), state.data)
    if epoch_step and changed and "train:" in changed and not state.cfg["train"]["resume_next_epoch"]:
        raise UsageError(f"{path}: stopped mid-epoch (epoch {epoch}, batch {epoch_step}) on "
                         f"other data ({changed}), so that epoch cannot go on; restore the data, or go on "
                         f"from the start of epoch {epoch + 1} with train.resume_next_epoch=true")
    groups = [len(group["params"]) for group in checkpoint["optimizer"].get("param_groups", [])]
    own = [len(group["params"]) for group in state.train_step.optimizer.param_groups]
    if groups != own:
        raise UsageError(f"{path}: its optimizer has parameter groups of {groups} tensors, this "
                         f"run's of {own} (optim.no_decay_bn_bias differs?); {weights_only}")


def skips_the_epochs_rest(cfg, checkpoint):
    """Whether a resume of ``checkpoint``, stopped mid-epoch, goes on at the next epoch's start
    (train.resume_next_epoch; not a checkpoint of an epoch's last step, whose validation is due)."""
    return cfg["train"]["resume_next_epoch"] and checkpoint.get("validated", True)


def split_of(cfg):
    """(processes, data.batch_size, forwards a step, global batch, lr) of a resolved config (or of
    a checkpoint's: None where it does not say)."""
    derived, data = cfg.get("derived") or {}, cfg.get("data") or {}
    return (derived.get("world_size"), data.get("batch_size"), derived.get("grad_accum_steps", 1),
            derived.get("global_batch"), derived.get("lr"))


def training_seed(seed, rank, global_step):
    """The seed of ``rank``'s random generators for training from ``global_step`` where no state of
    them was saved: a stream of its own per (seed, rank, step), apart from the initial weights'."""
    return int.from_bytes(hashlib.sha256(f"train {seed} {rank} {global_step}".encode()).digest()[:8], "little")


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
