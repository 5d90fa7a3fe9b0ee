"""TrainingState: what trains, wired once from a resolved config (the step, its LR schedule, the
input path to the device), and every piece of state a resume needs, saved and restored as one dict.

The engine and every benchmark build their training through ``TrainingState``, so a change to
the schedule, the input dtype or the layout is made here once.
"""
import re
import warnings

import torch

from mobilenet.config import thaw
from mobilenet.data.prefetch import DevicePrefetcher
from mobilenet.device import device_module
from mobilenet.errors import UsageError
from mobilenet.model import load_weights, unwrap_state_dict
from mobilenet.optim import build_scheduler, hold_lr_in_tensors, plain_numbers
from mobilenet.step import build_train_step

# A step the loss scaler skips (an overflow) advances the schedule without optimizer.step(), on
# purpose: the LR follows the step count. torch warns about that order once; it is not a mistake here.
warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()` before"))


class TrainingState:
    """Owns the TrainStep (model, optimizer, precision, EMA), the per-iteration LR schedule over
    ``steps_per_epoch`` steps an epoch, and the run's position (``epoch``: epochs completed,
    ``step``: batches done in the epoch under way) and best top-1. ``state_dict()`` is the
    checkpoint (Ascend ModelZoo's keys epoch, arch, state_dict, best_prec1, optimizer, plus ours);
    ``load_state_dict()`` restores it, or only the weights of a file that is no training checkpoint."""

    def __init__(self, cfg, device, steps_per_epoch):
        self.cfg, self.device, self.steps_per_epoch = cfg, device, steps_per_epoch
        self.train_step = build_train_step(cfg, device)
        self.scheduler = build_scheduler(self.train_step.optimizer, schedule=cfg["schedule"],
                                         base_lr=cfg["derived"]["lr"], steps_per_epoch=steps_per_epoch,
                                         epochs=cfg["train"]["epochs"])
        self.epoch, self.step, self.best_top1 = 0, 0, 0.0
        self.data = None  # {"train": data_record, "val": ...}: what the run trains on (set by its builder)

    def batches(self, loader):
        """``loader``'s uint8 batches on the device, normalised, in the layout and dtype the step takes."""
        return DevicePrefetcher(loader, self.device, self.cfg["derived"]["channels_last"],
                                self.train_step.precision.input_dtype)

    def train_on(self, images, labels):
        """One training step and the schedule's; returns the loss (on the device)."""
        loss = self.train_step(images, labels)
        self.scheduler.step()
        self.step += 1
        return loss

    def weights_finite(self):
        """Whether every weight is finite (one device read: for saves between loss checks)."""
        params = list(self.train_step.optimizer_params())
        return bool(torch.stack([p.detach().isfinite().all() for p in params]).all())

    def state_dict(self):
        step = self.train_step
        return {"arch": "mobilenet_v1", "epoch": self.epoch, "step": self.step,
                "best_prec1": self.best_top1, "rng": rng_states(self.device),
                "state_dict": step.precision.weights(step.net),  # the fp32 masters under O2
                "optimizer": plain_numbers(step.optimizer.state_dict()),
                "scheduler": plain_numbers(self.scheduler.state_dict()),
                "amp": step.precision.state_dict(),
                "ema": step.ema.state_dict() if step.ema is not None else None,
                "data": self.data, "config": thaw(self.cfg)}

    def load_state_dict(self, state, source="checkpoint"):
        """The weights of ``state`` (ours or ModelZoo's); all the rest too when it is a training
        checkpoint, which this run must be able to continue (a UsageError says what differs).
        Returns whether it was a training checkpoint."""
        step = self.train_step
        load_weights(step.net, state, source)
        step.precision.load_weights(unwrap_state_dict(state))
        if not is_training_checkpoint(state):
            return False
        self.check_resumable(state, source)
        step.optimizer.load_state_dict(state["optimizer"])
        if step.compiled:  # load_state_dict put the saved float LRs where the tensors were
            hold_lr_in_tensors(step.optimizer)
        step.precision.load_state_dict(state.get("amp") or {})
        if step.ema is not None and state.get("ema"):
            step.ema.load_state_dict(state["ema"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch, self.step, self.best_top1 = state["epoch"], state["step"], float(state["best_prec1"])
        set_rng_states(state["rng"], self.device)
        if self.step and self.cfg["train"]["resume_next_epoch"]:  # the rest of the epoch is skipped
            self.epoch, self.step = self.epoch + 1, 0
            self.scheduler.last_epoch = self.epoch * self.steps_per_epoch - 1
            self.scheduler.step()  # the LR of the next epoch's first step
        return True

    def changes_since(self, state):
        """What a resume of ``state`` changes (global batch, LR, data order, the data), as notes."""
        notes = []
        derived = (state.get("config") or {}).get("derived") or {}
        was = (derived.get("world_size"), derived.get("global_batch"), derived.get("lr"))
        now = tuple(self.cfg["derived"][key] for key in ("world_size", "global_batch", "lr"))
        if None not in was and was != now:
            notes.append(f"the checkpoint trained with {was[0]} process(es), global batch {was[1]}, lr {was[2]:g}; "
                         f"this run has {now[0]}, {now[1]}, lr {now[2]:g}, and so another data order")
        unknown = sorted(str(key) for key in state if key not in KNOWN_KEYS)
        if unknown:
            notes.append(f"the checkpoint's keys {', '.join(unknown[:8])} are not this app's; ignored")
        if not state.get("data"):
            notes.append("the checkpoint records no description of its data (written before they were "
                         "recorded), so whether the data changed could not be checked")
        elif data_changes(state["data"], self.data):
            notes.append(f"the data changed since the checkpoint: {data_changes(state['data'], self.data)}")
        if state["step"] and self.cfg["train"]["resume_next_epoch"]:
            notes.append(f"train.resume_next_epoch: the rest of epoch {state['epoch']} (from step {state['step']}) "
                         f"is skipped; training goes on at epoch {self.epoch}")
        return notes

    def check_resumable(self, state, source):
        """The one place that says why a training checkpoint cannot continue in this run."""
        weights_only = f"to start from its weights only, pass model.pretrained={source} instead of --resume"
        for key, expected, fits in FIELDS:
            if not fits(state.get(key)):
                raise UsageError(f"{source}: not a checkpoint this app can resume: its '{key}' is "
                                 f"{str(state.get(key))[:40]!r} ({type(state.get(key)).__name__}), expected "
                                 f"{expected}; {weights_only}")
        saved = ((state.get("config") or {}).get("optim") or {}).get("name")
        algorithm = self.cfg["optim"]["name"]
        if saved and saved != algorithm:
            raise UsageError(f"{source}: trained with optimizer {saved}, this run uses {algorithm} "
                             f"(optim.name); {weights_only}")
        saved = state.get("config") or {}
        was = ((saved.get("derived") or {}).get("world_size"), (saved.get("data") or {}).get("batch_size"))
        now = (self.cfg["derived"]["world_size"], self.cfg["data"]["batch_size"])
        if state["step"] and None not in was and was != now:
            raise UsageError(f"{source}: stopped mid-epoch (step {state['step']}) with {was[0]} process(es) x "
                             f"data.batch_size {was[1]}; this run has {now[0]} x {now[1]}, so the epoch would "
                             f"go on from another place; resume with {was[0]} x {was[1]}, or from a checkpoint "
                             f"written at an epoch's end")
        changed = data_changes(state.get("data"), self.data)
        if state["step"] and changed and "train:" in changed and not self.cfg["train"]["resume_next_epoch"]:
            raise UsageError(f"{source}: stopped mid-epoch (epoch {state['epoch']}, step {state['step']}) on "
                             f"other data ({changed}), so that epoch cannot go on; restore the data, or go on "
                             f"from the start of epoch {state['epoch'] + 1} with train.resume_next_epoch=true")
        groups = [len(group["params"]) for group in state["optimizer"].get("param_groups", [])]
        own = [len(group["params"]) for group in self.train_step.optimizer.param_groups]
        if groups != own:
            raise UsageError(f"{source}: its optimizer has parameter groups of {groups} tensors, this "
                             f"run's of {own} (optim.no_decay_bn_bias differs?); {weights_only}")


def whole(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# The fields of a training checkpoint that a resume reads, what each must be, and the test.
FIELDS = [("epoch", "a whole number", whole), ("step", "a whole number", whole),
          ("best_prec1", "a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
          ("optimizer", "an optimizer state dict", lambda v: isinstance(v, dict) and "param_groups" in v),
          ("scheduler", "a scheduler state dict", lambda v: isinstance(v, dict)),
          ("rng", "the random generators' states", lambda v: isinstance(v, dict) and "torch" in v)]
KNOWN_KEYS = {"arch", "epoch", "step", "best_prec1", "rng", "state_dict", "optimizer", "scheduler", "amp",
              "ema", "data", "config"}


def data_changes(was, now):
    """'train: 1437 images then, 718 now; val: the same count, other files' for the splits that
    differ between two data descriptions, or '' (also when one is missing)."""
    if not was or not now:
        return ""
    changes = []
    for split in ("train", "val"):
        before, after = was.get(split) or {}, now[split]
        if before != after:
            counts = (f"the same {after['images']} images, other files or labels"
                      if before.get("images") == after["images"]
                      else f"{before.get('images')} images then, {after['images']} now")
            changes.append(f"{split}: {counts}")
    return "; ".join(changes)


def is_training_checkpoint(state):
    """Whether a checkpoint dict can continue a run (ours), not only give weights (ModelZoo's own
    and weights files have no scheduler)."""
    return bool(state.get("optimizer")) and bool(state.get("scheduler"))


def rng_states(device):
    states = {"torch": torch.get_rng_state()}
    module = device_module(device)
    if module is not None:
        states["device"] = module.get_rng_state()
    return states


def set_rng_states(states, device):
    torch.set_rng_state(states["torch"])
    if "device" in states and device_module(device) is not None:
        device_module(device).set_rng_state(states["device"])
