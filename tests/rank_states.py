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

TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(TESTS.parent), str(TESTS)]

from mobilenet import checkpoint as ckpt  # noqa: E402
from mobilenet.cli import build_parser, config_from_args  # noqa: E402
from mobilenet.distributed import destroy, init_process_group, world_from_env  # noqa: E402
from mobilenet.engine import build_run, fit  # noqa: E402
from mobilenet.errors import TrainingFailure  # noqa: E402


def held_state(r):
    """What this rank holds: the checkpoint it would write (the RNG states, per rank by design,
    left out), the network as the step trains it (the half weights under O2), the tensors the
    optimizer updates (the masters) and the EMA's module."""
    step = r.state.train_step
    checkpoint = {k: v for k, v in r.state.state_dict().items() if k not in ("rng", "data", "config")}
    return {"checkpoint": checkpoint, "network": step.net.state_dict(),
            "optimizer_params": [p.detach().clone() for p in step.optimizer_params()],
            "ema": step.ema.module.state_dict() if step.ema else None}


def train(args, world, device, resume=None, before_fit=None):
    cfg = config_from_args(build_parser().parse_intermixed_args(args))
    with ckpt.claim_run_directory(cfg["output"], resume=resume, start_over=False, claim=world.is_main):
        r = build_run(cfg, world, device)
        if resume:
            r.state.resume(resume, say=r.log.info)
        if before_fit:
            before_fit(r)
        return r, fit(r)


def diverge_rank_1(r):
    if r.world.rank == 1:  # a memory fault, say: DDP's grad all-reduce never makes it equal again
        with torch.no_grad():
            r.state.train_step.net.get_parameter("model.5.4.weight").add_(1e-3)


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
    finally:
        destroy()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(Path(sys.argv[3]).read_text()))
