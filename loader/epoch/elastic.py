"""Epoch plans across resumes onto another world size or worker count (elastic resume).

An epoch may run in *legs*: the first at world size ``W1`` with ``N1`` workers per rank, stopped
after every rank delivered ``k1`` batches, the next at ``W2`` / ``N2`` over what is left, and so on.
A leg is the triple ``(world_size, num_workers, batches delivered per rank)`` (:data:`.position.Leg`;
"stages" in a saved state); the finished legs of an epoch and the seed
fix everything else:

- The samples a leg delivered are a pure function of its plan and the count: each worker's sample
  order is the interleave-and-shuffle of :mod:`.order` run on sample *positions* instead of
  samples, so it is recomputed here from indices, without reading a shard (:func:`remaining`).
- The next leg deals the samples not yet delivered, in the epoch's shard order, to its ranks and
  workers in blocks, as :func:`.partition.worker_plan` deals a fresh epoch: every rank gets the
  same number of batches, and every remaining sample comes exactly once (ranks may hold one sample
  more or less; see :func:`leg_counts`). Reads skip the delivered samples without decoding them.

Without finished legs the plan is :func:`.partition.worker_plan`'s, so a resume onto the same
topology continues the same plan exactly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from . import partition
from .order import Order, replayed, worker_order
from .partition import Segment, WorkerPlan

__all__ = [
    "Layout",
    "Leg",
    "forget_delivered",
    "leg_counts",
    "plan",
    "rank_batches",
    "remaining",
    "shard_bases",
    "stream_positions",
]

from .position import Leg


@dataclass(frozen=True)
class Layout:
    """What fixes a train epoch's order, besides the epoch, the ranks and the workers."""

    shard_samples: tuple[int, ...]
    seed: int
    batch_size: int
    drop_last: bool
    shuffle: bool
    shuffle_buffer: int
    shuffle_initial: int

    @property
    def order(self) -> Order:
        """What fixes a worker's sample order (:func:`.order.worker_order`)."""
        return Order(self.seed, self.shuffle, self.shuffle_buffer, self.shuffle_initial)


def plan(
    layout: Layout,
    *,
    epoch: int,
    legs: Sequence[Leg],
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
) -> WorkerPlan:
    """What worker ``(rank, worker)`` reads in ``epoch`` after the finished ``legs`` (train mode)."""
    if not legs:
        return partition.worker_plan(
            layout.shard_samples,
            seed=layout.seed,
            epoch=epoch,
            rank=rank,
            world_size=world_size,
            worker=worker,
            num_workers=num_workers,
            batch_size=layout.batch_size,
            train=True,
            drop_last=layout.drop_last,
            shuffle=layout.shuffle,
        )
    left = remaining(layout, epoch, tuple(legs))
    return _leg_plan(
        layout, epoch, left, rank=rank, world_size=world_size, worker=worker, num_workers=num_workers
    )


def leg_counts(left: int, world_size: int, batch_size: int) -> tuple[list[int], int]:
    """Samples of each rank and the batches of every rank, for ``left`` samples to deal.

    Ranks take ``left // W`` or one more sample, all in the same number of batches; that needs at
    least one sample a rank and two a batch when ranks differ, else the ``left mod W`` extra
    samples wait (they are not delivered this epoch, as in any train epoch).
    """
    q, m = divmod(left, world_size)
    if m and (q == 0 or batch_size < 2):
        m = 0
    samples = [q + (r < m) for r in range(world_size)]
    return samples, math.ceil(max(samples, default=0) / batch_size)


def rank_batches(layout: Layout, *, epoch: int, legs: Sequence[Leg], world_size: int) -> int:
    """Batches each rank yields in the leg after ``legs`` (the whole epoch without legs)."""
    if not legs:
        total = sum(layout.shard_samples)
        kw = dict(batch_size=layout.batch_size, train=True, drop_last=layout.drop_last)
        return partition.rank_batches(total, world_size=world_size, **kw)[0]  # type: ignore[arg-type]
    return leg_counts(len(remaining(layout, epoch, tuple(legs))), world_size, layout.batch_size)[1]


