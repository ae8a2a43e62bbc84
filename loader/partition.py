"""Who reads what in an epoch: pure arithmetic over shard sample counts, no I/O.

One epoch of a split is laid out in four steps, each a function below:

1. **Shard order.** The split's shards are permuted with a RNG from ``(seed, epoch)`` (the same on
   every rank) and their samples concatenated into one *virtual sequence* of ``N`` samples.
2. **Remainder.** Train mode keeps ``world_size * per_rank`` samples, ``per_rank`` being
   ``N // world_size`` (rounded down to whole batches with ``drop_last``); the ``N - kept`` dropped
   samples are one contiguous run of the virtual sequence at a position drawn from ``(seed, epoch)``,
   so which samples miss an epoch changes every epoch. Eval mode keeps all ``N``.
3. **Ranks.** Train: rank ``r`` takes the kept samples ``[r * per_rank, (r + 1) * per_rank)``, so every
   rank yields the same number of batches. Eval: the ``ceil(N / batch_size)`` batches are dealt to ranks
   as evenly as possible (ranks differ by at most one batch) and every sample comes exactly once.
4. **Workers.** A rank's batches are dealt to its workers as evenly as possible, the first workers
   taking one more. ``torch.utils.data.DataLoader`` returns batches round-robin over its workers, so the
   rank's ``j``-th batch comes from worker ``j % num_workers`` (:func:`delivered_by_worker` and
   :func:`resumed_worker` rely on it). At most one batch of a rank is smaller than ``batch_size``:
   its last one, made by worker ``(batches - 1) % num_workers``.

Each worker's samples are a contiguous range of the virtual sequence, hence a few :class:`Segment`
runs of consecutive samples inside shards; with fewer shards than workers, workers share shards and
each starts at its own offset, so no worker idles while there is a batch left for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Segment",
    "WorkerPlan",
    "delivered_by_worker",
    "dropped_samples",
    "epoch_rng",
    "kept_per_rank",
    "rank_batches",
    "rank_sample_range",
    "resumed_worker",
    "segments",
    "shard_order",
    "worker_batches",
    "worker_plan",
    "worker_sample_counts",
]

# Tags that keep the random streams drawn from one (seed, epoch) independent of each other.
_TAG_SHARD_ORDER = 0
_TAG_DROPPED = 1


@dataclass(frozen=True)
class Segment:
    """Samples ``[start, stop)`` of shard number ``shard`` (its position in the split's shard list)."""

    shard: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker reads and yields in one epoch."""

    segments: tuple[Segment, ...]
    samples: int
    batches: int


def epoch_rng(seed: int, epoch: int, tag: int) -> np.random.Generator:
    """Return an RNG of the epoch's layout, identical on every rank and worker; ``tag`` names its use."""
    return np.random.default_rng([seed, epoch, tag])


def shard_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Return the epoch's order of shard numbers: a permutation from ``(seed, epoch)``, or index order."""
    if not shuffle:
        return np.arange(num_shards)
    return epoch_rng(seed, epoch, _TAG_SHARD_ORDER).permutation(num_shards)


def kept_per_rank(total: int, *, world_size: int, batch_size: int, train: bool, drop_last: bool) -> int:
    """Samples each rank takes in train mode (``N // world_size``, whole batches only with ``drop_last``).

    Not meaningful in eval mode, where ranks may differ by a batch (see :func:`rank_sample_range`).
    """
    assert train, "eval mode keeps every sample; ranks take unequal shares"
    per_rank = total // world_size
    return per_rank // batch_size * batch_size if drop_last else per_rank


def dropped_samples(total: int, *, world_size: int, batch_size: int, train: bool, drop_last: bool) -> int:
    """Samples of the split that no rank sees in an epoch.

    Train mode: ``N mod world_size`` (fewer than ``world_size``), plus with ``drop_last`` the partial
    batch of each rank, ``(N // world_size) mod batch_size`` per rank. Eval mode: none.
    """
    if not train:
        return 0
    kept = kept_per_rank(total, world_size=world_size, batch_size=batch_size, train=True, drop_last=drop_last)
    return total - world_size * kept


def rank_batches(total: int, *, world_size: int, batch_size: int, train: bool, drop_last: bool) -> list[int]:
    """Batches each rank yields in one epoch (the same for every rank in train mode)."""
    if train:
        kept = kept_per_rank(
            total, world_size=world_size, batch_size=batch_size, train=True, drop_last=drop_last
        )
        return [math.ceil(kept / batch_size)] * world_size
    batches = math.ceil(total / batch_size)
    return [batches // world_size + (r < batches % world_size) for r in range(world_size)]


def rank_sample_range(
    total: int, *, rank: int, world_size: int, batch_size: int, train: bool, drop_last: bool
) -> tuple[int, int]:
    """Return rank ``rank``'s samples as a range of the kept sequence (train) or the whole split (eval)."""
    if train:
        kept = kept_per_rank(
            total, world_size=world_size, batch_size=batch_size, train=True, drop_last=drop_last
        )
        return rank * kept, (rank + 1) * kept
    counts = rank_batches(total, world_size=world_size, batch_size=batch_size, train=False, drop_last=False)
    first_batch = sum(counts[:rank])
    return min(first_batch * batch_size, total), min((first_batch + counts[rank]) * batch_size, total)


def worker_batches(batches: int, num_workers: int) -> list[int]:
    """Deal a rank's batches to its workers, the first ``batches % num_workers`` workers taking one more."""
    return [batches // num_workers + (w < batches % num_workers) for w in range(num_workers)]


def worker_sample_counts(samples: int, batches: int, *, num_workers: int, batch_size: int) -> list[int]:
    """Samples each worker of a rank reads: whole batches, but for the rank's last (smaller) batch.

    ``samples`` must fill ``batches`` batches with at most one short: ``(batches - 1) * batch_size <
    samples <= batches * batch_size`` (or both zero).
    """
    short = batches * batch_size - samples
    assert 0 <= short < max(batch_size, 1) or samples == batches == 0, (samples, batches, batch_size)
    counts = [b * batch_size for b in worker_batches(batches, num_workers)]
    if batches:
        counts[(batches - 1) % num_workers] -= short
    return counts


def delivered_by_worker(delivered: int, num_workers: int) -> list[int]:
    """Split the count of batches a rank has delivered into the count each worker made.

    DataLoader asks workers for batches in a cycle and returns them in that order, skipping workers
    that have run out; since the first workers hold the most batches (:func:`worker_batches`), the
    rank's ``j``-th batch is always worker ``j % num_workers``'s.
    """
    return worker_batches(delivered, num_workers)


def resumed_worker(process: int, delivered: int, num_workers: int) -> int:
    """Return the worker whose share DataLoader process ``process`` makes when resuming after ``delivered``.

    A new DataLoader pass asks process 0 first, but the next batch of the interrupted pass is
    worker ``delivered % num_workers``'s; rotating the roles by ``delivered`` makes the resumed pass
    yield the rest of the original order (the cycle skips exhausted workers the same way, since the
    workers with batches left still form a prefix of the rotated cycle in every round).
    """
    return (process + delivered) % num_workers


def segments(
    order: Sequence[int] | np.ndarray, shard_samples: Sequence[int], start: int, stop: int
) -> list[Segment]:
    """Cut the range ``[start, stop)`` of the virtual sequence (shards in ``order``) into shard runs."""
    runs: list[Segment] = []
    offset = 0
    for shard in order:
        size = shard_samples[shard]
        lo, hi = max(start, offset), min(stop, offset + size)
        if lo < hi:
            runs.append(Segment(int(shard), lo - offset, hi - offset))
        offset += size
        if offset >= stop:
            break
    return runs


def _kept_to_virtual(start: int, stop: int, *, gap_at: int, gap: int) -> list[tuple[int, int]]:
    """Map a range of kept samples to ranges of the virtual sequence, around the dropped run."""
    if stop <= gap_at or gap == 0:
        return [(start, stop)] if start < stop else []
    if start >= gap_at:
        return [(start + gap, stop + gap)]
    return [(start, gap_at), (gap_at + gap, stop + gap)]


def worker_plan(
    shard_samples: Sequence[int],
    *,
    seed: int,
    epoch: int,
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    batch_size: int,
    train: bool,
    drop_last: bool,
    shuffle: bool,
) -> WorkerPlan:
    """Return what global worker ``(rank, worker)`` reads in ``epoch`` (see the module docstring)."""
    total = sum(shard_samples)
    order = shard_order(len(shard_samples), seed=seed, epoch=epoch, shuffle=shuffle)
    gap = dropped_samples(
        total, world_size=world_size, batch_size=batch_size, train=train, drop_last=drop_last
    )
    # Where the dropped run starts is drawn per epoch; unshuffled, it is the end of the split.
    gap_at = (
        int(epoch_rng(seed, epoch, _TAG_DROPPED).integers(0, total - gap + 1)) if shuffle else total - gap
    )
    lo, hi = rank_sample_range(
        total, rank=rank, world_size=world_size, batch_size=batch_size, train=train, drop_last=drop_last
    )
    batches = rank_batches(
        total, world_size=world_size, batch_size=batch_size, train=train, drop_last=drop_last
    )[rank]
    counts = worker_sample_counts(hi - lo, batches, num_workers=num_workers, batch_size=batch_size)
    start = lo + sum(counts[:worker])
    stop = start + counts[worker]
    runs = [
        seg
        for a, b in _kept_to_virtual(start, stop, gap_at=gap_at, gap=gap)
        for seg in segments(order, shard_samples, a, b)
    ]
    return WorkerPlan(
        segments=tuple(runs), samples=counts[worker], batches=worker_batches(batches, num_workers)[worker]
    )
