"""Samplers: a seeded, resumable shuffle for training and an exact shard for validation."""
import torch
from torch.utils.data import Sampler


class ResumableSampler(Sampler):
    """DistributedSampler's seeded per-epoch shuffle and shard (drop_last), which can start
    mid-epoch, and yields (index, seed): each sample's augmentation depends only on the seed, the
    epoch and its index, so a resumed run sees exactly the images an uninterrupted one would."""

    def __init__(self, length, rank=0, world=1, seed=0):
        self.length, self.rank, self.world, self.seed = length, rank, world, seed
        self.per_rank = length // world
        self.epoch = self.start = 0

    def set_epoch(self, epoch, start=0):
        """``start``: samples of this process's share already trained in this epoch."""
        self.epoch, self.start = epoch, start

    def __iter__(self):
        order = torch.randperm(self.length, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        mine = order[:self.per_rank * self.world][self.rank::self.world].tolist()
        base = (self.seed * 1_000_003 + self.epoch) * self.length
        return ((index, base + index) for index in mine[self.start:])

    def __len__(self):
        return self.per_rank - self.start


class ShardSampler(Sampler):
    """Every ``world``-th index from ``rank``: each val image is seen exactly once, no padding."""

    def __init__(self, length, rank, world):
        self.indices = range(rank, length, world)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)
