"""Where a pass stands: the finished legs of its epoch, its first batch, and whose pass it is.

Plain values, no I/O: the pass reads them, resume states save them (:mod:`..state.checkpoint`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["Leg", "PassPosition"]

# A leg of an epoch run across elastic resumes: (world_size, num_workers, batches each rank
# delivered); see .elastic. Saved states name the finished legs "stages", their first key for them.
Leg = tuple[int, int, int]


@dataclass(frozen=True)
class PassPosition:
    """Where one process's pass stands: what it reads and from which of its batches on.

    Attributes:
        epoch: The epoch read.
        legs: The epoch's finished legs (elastic resume: ``(world_size, num_workers, batches)``).
        first: The first batch of this worker's plan that the pass makes (later: batches made).
        worker: The worker this process plays (after a resume, the one whose turn comes next).
        num_workers: The DataLoader workers of the leg (1 without workers).
        rank: The rank the pass reads for, settled as the pass started.
        world_size: The number of ranks, settled with it.

    """

    epoch: int = 0
    legs: tuple[Leg, ...] = ()
    first: int = 0
    worker: int = 0
    num_workers: int = 1
    rank: int = 0
    world_size: int = 1

    @property
    def leg(self) -> int:
        """The number of the leg read: how many finished before it."""
        return len(self.legs)

    def at(self, batch: int) -> PassPosition:
        """The same pass, after the worker made its batches before ``batch``."""
        return replace(self, first=batch)