@functools.lru_cache(maxsize=4)
def remaining(layout: Layout, epoch: int, legs: tuple[Leg, ...]) -> np.ndarray:
    """Sorted virtual positions (shards in the epoch's order) of the samples the legs did not deliver."""
    total = sum(layout.shard_samples)
    world_size = legs[0][0]
    first = [
        plan(layout, epoch=epoch, legs=(), rank=r, world_size=world_size, worker=0, num_workers=1)
        for r in range(world_size)
    ]
    keep = np.zeros(total, dtype=bool)
    base = shard_bases(layout, epoch)
    for p in first:
        for seg in p.segments:
            keep[base[seg.shard] + seg.start : base[seg.shard] + seg.stop] = True
    left = np.flatnonzero(keep)
    for i, (w, n, k) in enumerate(legs):
        for r in range(w):
            for worker, count in enumerate(partition.delivered_by_worker(k, n)):
                p = _leg_plan(layout, epoch, left, rank=r, world_size=w, worker=worker, num_workers=n, leg=i)
                skip = sum(p.sizes[:count])
                forget_delivered(keep, layout, epoch, p, base, skip=skip, rank=r, worker=worker, leg=i)
        left = np.flatnonzero(keep)
    return left


def _leg_plan(
    layout: Layout,
    epoch: int,
    left: np.ndarray,
    *,
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    leg: int | None = None,
) -> WorkerPlan:
    if leg == 0:
        return plan(
            layout,
            epoch=epoch,
            legs=(),
            rank=rank,
            world_size=world_size,
            worker=worker,
            num_workers=num_workers,
        )
    samples, batches = leg_counts(len(left), world_size, layout.batch_size)
    sizes = [partition.rank_batch_sizes(s, batches, layout.batch_size) for s in samples]
    counts = [sum(s[w::num_workers]) for s in sizes for w in range(num_workers)]
    block = partition.block_size(sum(counts), len(counts))
    order = partition.shard_order(
        len(layout.shard_samples), seed=layout.seed, epoch=epoch, shuffle=layout.shuffle
    )
    runs: list[Segment] = []
    for a, b in partition.deal(counts, block, rank * num_workers + worker):
        runs += partition.positions_to_segments(order, layout.shard_samples, left[a:b])
    return WorkerPlan(segments=tuple(runs), sizes=tuple(sizes[rank][worker::num_workers]))


def shard_bases(layout: Layout, epoch: int) -> np.ndarray:
    """Virtual position of each shard's first sample in the epoch's order, by shard number."""
    order = partition.shard_order(
        len(layout.shard_samples), seed=layout.seed, epoch=epoch, shuffle=layout.shuffle
    )
    sizes = np.asarray(layout.shard_samples, dtype=np.int64)[order]
    base = np.empty(len(order), dtype=np.int64)
    base[order] = np.cumsum(sizes) - sizes
    return base


def forget_delivered(
    keep: np.ndarray,
    layout: Layout,
    epoch: int,
    p: WorkerPlan,
    base: np.ndarray,
    *,
    skip: int,
    rank: int,
    worker: int,
    leg: int,
) -> None:
    """Clear in ``keep`` (by virtual position) the first ``skip`` samples the worker's pass yields.

    :func:`.order.replayed` on the plan's runs: each run's first samples it took, less those its
    shuffle buffer holds; a slice a run, so a leg of 100 M samples is forgotten in about a second.
    """
    taken, held = replayed(
        [len(seg) for seg in p.segments],
        layout.order,
        skip=skip,
        epoch=epoch,
        rank=rank,
        worker=worker,
        leg=leg,
    )
    for seg, count in zip(p.segments, taken, strict=True):
        first = int(base[seg.shard]) + seg.start
        if not seg.skip:
            keep[first : first + count] = False
        elif count:
            keep[_run_positions(seg, base)[:count]] = False
    for k, j in held:  # taken, not given: still to come
        seg = p.segments[k]
        keep[int(base[seg.shard]) + seg.start + j if not seg.skip else _run_positions(seg, base)[j]] = True


def _run_positions(seg: Segment, base: np.ndarray) -> np.ndarray:
    """The virtual positions of ``seg``'s run, its skipped samples left out."""
    indices = np.arange(seg.start, seg.stop, dtype=np.int64)
    if seg.skip:
        indices = np.setdiff1d(indices, np.fromiter(seg.skip, np.int64, len(seg.skip)))
    return int(base[seg.shard]) + indices


def stream_positions(
    layout: Layout, epoch: int, p: WorkerPlan, base: np.ndarray, *, rank: int, worker: int, leg: int
) -> Iterator[int]:
    """The worker's sample order as virtual positions: what its pass yields, replayed on indices.

    The same :func:`.order.worker_order` the read calls, on runs of positions instead of samples.
    """
    runs = [
        [int(base[seg.shard]) + i for i in range(seg.start, seg.stop) if i not in seg.skip]
        for seg in p.segments
    ]
    sizes = [len(seg) for seg in p.segments]
    return worker_order(runs, sizes, layout.order, epoch=epoch, rank=rank, worker=worker, leg=leg)
