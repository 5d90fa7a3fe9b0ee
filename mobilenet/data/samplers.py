"""Samplers: a seeded, resumable shuffle for training and an exact shard for validation."""
import torch
from torch.utils.data import Sampler


class ResumableSampler(Sampler):
    """DistributedSampler's seeded per-epoch shuffle and interleaved shard (drop_last), as virtual
    ranks: a run of ``world`` processes that accumulate ``accumulation`` forwards of ``batch`` per
    optimizer step splits each global batch as ``world x accumulation`` ranks would, forward m of
    this process holding what rank ``rank x accumulation + m`` holds (so one process accumulating 2
    forwards trains what 2 processes train, forward by forward). It can start at any global step
    of the epoch (``set_epoch``), on any number of processes that keeps the global batch, and
    yields (index, seed): each sample's augmentation depends only on the seed, the epoch and its
    index, so a resumed run sees exactly the images an uninterrupted one would."""

    def __init__(self, length, rank=0, world=1, seed=0, batch=1, accumulation=1):
        self.length, self.seed, self.batch = length, seed, batch
        self.virtual = range(rank * accumulation, (rank + 1) * accumulation)  # this process's virtual ranks
        self.ranks = world * accumulation
        self.steps = length // self.ranks // batch  # optimizer steps an epoch (global batches)
        self.epoch = self.start = 0

    def set_epoch(self, epoch, start=0):
        """``start``: global steps already trained in this epoch."""
        self.epoch, self.start = epoch, start

    def __iter__(self):
        order = torch.randperm(self.length, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        order = order[:self.length // self.ranks * self.ranks]
        shares = {v: order[v::self.ranks].tolist() for v in self.virtual}
        base = (self.seed * 1_000_003 + self.epoch) * self.length
        b = self.batch
        return ((index, base + index) for step in range(self.start, self.steps) for v in self.virtual
                for index in shares[v][step * b:(step + 1) * b])

    def __len__(self):
        return (self.steps - self.start) * len(self.virtual) * self.batch


class ShardSampler(Sampler):
    """Every ``world``-th index from ``rank``: each val image is seen exactly once, no padding."""

    def __init__(self, length, rank, world):
        self.indices = range(rank, length, world)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)
