"""Per-worker stage clocks in shared memory: where a DataLoader worker's time goes, read from outside.

A :class:`StageTimes` is a small shared-memory table, one row per worker process, holding for each
stage (read, decode, augment, collate) the wall time and the CPU time that worker spent in it, the
batches and images it finished, and its pid. Wall time is what the training loop feels; the CPU
time next to it tells why a stage took it: a read whose wall time far exceeds its CPU time waited
for storage, a decode that does waited for a core (a machine running more busy processes than it
has cores). The loader fills the table only when one is attached (``ShardDataset.stage_times``, set
by :mod:`imgshards.loader.profiling` before the workers start); otherwise the pipeline gets
:data:`NO_CLOCK`, whose wrappers hand back the very functions and iterators they are given, so an
unprofiled loader runs exactly the code it runs without this module.

Inside a worker, a :class:`StageClock` adds up seconds in plain Python floats around each timed call
(``perf_counter`` and ``process_time``, about 2 microseconds a call, under 0.2% of decoding and
augmenting an ImageNet-sized image) and writes them to its row once per finished batch, just before
the batch is handed to the DataLoader: so the main process can count the batches made but not yet
consumed (the prefetch queue) from the same table. ``process_time`` counts all the threads of the
process, so it includes torch's intra-op threads where they run (the main process, with no workers).

Rows are written by one process each and read by the main process without a lock: a read can catch a
row between the seconds and the batch count of one batch, which moves a figure by one batch at most.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from time import perf_counter, process_time
from typing import TypeVar

import torch
from torch.utils.data import get_worker_info

__all__ = [
    "AUGMENT",
    "COLLATE",
    "DECODE",
    "NO_CLOCK",
    "READ",
    "STAGES",
    "NoClock",
    "StageClock",
    "StageTimes",
    "images",
    "pids",
    "stage_cpu_seconds",
    "stage_seconds",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])

STAGES: tuple[str, ...] = ("read", "decode", "augment", "collate")
READ, DECODE, AUGMENT, COLLATE = range(4)
# A row: wall seconds per stage, CPU seconds per stage, then these.
_N = len(STAGES)
_BATCHES, _IMAGES, _PID = 2 * _N, 2 * _N + 1, 2 * _N + 2
_COLUMNS = 2 * _N + 3


class StageTimes:
    """A shared table of per-worker stage seconds, batches and images; attach it before workers start.

    Args:
        workers: DataLoader worker processes (``0``: batches are made in the main process, row 0).

    """

    def __init__(self, workers: int) -> None:
        # float64 holds counts and pids exactly (below 2**53).
        self.table = torch.zeros((max(workers, 1), _COLUMNS), dtype=torch.float64).share_memory_()

    def clock(self) -> StageClock:
        """Return a clock writing to the row of the calling process (its DataLoader worker id)."""
        info = get_worker_info()
        row = 0 if info is None else info.id % len(self.table)
        return StageClock(self.table[row])

    def snapshot(self) -> torch.Tensor:
        """A copy of the table as it is now (read it with :func:`stage_seconds` and the like)."""
        return self.table.clone()

    def batches(self) -> int:
        """Batches finished by all workers so far."""
        return int(self.table[:, _BATCHES].sum())


def stage_seconds(snap: torch.Tensor) -> torch.Tensor:
    """``[workers, len(STAGES)]`` wall seconds of a snapshot (or of a difference of two)."""
    return snap[:, :_N]


def stage_cpu_seconds(snap: torch.Tensor) -> torch.Tensor:
    """``[workers, len(STAGES)]`` CPU seconds (all the process's threads) of a snapshot."""
    return snap[:, _N : 2 * _N]


def images(snap: torch.Tensor) -> torch.Tensor:
    """Images finished per worker in a snapshot (or a difference of two)."""
    return snap[:, _IMAGES]


def pids(snap: torch.Tensor) -> list[int]:
    """Pids of the processes that wrote each row (0: no batch finished yet)."""
    return [int(p) for p in snap[:, _PID].tolist()]


class StageClock:
    """Times the stages of one worker's pipeline and publishes them once per finished batch."""

    __slots__ = ("_row", "_seconds")

    def __init__(self, row: torch.Tensor) -> None:
        self._row = row
        self._seconds = [0.0] * (2 * _N)  # wall seconds per stage, then CPU seconds per stage
        row[_PID] = os.getpid()

    def timed(self, stage: int, fn: F) -> F:
        """Return ``fn`` wrapped so that the time spent in it counts towards ``stage``."""
        seconds, cpu = self._seconds, _N + stage

        def run(*args: object, **kwargs: object) -> object:
            start, start_cpu = perf_counter(), process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[cpu] += process_time() - start_cpu
                seconds[stage] += perf_counter() - start

        return run  # type: ignore[return-value]

    def timed_iter(self, stage: int, items: Iterator[T]) -> Iterator[T]:
        """Yield from ``items``, counting the time spent getting each item towards ``stage``."""
        seconds, cpu = self._seconds, _N + stage
        while True:
            start, start_cpu = perf_counter(), process_time()
            try:
                item = next(items)
            except StopIteration:
                return
            finally:
                seconds[cpu] += process_time() - start_cpu
                seconds[stage] += perf_counter() - start
            yield item

    def batch_done(self, images: int) -> None:
        """Publish the seconds gathered since the last batch, and one more batch of ``images``."""
        row = self._row
        # Seconds first, the batch count last: a reader that sees the batch sees its seconds.
        row[: 2 * _N] += torch.tensor(self._seconds, dtype=torch.float64)
        row[_IMAGES] += images
        row[_BATCHES] += 1
        self._seconds[:] = [0.0] * (2 * _N)  # in place: the wrappers made by timed() hold this list


class NoClock:
    """The clock of an unprofiled pipeline: hands back what it is given, records nothing."""

    __slots__ = ()

    def timed(self, stage: int, fn: F) -> F:
        """Return ``fn`` itself."""
        return fn

    def timed_iter(self, stage: int, items: Iterator[T]) -> Iterator[T]:
        """Return ``items`` itself."""
        return items

    def batch_done(self, images: int) -> None:
        """Do nothing."""


NO_CLOCK = NoClock()
