"""Run by test_accumulation.py under torchrun (2 processes): the gradient all-reduces DDP makes in
one optimizer step of two accumulated forwards and in one of a single forward, counted by a comm
hook around torch's own all-reduce; rank 0 writes them to the file given."""
import json
import sys
from pathlib import Path

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from mobilenet.cli import build_parser, config_from_args
from mobilenet.distributed import destroy, exit_process, init_process_group, world_from_env
from mobilenet.state import TrainingState


def main(out):
    world, device = world_from_env(), torch.device("cpu")
    init_process_group(world, device)
    cfg = config_from_args(build_parser().parse_intermixed_args([
        "--config", "configs/demo.yaml", "--data", "synthetic", "device=cpu", "model.width_mult=0.25",
        "model.resolution=32", "data.batch_size=8", "--grad-accum-steps", "2"]))
    state = TrainingState(cfg, device, steps_per_epoch=10, rank=world.rank)
    calls = []

    def counted(process_group, bucket):
        calls.append(1)
        return allreduce_hook(process_group, bucket)
    state.step.wrapped.register_comm_hook(None, counted)
    state.step.train()
    batch = (torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))
    counts = {}
    for name, forwards in (("warm-up", 2), ("two forwards", 2), ("one forward", 1)):
        calls.clear()
        state.train_on([batch] * forwards)
        counts[name] = len(calls)
    if world.is_main:
        Path(out).write_text(json.dumps(counts))
    destroy()


if __name__ == "__main__":
    main(sys.argv[1])
    exit_process(0)
