"""The run's training state: the step, its position, its LR schedule and its checkpoint (whether a
checkpoint may be resumed, and how, is mobilenet/resume.py's)."""
import hashlib
import re
import warnings

import torch

from mobilenet.device import device_module
from mobilenet.distributed import every_rank
from mobilenet.model import load_weights, unwrap_state_dict
from mobilenet.optim import ALGORITHMS, SCHEDULES, hold_lr_in_tensors, plain_numbers
from mobilenet.training import build_train_step


class TrainingState:
    """The TrainStep (``step``), the LR schedule and the position: ``epoch`` (epochs completed),
    ``epoch_step`` (steps done in the one under way), ``global_step`` (steps trained: counted, so
    a skipped epoch renumbers nothing), ``awaiting_validation``, ``resumed_at`` (None: a fresh run).
    ``records``: the config and data records a checkpoint holds."""

    def __init__(self, cfg, device, steps_per_epoch, *, rank=0, records=None):
        self.cfg, self.device, self.steps_per_epoch, self.rank = cfg, device, steps_per_epoch, rank
        self.step = build_train_step(cfg, device)
        self.scheduler = build_scheduler(self.step.optimizer, schedule=cfg["schedule"], base_lr=cfg["derived"]["lr"],
                                         steps_per_epoch=steps_per_epoch, epochs=cfg["train"]["epochs"])
        self.epoch, self.epoch_step, self.global_step, self.best_top1 = 0, 0, 0, 0.0
        self.awaiting_validation = False
        self.resumed_at = None
        # this rank's random generators at the first step (dropout's draws): seeded, or a checkpoint's
        self.rng_start = training_seed(cfg["seed"], rank, 0)
        self.records = records or {"config": None, "data": None}

    def start_random_states(self):
        """This rank's random generators as the position says, whatever drew from them before."""
        if isinstance(self.rng_start, int):
            torch.manual_seed(self.rng_start)
        else:
            set_rng_states(self.rng_start, self.device)

    def train_on(self, batches, after_each=lambda: None):
        """One optimizer step over ``batches`` and the schedule's; returns the loss (on the device)."""
        loss = self.step.accumulated(batches, after_each, epoch=self.epoch, step=self.epoch_step,
                                     first_rank=self.rank * len(batches),
                                     ema_due=self.epoch_step % self.cfg["train"]["ema_steps"] == 0)
        self.step_schedule()
        self.epoch_step += 1
        self.global_step += 1
        self.awaiting_validation = self.epoch_step == self.steps_per_epoch or self.finished
        return loss

    def step_schedule(self):
        """The LR schedule's step (the first through schedule_at: a skipped first step is no mistake)."""
        if self.global_step:
            self.scheduler.step()
        else:
            schedule_at(self.scheduler, 1)

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

    def validated(self, top1, scored):
        """After validation: the best top-1 kept, the next epoch begun if this one is whole; a new best?"""
        self.awaiting_validation = False
        if self.epoch_step == self.steps_per_epoch:
            self.epoch, self.epoch_step = self.epoch + 1, 0
        is_best = scored > 0 and top1 > self.best_top1
        self.best_top1 = max(self.best_top1, top1)
        return is_best

    def move_to(self, epoch, epoch_step=0):
        """The position, and the schedule's LR of its step in this run's steps an epoch."""
        self.epoch, self.epoch_step = epoch, epoch_step
        schedule_at(self.scheduler, epoch * self.steps_per_epoch + epoch_step)

    def continue_at(self, epoch, best_top1):
        """From the start of ``epoch`` (a checkpoint without our position), generators seeded for it."""
        self.move_to(epoch)
        self.best_top1, self.global_step = best_top1, epoch * self.steps_per_epoch
        self.rng_start = training_seed(self.cfg["seed"], self.rank, self.global_step)

    def state_dict(self, every_rank_rng=True):
        """The checkpoint (checkpoint.KEYS); ``rng``: every rank's generators (a collective)."""
        step = self.step
        rng = every_rank(rng_states(self.device)) if every_rank_rng else [rng_states(self.device)]
        return {"arch": self.cfg["model"]["name"], "epoch": self.epoch, "epoch_step": self.epoch_step,
                "global_step": self.global_step, "validated": not self.awaiting_validation,
                "best_prec1": self.best_top1, "rng": rng,
                "state_dict": step.precision.weights(step.net),  # the fp32 masters under O2
                "optimizer": plain_numbers(step.optimizer.state_dict()),
                "scheduler": plain_numbers(self.scheduler.state_dict()),
                "amp": step.precision.state_dict(),
                "ema": step.ema.state_dict() if step.ema is not None else None, **self.records}

    def load_weights(self, checkpoint, path="checkpoint"):
        """The weights of ``checkpoint`` (ours, ModelZoo's, a weights file), O2's masters too."""
        load_weights(self.step.net, checkpoint, path, self.cfg["model"]["name"])
        self.step.precision.load_weights(unwrap_state_dict(checkpoint))

    def load_state_dict(self, checkpoint):
        """All but the weights of a checkpoint; returns notes where this run's settings differ."""
        step = self.step
        notes = self.load_optimizer(checkpoint["optimizer"])
        notes += step.precision.load_state_dict(checkpoint.get("amp") or {})
        if step.ema is not None and checkpoint.get("ema"):
            step.ema.load_state_dict(checkpoint["ema"])
        own_lrs = self.scheduler.base_lrs  # derived.lr: this run's optim.lr at its global batch
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        self.scheduler.base_lrs = own_lrs
        # written before these were recorded: counted as the position, and an epoch's last step
        # not validated (a save after validation has begun the next epoch, or stopped short of it)
        epoch, epoch_step = checkpoint["epoch"], checkpoint["epoch_step"]
        self.global_step = checkpoint.get("global_step", epoch * self.steps_per_epoch + epoch_step)
        self.awaiting_validation = not checkpoint.get("validated", epoch_step < self.steps_per_epoch)
        self.best_top1 = float(checkpoint["best_prec1"])
        self.rng_start = rank_rng(checkpoint["rng"], self.rank) or training_seed(self.cfg["seed"], self.rank,
                                                                                   self.global_step)
        self.move_to(epoch, epoch_step)
        return notes

    def load_optimizer(self, saved):
        """An optimizer state dict, the settings staying this run's (torch's load takes the saved
        ones); a note for each optim.* setting the checkpoint had another value of."""
        optimizer = self.step.optimizer
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
        if self.step.compiled:  # the LRs as tensors again
            hold_lr_in_tensors(optimizer)
        return [notes[key] for key in sorted(notes)]


