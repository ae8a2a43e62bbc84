"""State a :class:`~imgshards.loader.ShardDataset` shares with its DataLoader workers, in shared memory.

A DataLoader worker holds a copy of the dataset made once, when it starts (persistent workers keep
it across epochs), so anything the main process decides later, the epoch and the resume point,
and anything a worker reports back, its skip counters and its free batch buffers, lives in one
shared ``int64`` tensor laid out as::

    [epoch, resume, counters (3 per worker slot), free flags (8 per worker slot)]
"""

from __future__ import annotations

import torch

from .batch import BufferPool

__all__ = ["CORRUPT", "TRUNCATED", "UNREADABLE", "SharedControl"]

# What a worker counts: an image that did not decode, a shard that ended early, a shard not readable.
CORRUPT, TRUNCATED, UNREADABLE = 0, 1, 2

_EPOCH, _RESUME, _COUNTERS = 0, 1, 2
_MAX_WORKER_SLOTS = 256
_PER_WORKER = 3
_POOL_BUFFERS = 8
_POOL = _COUNTERS + _PER_WORKER * _MAX_WORKER_SLOTS
_SIZE = _POOL + _POOL_BUFFERS * _MAX_WORKER_SLOTS


class SharedControl:
    """The epoch, the resume point, the skip counters and the batch-buffer flags of one dataset."""

    def __init__(self) -> None:
        self._t = torch.zeros(_SIZE, dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        """The epoch the next pass reads."""
        return int(self._t[_EPOCH])

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self._t[_EPOCH] = epoch

    @property
    def resume(self) -> int:
        """Batches of this rank's epoch the next pass skips (already delivered)."""
        return int(self._t[_RESUME])

    @resume.setter
    def resume(self, batches: int) -> None:
        self._t[_RESUME] = batches

    def count(self, worker: int, what: int) -> None:
        """Add one to counter ``what`` (:data:`CORRUPT`, ...) of worker process ``worker``."""
        self._t[_COUNTERS + _PER_WORKER * (worker % _MAX_WORKER_SLOTS) + what] += 1

    def total(self, what: int) -> int:
        """Counter ``what`` added up over every worker process, over all passes so far."""
        return int(self._t[_COUNTERS + what : _POOL : _PER_WORKER].sum())

    def pool(self, worker: int) -> BufferPool:
        """The batch-buffer pool of worker process ``worker`` (make one per process, on first use)."""
        first = _POOL + _POOL_BUFFERS * (worker % _MAX_WORKER_SLOTS)
        return BufferPool(self._t[first : first + _POOL_BUFFERS], first_token=first)

    def release(self, token: int) -> None:
        """Hand a worker's batch buffer back to it (the main process no longer refers to that batch)."""
        assert _POOL <= token < _SIZE, token
        self._t[token] = 1
