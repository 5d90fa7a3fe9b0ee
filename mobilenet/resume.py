"""The resume policy, all of it: what a run resumes from, whether it can go on here, and how.
engine.run calls ``prepare`` before the run is built (the checkpoint rank 0 chooses, and the config
at its global batch) and ``restore`` after (the checks, the state loaded, what changed, said)."""
from pathlib import Path
from typing import NamedTuple

import torch

from mobilenet import checkpoint as ckpt
from mobilenet.config import with_global_batch
from mobilenet.distributed import from_rank0
from mobilenet.errors import UsageError
from mobilenet.model import check_same_model


class Split(NamedTuple):
    """How a resolved config (or a checkpoint's: None where it does not say) fills a global batch."""
    processes: int | None
    batch_size: int | None
    forwards: int | None   # train.grad_accum_steps, resolved
    global_batch: int | None
    lr: float | None


def split_of(cfg):
    derived, data = cfg.get("derived") or {}, cfg.get("data") or {}
    return Split(derived.get("world_size"), data.get("batch_size"), derived.get("grad_accum_steps", 1),
                 derived.get("global_batch"), derived.get("lr"))


def prepare(cfg, resume, log, *, fallback=None, evaluate_only=False):
    """(cfg, (path, checkpoint)) for ``resume`` (a file, or 'auto': the one in ``log``'s run directory
    that got furthest, else ``fallback``; (None, None): a fresh start). Rank 0 reads it and sends it to
    every rank."""
    path, checkpoint = from_rank0(lambda: choose(resume, fallback, evaluate_only, log.run_dir, log.info))
    if not evaluate_only:
        cfg = with_checkpoints_global_batch(cfg, checkpoint, path)
    return cfg, (path, checkpoint)


def choose(resume, fallback, evaluate_only, output, say):
    if resume != "auto":
        checkpoint = ckpt.load_checkpoint(resume)
        if not evaluate_only:
            refuse_going_back(resume, checkpoint, output)
        return str(resume), checkpoint
    found = load_latest(output, say)
    if found is not None:
        return str(found[0]), found[1]
    if fallback:
        return str(fallback), ckpt.load_checkpoint(fallback)
    if evaluate_only:  # random weights are nothing to evaluate
        raise UsageError(f"--evaluate --resume auto: no checkpoint in {output}/checkpoints; "
                         f"pass --output of a run that has one, or --resume FILE")
    say(f"--resume auto: no checkpoint in {output}, starting fresh")
    return None, None


def load_latest(run_dir, say):
    """(path, checkpoint) of the training checkpoint in ``run_dir``/checkpoints that got furthest by
    its recorded position (last.pt wins a tie), the others skipped said; None when there are none; a
    UsageError when none of the files can continue (a fresh start would train over them)."""
    folder = Path(run_dir) / "checkpoints"
    paths = sorted(folder.glob("*.pt"))
    found, reasons = [], []
    for path in paths:
        try:
            state = ckpt.load_checkpoint(path)
        except UsageError as e:
            reasons.append(str(e))
            say(f"--resume auto: skipping {e}")
            continue
        if not ckpt.is_training_checkpoint(state):
            reasons.append(f"{path}: weights only, no training state")
            say(f"--resume auto: skipping {path}: weights only, no training state")
            continue
        found.append(((state["epoch"], state["epoch_step"], path.name == "last.pt"), path, state))
    if found:
        _, path, state = max(found, key=lambda item: item[0])
        return path, state
    if paths:
        raise UsageError(f"--resume auto: no valid checkpoint in {folder} ({'; '.join(reasons)[:300]}); "
                         f"move them away to start fresh, or pass --resume FILE")
    return None


def refuse_going_back(resume, checkpoint, output):
    """Refused: a resume that would save an earlier position over the run directory's later one."""
    if not ckpt.is_training_checkpoint(checkpoint):
        return
    try:
        later = load_latest(output, lambda line: None)
    except UsageError:  # nothing there can continue a run: nothing to lose
        return
    at = (checkpoint["epoch"], checkpoint["epoch_step"])
    if later and (later[1]["epoch"], later[1]["epoch_step"]) > at:
        raise UsageError(f"--resume {resume} is at epoch {at[0]} batch {at[1]}, but {later[0]} is further "
                         f"(epoch {later[1]['epoch']} batch {later[1]['epoch_step']}) and this run would save "
                         f"over it; to branch from {resume}, pass another --output")


