"""torch.distributed from the torchrun environment: one process per card, rank-0 I/O."""
import os
from dataclasses import dataclass

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mobilenet.device import DIST_BACKENDS


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0
    size: int = 1

    @property
    def is_main(self):
        return self.rank == 0


def world_from_env():
    """Rank, local rank and world size that torchrun sets (a plain launch is a world of one)."""
    env = os.environ
    return World(int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), int(env.get("WORLD_SIZE", 1)))


def init_process_group(world, device):
    """hccl on npu, nccl on cuda, gloo on cpu; nothing for a world of one."""
    if world.size > 1 and not dist.is_initialized():
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(DIST_BACKENDS[device.type], rank=world.rank,
                                world_size=world.size, **kwargs)


def wrap_ddp(model, world_size, device):
    if world_size == 1:
        return model
    ids = None if device.type == "cpu" else [device.index]
    return DistributedDataParallel(model, device_ids=ids)


def all_reduce_sum(tensor):
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def destroy():
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
