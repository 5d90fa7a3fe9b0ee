"""torch.distributed from the torchrun environment: one process per card, rank-0 I/O."""
import atexit
import datetime
import functools
import gc
import os
import re
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mobilenet.device import DIST_BACKENDS
from mobilenet.errors import TrainingFailure, UsageError


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0
    size: int = 1
    restart: int = 0  # torchrun's restart count (--max-restarts): > 0 after a failure restarted the job
    local_size: int = 1  # processes of the job on this node

    @property
    def is_main(self):
        return self.rank == 0


def world_from_env():
    """Rank, local rank and world size that torchrun sets (a plain launch is a world of one)."""
    env = os.environ
    return World(int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), int(env.get("WORLD_SIZE", 1)),
                 int(env.get("TORCHELASTIC_RESTART_COUNT", 0)), int(env.get("LOCAL_WORLD_SIZE", 1)))


TORCH_WAIT_S = 1800  # torch's own default timeout for a collective


def init_process_group(world, device, wait=TORCH_WAIT_S):
    """hccl on npu, nccl on cuda, gloo on cpu; none for a world of one. A collective times out after
    ``wait`` seconds (a run's: its Watchdog's collective_wait); a failed meeting is one line."""
    if world.size > 1 and not dist.is_initialized():
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        kwargs["timeout"] = datetime.timedelta(seconds=wait)
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        if "TORCHELASTIC_RUN_ID" not in os.environ:  # torchrun's agents met already, and say so
            print(f"rank {world.rank} of {world.size}: waiting up to {wait:.0f} s for the job's {world.size} "
                  f"processes at {where}", flush=True)
        try:
            dist.init_process_group(DIST_BACKENDS[device.type], rank=world.rank,
                                    world_size=world.size, **kwargs)
        except dist.DistError as e:
            raise meeting_failure(e, world, where, wait) from None
        global joined
        joined = True


joined = False  # whether this process was in a process group (exit_process)


def exit_process(code):
    """Ends the process with ``code`` without the interpreter's teardown (it frees torch's objects one
    by one: a second of each end here; after a process group torch's C++ threads can abort it,
    pytorch/pytorch#190489): the exit handlers first (outside a group), the output flushed last."""
    if not joined:
        atexit._run_exitfuncs()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def meeting_failure(error, world, where, wait):
    """The one line for a job whose processes could not meet at ``where`` (MASTER_ADDR:PORT)."""
    text, port = str(error), where.rsplit(":", 1)[-1]
    if "EADDRINUSE" in text or "address already in use" in text:
        return UsageError(f"MASTER_PORT {port}: the port is in use at {where} (another job, or this job started "
                          f"twice?); give every process of this job one free MASTER_PORT")
    joined = re.search(r"(\d+)/(\d+) clients joined", text)
    if joined:
        return TrainingFailure(f"rank {world.rank} waited {wait:.0f} s at {where}, and {joined.group(1)} of the job's "
                               f"{world.size} processes arrived; start every one (RANK_ID 0..{world.size - 1} on "
                               f"each node) with the same MASTER_ADDR and MASTER_PORT")
    if "trying to connect" in text:
        return TrainingFailure(f"rank {world.rank} could not reach rank 0 at {where} within {wait:.0f} s: rank 0 "
                               f"is not running there, or MASTER_ADDR and MASTER_PORT differ between the processes")
    return TrainingFailure(f"rank {world.rank}: the job's processes could not meet at {where} "
                           f"({text.strip().splitlines()[0][:200]})")


def wrap_ddp(model, world_size, device):
    if world_size == 1:
        return model
    ids = None if device.type == "cpu" else [device.index]
    return DistributedDataParallel(model, device_ids=ids)


@functools.cache
def host_group():
    """A gloo group for small host reductions (the stop vote); every rank calls it first at one point."""
    if dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


def any_rank(*flags):
    """For each flag, whether it is true on any rank (one host reduction); one flag: a bool."""
    found = [bool(flag) for flag in flags]
    if dist.is_available() and dist.is_initialized():
        tensor = torch.tensor(found, dtype=torch.int32)
        dist.all_reduce(tensor, group=host_group())
        found = [bool(value) for value in tensor.tolist()]
    return found[0] if len(found) == 1 else found


def any_rank_restarted(world):
    """Whether this is a torchrun restart on any rank (torchrun counts restarts per node)."""
    return any_rank(world.restart > 0)


def from_rank0(compute):
    """``compute()`` on rank 0, its result (or its UsageError or TrainingFailure) on every rank."""
    if not (dist.is_available() and dist.is_initialized()):
        return compute()
    box = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("result", compute())
        except (UsageError, TrainingFailure) as e:
            box[0] = ("error", e)
    dist.broadcast_object_list(box, src=0, group=host_group())
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


def every_rank(value):
    """[rank 0's value, rank 1's, ...] on every rank, pickled through the host group."""
    if not is_distributed():
        return [value]
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value, group=host_group())
    return values


def is_distributed():
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@torch.no_grad()
def broadcast_from_rank0(tensors):
    """Rank 0's values into ``tensors`` on every rank, one broadcast per dtype."""
    if not is_distributed():
        return
    by_dtype = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    for group in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        dist.broadcast(flat, src=0)
        for tensor, values in zip(group, flat.split([t.numel() for t in group])):
            tensor.copy_(values.view(tensor.shape))


# The integer view of each element size, for bit-exact checksums (8-byte elements as two int32s,
# so that an int64 sum cannot overflow).
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int32}


def checksum(value, device):
    """The sum of ``value``'s bit patterns weighted by position: one changed bit changes it."""
    if not isinstance(value, torch.Tensor):
        value = torch.tensor(float(value), dtype=torch.float64)
    bits = value.detach().to(device).contiguous().reshape(-1).view(BITS[value.element_size()])
    position = torch.arange(1, bits.numel() + 1, device=bits.device, dtype=torch.int64)
    return (bits.to(torch.int64) * position).sum()


def first_disagreement(named, device):
    """None when every rank holds the same ``named`` state, else (name, [ranks that differ])."""
    if not is_distributed():
        return None
    sums = torch.stack([checksum(value, device) for _, value in named])
    gathered = [torch.empty_like(sums) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, sums)
    differs = torch.stack([row != gathered[0] for row in gathered]).cpu()  # ranks x tensors
    if not differs.any():
        return None
    first = int(differs.any(dim=0).nonzero()[0])
    return named[first][0], differs[:, first].nonzero().flatten().tolist()


def all_reduce_max(tensor):
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def all_reduce_sum(tensor):
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def destroy():
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    host_group.cache_clear()
