"""--resume of a checkpoint of ModelZoo's main.py (epoch, arch, state_dict, best_prec1, optimizer;
no scheduler, so the core takes its weights only): the run goes on at its epoch (the next to train)
with its best top-1 and SGD's momentum buffers where they fit this run's optimizer, and says what it
could not take. ModelZoo's and pytorch/examples' flags are mobilenet/dialects.py's."""
import torch

from mobilenet.behaviours.base import Behaviour
from mobilenet.checkpoint import is_training_checkpoint, whole


class ModelZooContinuation(Behaviour):
    def at_resume(self, r, path, checkpoint):
        if is_training_checkpoint(checkpoint) or not {"epoch", "state_dict", "best_prec1"} <= checkpoint.keys():
            return None
        left = continue_from(r, checkpoint)
        return [f"{path} is a checkpoint of ModelZoo's main.py: its weights, epoch and best top-1 "
                f"{r.state.best_top1:.3f} are taken, not {' nor '.join(left)}"]


def continue_from(r, checkpoint):
    """Goes on from ModelZoo's ``checkpoint`` (its weights are loaded); returns what it could not take."""
    state = r.state
    if not (whole(checkpoint.get("epoch")) and isinstance(checkpoint.get("best_prec1"), (int, float))):
        return ["its position and best top-1 (epoch and best_prec1 are not numbers)"]
    state.continue_at(checkpoint["epoch"], float(checkpoint["best_prec1"]))
    left = ["the loss scaler's and the random generators' states (ModelZoo's checkpoints hold neither)"]
    misfit = optimizer_misfit(checkpoint.get("optimizer"), state.train_step.optimizer, r.cfg["optim"]["name"])
    if misfit:
        return [f"its optimizer state ({misfit})", *left]
    state.load_optimizer(checkpoint["optimizer"])  # the LR stays the schedule's, for that epoch
    return left


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
