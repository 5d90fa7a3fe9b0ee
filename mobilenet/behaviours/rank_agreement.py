"""Every rank holds what rank 0 saves: at each epoch's end, before the save, checksums of the
checkpoint (less the random states and records) and of the network (O2's half weights) compared in
one all_gather; a difference stops the run in one line naming it and the ranks."""
import torch

from mobilenet.distributed import first_disagreement
from mobilenet.errors import TrainingFailure

PER_RANK_KEYS = {"rng", "data", "config"}  # of checkpoint.KEYS


class RankAgreement:
    def at_epoch_end(self, r, results):
        if r.world.size > 1:
            check_ranks_agree(r.state)

    def shared_state(self, state):  # what it compares (scripts/benchmarks/ranks.py times its checksums)
        return shared_state(state)


def check_ranks_agree(state):
    """A TrainingFailure naming the first tensor of shared_state(state) that differs between the ranks."""
    found = first_disagreement(shared_state(state), state.device)
    if found:
        name, ranks = found
        raise TrainingFailure(f"the ranks disagree at the end of epoch {state.epoch}: {name} differs on "
                              f"rank(s) {', '.join(map(str, ranks))} from rank 0 (a rank's memory, "
                              f"kernel or code went its own way); stopped before saving, the "
                              f"checkpoints written before stay valid")


def shared_state(state):
    """[(name, tensor or number)] of what must be equal on every rank."""
    checkpoint = {k: v for k, v in state.state_dict(every_rank_rng=False).items() if k not in PER_RANK_KEYS}
    items = list(flat_items(checkpoint))
    seen = {where(value) for _, value in items if isinstance(value, torch.Tensor)}
    # the network's tensors that the checkpoint does not hold already (O2's half weights)
    return items + [(f"network.{name}", value) for name, value in state.step.net.state_dict().items()
                    if where(value) not in seen]


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
