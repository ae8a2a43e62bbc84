"""Per-worker stage clocks in shared memory: where a DataLoader worker's time goes, read from outside.

A :class:`StageTimes` is a small shared-memory table, one row per worker process, holding the
seconds that worker spent reading, decoding, augmenting and collating (wall time), the CPU time it
used, the batches and images it finished, and its pid. Wall time is what the training loop feels;
CPU time next to it tells whether the worker had a core to itself (on a machine with more busy
processes than cores, a stage's wall time includes waiting for one). The loader fills it only when
one is attached (``ShardDataset.stage_times``, set by :mod:`imgshards.loader.profiling` before the
workers start); otherwise the pipeline gets :data:`NO_CLOCK`, whose wrappers hand back the very
functions and iterators they are given, so an unprofiled loader runs exactly the code it runs
without this module.

Inside a worker, a :class:`StageClock` adds up seconds in plain Python floats (two ``perf_counter``
calls around each timed call, well under a microsecond) and writes them to its row once per finished
batch, just before the batch is handed to the DataLoader: so the main process can count the batches
made but not yet consumed (the prefetch queue) from the same table.

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
    "cpu_seconds",
    "images",
    "pids",
    "stage_seconds",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])

STAGES: tuple[str, ...] = ("read", "decode", "augment", "collate")
READ, DECODE, AUGMENT, COLLATE = range(4)
# Columns of a row after the stage seconds.
_BATCHES, _IMAGES, _PID, _CPU = 4, 5, 6, 7
_COLUMNS = 8


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
        """A copy of the table as it is now (rows: workers; columns: stages, batches, images, pid)."""
        return self.table.clone()

    def batches(self) -> int:
        """Batches finished by all workers so far."""
        return int(self.table[:, _BATCHES].sum())


def stage_seconds(snap: torch.Tensor) -> torch.Tensor:
    """``[workers, len(STAGES)]`` seconds of a snapshot (or of a difference of two)."""
    return snap[:, : len(STAGES)]


def images(snap: torch.Tensor) -> torch.Tensor:
    """Images finished per worker in a snapshot (or a difference of two)."""
    return snap[:, _IMAGES]


def cpu_seconds(snap: torch.Tensor) -> torch.Tensor:
    """CPU seconds (all threads) each worker used up to its last finished batch."""
    return snap[:, _CPU]


def pids(snap: torch.Tensor) -> list[int]:
    """Pids of the processes that wrote each row (0: no batch finished yet)."""
    return [int(p) for p in snap[:, _PID].tolist()]


class StageClock:
    """Times the stages of one worker's pipeline and publishes them once per finished batch."""

    __slots__ = ("_cpu", "_row", "_seconds")

    def __init__(self, row: torch.Tensor) -> None:
        self._row = row
        self._seconds = [0.0] * len(STAGES)
        self._cpu = process_time()
        row[_PID] = os.getpid()

    def timed(self, stage: int, fn: F) -> F:
        """Return ``fn`` wrapped so that the time spent in it counts towards ``stage``."""
        seconds = self._seconds

        def run(*args: object, **kwargs: object) -> object:
            start = perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[stage] += perf_counter() - start

        return run  # type: ignore[return-value]

    def timed_iter(self, stage: int, items: Iterator[T]) -> Iterator[T]:
        """Yield from ``items``, counting the time spent getting each item towards ``stage``."""
        seconds = self._seconds
        while True:
            start = perf_counter()
            try:
                item = next(items)
            except StopIteration:
                seconds[stage] += perf_counter() - start
                return
            seconds[stage] += perf_counter() - start
            yield item

    def batch_done(self, images: int) -> None:
        """Publish the seconds gathered since the last batch, and one more batch of ``images``."""
        row = self._row
        # Seconds first, the batch count last: a reader that sees the batch sees its seconds.
        cpu, self._cpu = self._cpu, process_time()
        row[: len(STAGES)] += torch.tensor(self._seconds, dtype=torch.float64)
        row[_CPU] += self._cpu - cpu
        row[_IMAGES] += images
        row[_BATCHES] += 1
        self._seconds[:] = [0.0] * len(STAGES)  # in place: the wrappers made by timed() hold this list


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
