"""Per-worker step clocks in shared memory: where a DataLoader worker's time goes, read from outside.

A :class:`StepTimes` is a small shared-memory table, one row per worker process, holding for each
step (read, decode, augment, collate) the wall time and the CPU time that worker spent in it, the
batches and images it finished, and its pid. Wall time is what the training loop feels; the CPU
time next to it tells why a step took it: a read whose wall time far exceeds its CPU time waited
for storage, a decode that does waited for a core (a machine running more busy processes than it
has cores). The loader fills the table only when one is attached (``ShardDataset.step_times``, set
by :mod:`imgshards.loader.profiling` before the workers start); otherwise the pipeline gets
:data:`NO_CLOCK`, whose wrappers hand back the very functions and iterators they are given, so an
unprofiled loader runs exactly the code it runs without this module.

Inside a worker, a :class:`StepClock` adds up seconds in plain Python floats around each timed call
(``perf_counter`` and ``process_time``, about 2 microseconds a call, under 0.2% of decoding and
augmenting an ImageNet-sized image) and writes them to its row once per finished batch, just before
the batch is handed to the DataLoader: so the main process can count the batches made but not yet
consumed (the prefetch queue) from the same table. ``process_time`` counts all the threads of the
process, so it includes torch's intra-op threads where they run (the main process, with no workers).

This module names the steps, for the workers' table and the training process's decoder alike
(:class:`~imgshards.loader.device.marks.DecoderStats`, whose steps are decode, augment, normalize).

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

from ..state.buffers import shared_tensor

__all__ = [
    "AUGMENT",
    "COLLATE",
    "DECODE",
    "NORMALIZE",
    "NO_CLOCK",
    "READ",
    "STEPS",
    "NoClock",
    "StepClock",
    "StepTimes",
    "cpu_seconds_by_step",
    "images",
    "pids",
    "seconds_by_step",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])

READ, DECODE, AUGMENT, COLLATE = "read", "decode", "augment", "collate"
NORMALIZE = "normalize"  # the training process's decoder only (decode_on): the workers do not normalize
STEPS: tuple[str, ...] = (READ, DECODE, AUGMENT, COLLATE)  # the workers' steps, in table order
_COLUMN = {step: i for i, step in enumerate(STEPS)}
# A row: wall seconds per step, CPU seconds per step, then these.
_N = len(STEPS)
_BATCHES, _IMAGES, _PID = 2 * _N, 2 * _N + 1, 2 * _N + 2
_COLUMNS = 2 * _N + 3


class StepTimes:
    """A shared table of per-worker step seconds, batches and images; attach it before workers start.

    Args:
        workers: DataLoader worker processes (``0``: batches are made in the main process, row 0).

    """

    def __init__(self, workers: int) -> None:
        # float64 holds counts and pids exactly (below 2**53).
        self.table = shared_tensor((max(workers, 1), _COLUMNS), torch.float64)

    def clock(self) -> StepClock:
        """Return a clock writing to the row of the calling process (its DataLoader worker id)."""
        info = get_worker_info()
        row = 0 if info is None else info.id % len(self.table)
        return StepClock(self.table[row])

    def snapshot(self) -> torch.Tensor:
        """A copy of the table as it is now (read it with :func:`seconds_by_step` and the like)."""
        return self.table.clone()

    def batches(self) -> int:
        """Batches finished by all workers so far."""
        return int(self.table[:, _BATCHES].sum())


def seconds_by_step(snap: torch.Tensor) -> torch.Tensor:
    """``[workers, len(STEPS)]`` wall seconds of a snapshot (or of a difference of two)."""
    return snap[:, :_N]


def cpu_seconds_by_step(snap: torch.Tensor) -> torch.Tensor:
    """``[workers, len(STEPS)]`` CPU seconds (all the process's threads) of a snapshot."""
    return snap[:, _N : 2 * _N]


def images(snap: torch.Tensor) -> torch.Tensor:
    """Images finished per worker in a snapshot (or a difference of two)."""
    return snap[:, _IMAGES]


def pids(snap: torch.Tensor) -> list[int]:
    """Pids of the processes that wrote each row (0: no batch finished yet)."""
    return [int(p) for p in snap[:, _PID].tolist()]


class StepClock:
    """Times the steps of one worker's pipeline and publishes them once per finished batch."""

    __slots__ = ("_row", "_seconds")

    def __init__(self, row: torch.Tensor) -> None:
        self._row = row
        self._seconds = [0.0] * (2 * _N)  # wall seconds per step, then CPU seconds per step
        row[_PID] = os.getpid()

    def timed(self, step: str, fn: F) -> F:
        """Return ``fn`` wrapped so that the time spent in it counts towards ``step`` (one of ``STEPS``)."""
        seconds, wall = self._seconds, _COLUMN[step]
        cpu = _N + wall

        def run(*args: object, **kwargs: object) -> object:
            start, start_cpu = perf_counter(), process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[cpu] += process_time() - start_cpu
                seconds[wall] += perf_counter() - start

        return run  # type: ignore[return-value]

    def timed_iter(self, step: str, items: Iterator[T]) -> Iterator[T]:
        """Yield from ``items``, counting the time spent getting each item towards ``step``."""
        seconds, wall = self._seconds, _COLUMN[step]
        cpu = _N + wall
        while True:
            start, start_cpu = perf_counter(), process_time()
            try:
                item = next(items)
            except StopIteration:
                return
            finally:
                seconds[cpu] += process_time() - start_cpu
                seconds[wall] += perf_counter() - start
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

    def timed(self, step: str, fn: F) -> F:
        """Return ``fn`` itself."""
        return fn

    def timed_iter(self, step: str, items: Iterator[T]) -> Iterator[T]:
        """Return ``items`` itself."""
        return items

    def batch_done(self, images: int) -> None:
        """Do nothing."""


NO_CLOCK = NoClock()
