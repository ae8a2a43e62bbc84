"""State a :class:`~imgshards.loader.ShardDataset` shares with its DataLoader workers, in shared memory.

A DataLoader worker holds a copy of the dataset made once, when it starts (persistent workers keep
it across epochs), so anything the main process decides later, the epoch, the position in it and
the finished stages of an elastic resume, and anything a worker reports back, its skip counters and
its free batch buffers, lives in one shared ``int64`` tensor laid out as::

    [epoch, start, delivered, stage count, stages (3 each), the pass's epoch, stage count and stages,
     counters (5 per worker slot), flags (8 a slot)]

This tensor is the one record of the epoch: :class:`~imgshards.loader.ShardLoader` reads and
writes the dataset's epoch, never a copy of its own. The workers of a pass read the pass's own copy
(:meth:`SharedControl.start_pass`, :meth:`SharedControl.pass_state`): a worker may start after the
main process received the pass's last batch from the others and moved the record to the next epoch.
"""

from __future__ import annotations

import torch

from .batch import BufferPool

__all__ = ["CORRUPT", "FILTERED", "LOST", "MAX_STAGES", "TRUNCATED", "UNREADABLE", "SharedControl"]

# What a worker counts: an image that did not decode, a shard that ended early, a shard not readable,
# the samples its plan held that no shard gave it (truncated or unreadable), and those a user stage dropped.
CORRUPT, TRUNCATED, UNREADABLE, LOST, FILTERED = 0, 1, 2, 3, 4

MAX_STAGES = 16  # topology changes (elastic resumes) within one epoch
_EPOCH, _RESUME, _DELIVERED, _NSTAGES, _STAGES = 0, 1, 2, 3, 4
_PASS = _STAGES + 3 * MAX_STAGES  # the running pass's [epoch, stage count, stages]
_COUNTERS = _PASS + 2 + 3 * MAX_STAGES
_MAX_WORKER_SLOTS = 256
_PER_WORKER = 5
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

    def start_pass(self, resume: int) -> None:
        """Fix what the pass starting now reads: the record's epoch and stages, from batch ``resume`` on.

        Workers read it (:meth:`pass_state`) when their pass starts, which may be after the main
        process received the pass's first, or even last, batches from other workers; so it changes
        only between passes, while the record (:attr:`epoch`, :attr:`delivered`) moves on.
        """
        self._t[_PASS] = self._t[_EPOCH]
        self._t[_PASS + 1 : _COUNTERS] = self._t[_NSTAGES:_PASS]
        self._t[_RESUME] = resume

    def pass_state(self) -> tuple[int, tuple[tuple[int, int, int], ...], int]:
        """The running pass's epoch, finished stages and resume point (batches of its stage it skips)."""
        return int(self._t[_PASS]), self._read_stages(_PASS + 1), int(self._t[_RESUME])

    @property
    def delivered(self) -> int:
        """Batches of this rank's current stage delivered so far: where the next pass starts."""
        return int(self._t[_DELIVERED])

    @delivered.setter
    def delivered(self, batches: int) -> None:
        self._t[_DELIVERED] = batches

    @property
    def stages(self) -> tuple[tuple[int, int, int], ...]:
        """The epoch's finished stages ``(world_size, num_workers, batches)`` (see :mod:`.elastic`)."""
        return self._read_stages(_NSTAGES)

    @stages.setter
    def stages(self, stages: tuple[tuple[int, int, int], ...]) -> None:
        assert len(stages) <= MAX_STAGES, stages
        self._t[_NSTAGES] = len(stages)
        if stages:
            self._t[_STAGES : _STAGES + 3 * len(stages)] = torch.tensor([x for s in stages for x in s])

    def _read_stages(self, at: int) -> tuple[tuple[int, int, int], ...]:
        flat = self._t[at + 1 : at + 1 + 3 * int(self._t[at])].tolist()
        return tuple((flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3))

    def count(self, worker: int, what: int, n: int = 1) -> None:
        """Add ``n`` to counter ``what`` (:data:`CORRUPT`, ...) of worker process ``worker``."""
        self._t[_COUNTERS + _PER_WORKER * (worker % _MAX_WORKER_SLOTS) + what] += n

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
