"""Horovod's ``hvd.elastic.ElasticSampler``: a data sampler that survives re-formed worlds.

It shards a dataset over the ranks of the current world, remembers which samples this
epoch has already processed (``record_batch``), and after the world re-forms (a worker
lost or added) shards only the samples not yet processed over the new ranks. Put it in
the elastic state (``hvd.elastic.TorchState(model, optimizer, train_sampler=sampler)``):
``sync()`` then unions what every rank processed and hands it to all, and a rollback
restores the committed record.
"""
from __future__ import annotations

import math
import random
from typing import Any, Iterator

import torch.utils.data

from .basics import rank, size
from .functions import allgather_object, broadcast_object

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """Shards ``dataset`` over the ranks, skipping the samples processed this epoch.

    Args:
        dataset: anything with ``len()``.
        shuffle: shuffle the remaining indices (the same way on every rank: seeded by
            ``seed + epoch``).
        seed: the shuffle's base seed.
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set = set()
        self.indices: list = []
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch`: nothing processed yet, a new shuffle."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Mark the samples of this rank's batch `batch_idx` as processed."""
        self.record_indices(self.get_indices(batch_idx, batch_size))

    def record_indices(self, indices: Any) -> None:
        """Mark dataset indices as processed."""
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list:
        """This rank's dataset indices of batch `batch_idx` (of the current iteration)."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self) -> dict:
        """The epoch and the processed indices (what TorchState saves and syncs)."""
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict: dict) -> None:
        """Take a state_dict() and re-shard the remaining samples over the current world."""
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def sync(self) -> None:
        """Every rank's processed indices, united, on every rank (from rank 0's view)."""
        united: set = set()
        for part in allgather_object(set(self.processed_indices)):
            united |= part
        state = self.state_dict()
        state["processed_indices"] = united
        self.load_state_dict(broadcast_object(state, root_rank=0, name="elastic.sampler"))

    def reset(self) -> None:
        """Re-shard: the samples not processed this epoch, over hvd.size() ranks."""
        self.num_replicas = size()
        self.rank = rank()
        self.remaining_indices = [i for i in range(len(self.dataset))
                                  if i not in self.processed_indices]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas
        self._shard()

    def _shard(self) -> None:
        indices = list(self.remaining_indices)
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        if indices:  # pad (repeating from the start) so every rank gets num_samples
            while len(indices) < self.total_size:
                indices += indices[:self.total_size - len(indices)]
        self.indices = indices[self.rank:self.total_size:self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        """This rank's share of the remaining indices."""
        self._shard()
        return iter(self.indices)

    def __len__(self) -> int:
        """Samples per rank this iteration."""
        return self.num_samples