def training_seed(seed, rank, global_step):
    """A seed of its own per (seed, rank, step), where no generator state was saved."""
    return int.from_bytes(hashlib.sha256(f"train {seed} {rank} {global_step}".encode()).digest()[:8], "little")


def rank_rng(saved, rank):
    """``rank``'s states among a checkpoint's (older ones hold rank 0's alone), or None."""
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


def lr_factor_fn(schedule, steps_per_epoch, epochs, base_lr):
    """The base LR's multiplier at each step: the warm-up, then the schedule's row (under per_epoch,
    each epoch's first step's). step counts from the run's start (the references: from the
    warm-up's end), cosine from the warm-up's end."""
    warmup, start = round(schedule["warmup_epochs"] * steps_per_epoch), schedule["warmup_start_factor"]
    row, s = SCHEDULES[schedule["name"]], {**schedule, "min_lr": schedule["min_lr"] / base_lr}
    total = epochs * steps_per_epoch

    def factor(step):
        if schedule["per_epoch"]:
            step -= step % steps_per_epoch
        if step < warmup:
            return start if schedule["warmup_method"] == "constant" else start + (1 - start) * step / warmup
        after = step if schedule["name"] == "step" else step - warmup
        return row.factor(after, steps_per_epoch, total - warmup, s)
    return factor


def build_scheduler(optimizer, *, schedule, base_lr, steps_per_epoch, epochs):
    """Per-iteration LambdaLR from the ``schedule`` config section."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor_fn(schedule, steps_per_epoch, epochs, base_lr))


def schedule_at(scheduler, at):
    """``scheduler`` moved to the LR of step ``at`` (a resume): a row's closed form needs nothing else."""
    scheduler.last_epoch = at - 1
    with warnings.catch_warnings():
        # A resume's repositioning makes no optimizer.step(), on purpose; torch warns about that order.
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()`"))
        scheduler.step()