def with_checkpoints_global_batch(cfg, checkpoint, path):
    """``cfg`` at ``checkpoint``'s global batch, where both batch settings are auto and this run's
    processes fill it; one they cannot fill stops a resume mid-epoch, else the run's own is kept."""
    global_batch = split_of((checkpoint or {}).get("config") or {}).global_batch
    auto = cfg["train"]["grad_accum_steps"] == "auto" and cfg["data"]["global_batch"] == "auto"
    if not (ckpt.is_training_checkpoint(checkpoint or {}) and auto and isinstance(global_batch, int)):
        return cfg
    if global_batch == cfg["derived"]["global_batch"]:
        return cfg
    per_step = cfg["derived"]["world_size"] * cfg["data"]["batch_size"]
    if global_batch % per_step == 0:
        return with_global_batch(cfg, global_batch)
    if checkpoint.get("epoch_step") and not skips_the_epochs_rest(cfg, checkpoint):
        raise UsageError(f"{path}: stopped mid-epoch at global batch {global_batch}, which "
                         f"{cfg['derived']['world_size']} process(es) x data.batch_size {cfg['data']['batch_size']} "
                         f"cannot fill; give a data.batch_size that makes a divisor of it, go on from the next "
                         f"epoch's start with train.resume_next_epoch=true, or resume from a checkpoint written at "
                         f"an epoch's end")
    return cfg


def restore(r, chosen, *, evaluate_only=False):
    """Loads ``prepare``'s (path, checkpoint) into ``r`` once it can continue; says what changed."""
    state, (path, checkpoint) = r.state, chosen
    if checkpoint is None:  # a restart before the first save, say: the first round's records go
        state.resumed_at = 0
        return
    notes = None
    if ckpt.is_training_checkpoint(checkpoint):
        check_resumable(state, checkpoint, path)  # before any weight is loaded
        state.load_weights(checkpoint, path)
        notes = state.load_state_dict(checkpoint)
        if state.epoch_step and r.cfg["train"]["resume_next_epoch"] and not state.awaiting_validation:
            state.move_to(state.epoch + 1)  # the rest of the epoch is skipped
    else:
        state.load_weights(checkpoint, path)
        if not evaluate_only:
            notes = continue_modelzoo(r, path, checkpoint)
    if notes is not None:
        state.resumed_at = state.global_step
    r.log.info(f"resumed from {path} (epoch {state.epoch}, batch {state.epoch_step}; "
               f"global step {state.global_step})")
    for note in (notes or []) + changes_since(state, checkpoint):
        r.log.info(f"note: {note}")


def check_resumable(state, checkpoint, path):
    """The one place that says why a training checkpoint cannot continue in ``state``'s run."""
    cfg, weights_only = state.cfg, f"to start from its weights only, pass model.pretrained={path} instead of --resume"
    check_same_model(checkpoint, cfg["model"]["name"], path)
    malformed = ckpt.malformed_field(checkpoint)
    if malformed:
        key, expected = malformed
        raise UsageError(f"{path}: not a checkpoint this app can resume: its '{key}' is "
                         f"{str(checkpoint.get(key))[:40]!r} ({type(checkpoint.get(key)).__name__}), "
                         f"expected {expected}; {weights_only}")
    saved = ((checkpoint.get("config") or {}).get("optim") or {}).get("name")
    if saved and saved != cfg["optim"]["name"]:
        raise UsageError(f"{path}: trained with optimizer {saved}, this run uses {cfg['optim']['name']} "
                         f"(optim.name); {weights_only}")
    was, now = split_of(checkpoint.get("config") or {}).global_batch, cfg["derived"]["global_batch"]
    epoch, epoch_step = checkpoint["epoch"], checkpoint["epoch_step"]
    if epoch_step and was is not None and was != now and not skips_the_epochs_rest(cfg, checkpoint):
        raise UsageError(f"{path}: stopped mid-epoch (epoch {epoch}, batch {epoch_step}) at global batch {was}; "
                         f"this run's is {now}, so the epoch would go on from another place; go on from the next "
                         f"epoch's start with train.resume_next_epoch=true, leave train.grad_accum_steps and "
                         f"data.global_batch at auto to keep the checkpoint's, or resume from a checkpoint written "
                         f"at an epoch's end")
    reps = ((checkpoint.get("config") or {}).get("augment") or {}).get("ra_reps", 1)
    if epoch_step and reps != cfg["augment"]["ra_reps"] and not skips_the_epochs_rest(cfg, checkpoint):
        raise UsageError(f"{path}: stopped mid-epoch (epoch {epoch}, batch {epoch_step}) with augment.ra_reps={reps}; "
                         f"this run's {cfg['augment']['ra_reps']} deals the epoch in another order; keep "
                         f"augment.ra_reps={reps}, or go on from the next epoch's start with "
                         f"train.resume_next_epoch=true")
    changed = data_changes(checkpoint.get("data"), state.records["data"])
    if epoch_step and changed and "train:" in changed and not cfg["train"]["resume_next_epoch"]:
        raise UsageError(f"{path}: stopped mid-epoch (epoch {epoch}, batch {epoch_step}) on "
                         f"other data ({changed}), so that epoch cannot go on; restore the data, or go on "
                         f"from the start of epoch {epoch + 1} with train.resume_next_epoch=true")
    groups = [len(group["params"]) for group in checkpoint["optimizer"].get("param_groups", [])]
    own = [len(group["params"]) for group in state.step.optimizer.param_groups]
    if groups != own:
        raise UsageError(f"{path}: its optimizer has parameter groups of {groups} tensors, this "
                         f"run's of {own} (optim.norm_weight_decay or bias_weight_decay differ?); {weights_only}")


