"""Run by tests/test_ranks.py under torchrun (2 processes, gloo): trains each variant through the
engine's own build_run and fit, then every rank writes everything it holds to
OUT/<variant>/rank<R>.pt, so the test can compare the ranks themselves, not only what rank 0 saved.

python -m torch.distributed.run --nproc_per_node 2 tests/rank_states.py OUT DATA VARIANTS.json
VARIANTS.json: {name: [train.py arguments]}; a name starting with 'apex' runs under the apex
stand-in (tests/standin_apex.py); 'diverged' trains one epoch, then a second after rank 1's copy of
one weight is changed, and records the failure each rank raised.
"""
import json
import sys
from pathlib import Path

import torch

from mobilenet.cli import build_parser, config_from_args
from mobilenet.distributed import destroy, exit_process, init_process_group, world_from_env
from mobilenet.engine import build_run, enter, fit
from mobilenet.errors import TrainingFailure
from mobilenet.logging import run_directory
from mobilenet.resume import prepare, restore
from mobilenet.watchdog import Watchdog


def held_state(r):
    """What this rank holds: the checkpoint it would write (the RNG states, per rank by design,
    left out), the network as the step trains it (the half weights under O2), the tensors the
    optimizer updates (the masters) and the EMA's module."""
    step = r.state.step
    checkpoint = {k: v for k, v in r.state.state_dict().items() if k not in ("rng", "data", "config")}
    return {"checkpoint": checkpoint, "network": step.net.state_dict(),
            "optimizer_params": [p.detach().clone() for p in step.optimizer_params()],
            "ema": step.ema.module.state_dict() if step.ema else None}


def train(args, world, device, resume=None, before_fit=None):
    cfg = config_from_args(build_parser().parse_intermixed_args(args))
    with run_directory(cfg["output"], resume=resume, start_over=False, main=world.is_main,
                       claim=world.is_main) as log:
        if resume:
            cfg, chosen = prepare(cfg, resume, log)
        watchdog = Watchdog(cfg["train"]["stall_timeout"], world, cfg["data"]["path"],
                            Path(cfg["output"]) / "checkpoints")
        r = build_run(cfg, world, device, log, watchdog)
        if resume:
            restore(r, chosen)
        if before_fit:
            before_fit(r)
        return r, fit(r)


def storage_order(tensor):
    """A flat view of a dense tensor's elements as they lie in memory (channels_last too)."""
    return tensor.detach().as_strided((tensor.numel(),), (1,), tensor.storage_offset())


def swap_two(tensor):
    """Swaps two elements of different value (a fault that a plain sum of the bits misses); returns
    the undo."""
    flat = storage_order(tensor)
    i = 0
    j = int((flat != flat[i]).nonzero()[0])
    flat[[i, j]] = flat[[j, i]]
    return lambda: swap_back(flat, i, j)


def swap_back(flat, i, j):
    flat[[i, j]] = flat[[j, i]]


def flip_opposite_signs(tensor):
    """Flips the sign of a positive and of a negative element (the bit patterns' plain sum stays);
    returns the undo."""
    flat = storage_order(tensor)
    both = [int((flat > 0).nonzero()[0]), int((flat < 0).nonzero()[0])]
    flat[both] = -flat[both]
    return lambda: flat.__setitem__(both, -flat[both])


def scaled(tensor, factor):
    tensor.mul_(factor)
    return lambda: tensor.div_(factor)


def later_schedule(scheduler):
    scheduler.last_epoch += 1
    return lambda: setattr(scheduler, "last_epoch", scheduler.last_epoch - 1)


# One fault in one part of what a rank holds, each the only difference between the ranks: {part:
# (whether the variant has that part, the fault, applied on rank 1; returns its undo)}.
FAULTS = {
    "momentum": (lambda s: bool(s.step.optimizer.state),
                 lambda s: swap_two(next(iter(s.step.optimizer.state.values()))["momentum_buffer"])),
    "loss scale": (lambda s: getattr(s.step.precision, "scaler", None) is not None,
                   lambda s: scaled(s.step.precision.scaler.scale, 2.0)),
    "EMA": (lambda s: s.step.ema is not None,
            lambda s: flip_opposite_signs(next(s.step.ema.module.parameters()))),
    "half weights": (lambda s: next(s.step.net.parameters()).dtype == torch.float16,
                     lambda s: swap_two(next(s.step.net.parameters()))),
    "scheduler": (lambda s: True, lambda s: later_schedule(s.scheduler)),
}


def check_each_fault(r, rank):
    """{part: the rank check's failure (or 'agreed')} for one fault at a time on rank 1, through the
    run's epoch-end point (where the rank check is a behaviour: tests/test_behaviour_rank_agreement.py)."""
    state, found = r.state, {}
    for part, (present, fault) in FAULTS.items():
        if not present(state):
            continue
        undo = fault(state) if rank == 1 else (lambda: None)
        try:
            enter(r, "at_epoch_end", {})
            found[part] = "agreed"
        except TrainingFailure as e:
            found[part] = str(e)
        undo()
    return found


def diverge_rank_1(r):
    if r.world.rank == 1:  # a memory fault, say: DDP's grad all-reduce never makes it equal again
        with torch.no_grad():
            r.state.step.net.get_parameter("model.5.4.weight").add_(1e-3)


def main(out, data, variants):
    world, device = world_from_env(), torch.device("cpu")
    init_process_group(world, device)
    try:
        for name, args in variants.items():
            folder = Path(out) / name
            args = [*args, "--data", data, "--output", str(folder / "run")]
            if name.startswith("apex"):
                import standin_apex
                sys.modules.update(standin_apex.modules())
            if name == "diverged":
                train([*args, "--epochs", "1"], world, device)
                try:
                    train([*args, "--epochs", "2"], world, device, resume="auto", before_fit=diverge_rank_1)
                    outcome = "trained on"
                except TrainingFailure as e:
                    outcome = str(e)
                (folder / f"rank{world.rank}.txt").write_text(outcome)
                continue
            r, summary = train(args, world, device)
            torch.save({**held_state(r), "top1": summary["top1"]}, folder / f"rank{world.rank}.pt")
            (folder / f"faults{world.rank}.json").write_text(json.dumps(check_each_fault(r, world.rank)))
    finally:
        destroy()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(Path(sys.argv[3]).read_text()))
    exit_process(0)  # as train.py ends: torch's teardown of the group may abort the process
