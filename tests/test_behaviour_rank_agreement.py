"""The rank check (mobilenet/behaviours/rank_agreement.py): one fault in any part of what one rank
holds is found and named; a rank that goes its own way stops the run before the save. The ranks
train in test_ranks.py's job (tests/rank_states.py), which enters the check through the run's
epoch-end point."""
from conftest import VARIANTS
import json
import pytest
import torch


# What the rank check's line names for a fault in each part (tests/rank_states.py FAULTS).
NAMED = {"momentum": "optimizer.state.0.momentum_buffer", "loss scale": "amp.scaler.scale",
         "EMA": "ema.module.model.0.0.weight", "half weights": "network.model.0.0.weight",
         "scheduler": "scheduler.last_epoch"}


@pytest.mark.parametrize("variant", [name for name in VARIANTS if name != "diverged"])
def test_a_fault_in_any_part_of_one_rank_is_found_and_named(ranks, variant):
    """Each part alone differs on rank 1 (two elements swapped, two opposite signs flipped, a
    scale or a schedule's position): every rank stops with the line that names it."""
    found = [json.loads((ranks / variant / f"faults{rank}.json").read_text()) for rank in (0, 1)]
    assert found[0] == found[1]
    level = variant.split("-")[0]
    expected = {"momentum", "scheduler"} | ({"EMA"} if level in ("O0", "O1") else set()) | (
        {"loss scale"} if level in ("O1", "O2") else set()) | ({"half weights"} if level in ("O2", "apex") else set())
    assert found[0].keys() == expected, variant
    for part, line in found[0].items():
        assert line.startswith(f"the ranks disagree at the end of epoch 1: {NAMED[part]} differs on rank(s) 1 "
                               f"from rank 0"), (variant, part, line)


def test_a_rank_that_goes_its_own_way_stops_the_run_before_the_save(ranks):
    lines = [(ranks / "diverged" / f"rank{rank}.txt").read_text() for rank in (0, 1)]
    assert lines[0] == lines[1], lines
    assert lines[0].startswith("the ranks disagree at the end of epoch 1: state_dict.model.5.4.weight differs "
                               "on rank(s) 1 from rank 0"), lines[0]
    saved = torch.load(ranks / "diverged" / "run" / "checkpoints" / "last.pt", weights_only=False)
    assert (saved["epoch"], saved["epoch_step"]) == (1, 0)  # the first epoch's, kept