def skips_the_epochs_rest(cfg, checkpoint):
    """Whether a mid-epoch ``checkpoint`` goes on at the next epoch (not when its validation is due)."""
    return cfg["train"]["resume_next_epoch"] and checkpoint.get("validated", True)


def changes_since(state, checkpoint):
    """What a resume of ``checkpoint`` changes (global batch, LR, data order, the data), as notes."""
    notes = []
    was, now = split_of(checkpoint.get("config") or {}), split_of(state.cfg)
    if None not in was and was != now:
        order = ", the same global batches" if was.global_batch == now.global_batch else ", and so another data order"
        notes.append(f"the checkpoint trained with {was.processes} process(es) x data.batch_size {was.batch_size} x "
                     f"{was.forwards} forward(s) = global batch {was.global_batch}, lr {was.lr:g}; this run has "
                     f"{now.processes} x {now.batch_size} x {now.forwards} = {now.global_batch}, lr {now.lr:g}{order}")
    if ckpt.is_training_checkpoint(checkpoint):
        unknown = sorted(str(key) for key in checkpoint if key not in ckpt.KEYS)
        if unknown:
            notes.append(f"the checkpoint's keys {', '.join(unknown[:8])} are not this app's; ignored")
    changed = data_changes(checkpoint.get("data"), state.records["data"])
    if not checkpoint.get("data"):
        notes.append("the checkpoint records no description of its data (written before they were "
                     "recorded), so whether the data changed could not be checked")
    elif changed:
        notes.append(f"the data changed since the checkpoint: {changed}")
    if checkpoint.get("epoch_step") and state.cfg["train"]["resume_next_epoch"]:
        notes.append(f"train.resume_next_epoch: the rest of epoch {checkpoint['epoch']} (from batch "
                     f"{checkpoint['epoch_step']}) is skipped; training goes on at epoch {state.epoch}")
    return notes


# A checkpoint of ModelZoo's main.py (no scheduler: loaded as weights): the run goes on at its epoch
# with its best top-1 and SGD's momentum where they fit, and says what it could not take.

def continue_modelzoo(r, path, checkpoint):
    """The notes of going on from ModelZoo's ``checkpoint``, or None when it is not one."""
    if not {"epoch", "state_dict", "best_prec1"} <= checkpoint.keys():
        return None
    state, notes = r.state, []
    if not (ckpt.whole(checkpoint.get("epoch")) and isinstance(checkpoint.get("best_prec1"), (int, float))):
        left = ["its position and best top-1 (epoch and best_prec1 are not numbers)"]
    else:
        state.continue_at(checkpoint["epoch"], float(checkpoint["best_prec1"]))
        left = ["the loss scaler's and the random generators' states (ModelZoo's checkpoints hold neither)"]
        misfit = optimizer_misfit(checkpoint.get("optimizer"), state.step.optimizer, r.cfg["optim"]["name"])
        if misfit:
            left.insert(0, f"its optimizer state ({misfit})")
        else:  # the LR stays the schedule's, for that epoch
            notes = state.load_optimizer(checkpoint["optimizer"])
    return [f"{path} is a checkpoint of ModelZoo's main.py: its weights, epoch and best top-1 "
            f"{state.best_top1:.3f} are taken, not {' nor '.join(left)}", *notes]


def optimizer_misfit(saved, optimizer, algorithm):
    """Why ModelZoo's SGD momentum buffers ``saved`` cannot go into ``optimizer``, or '' when they fit."""
    if not (isinstance(saved, dict) and isinstance(saved.get("state"), dict) and saved.get("param_groups")):
        return "it holds none"
    if algorithm != "sgd":
        return f"SGD's momentum, and this run's optimizer is {algorithm}"
    own = optimizer.param_groups
    if [len(group.get("params", ())) for group in saved["param_groups"]] != [len(group["params"]) for group in own]:
        return "its parameter groups differ from this run's"
    params = [p for group in own for p in group["params"]]
    for index, saved_state in saved["state"].items():
        buffer = saved_state.get("momentum_buffer") if isinstance(saved_state, dict) else None
        if not (isinstance(index, int) and 0 <= index < len(params) and set(saved_state) == {"momentum_buffer"}
                and isinstance(buffer, torch.Tensor) and buffer.shape == params[index].shape):
            return f"its state of tensor {index} is not a momentum buffer of that tensor's shape"
    return ""


def data_changes(was, now, then="then", here="now"):
    """'train: 1437 images then, 718 now' for the splits two data records differ in, or ''."""
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
