"""Who reads what in an epoch: pure arithmetic over shard sample counts, no I/O.

One epoch of a split is laid out in four steps, each a function below:

1. **Shard order.** The split's shards are permuted with a RNG from ``(seed, epoch)`` (the same on
   every rank) and their samples concatenated into one *virtual sequence* of ``N`` samples.
2. **Remainder.** Train mode keeps ``world_size * per_rank`` samples, ``per_rank`` being
   ``N // world_size`` (rounded down to whole batches with ``drop_last``); the ``N - kept`` dropped
   samples are one contiguous run of the virtual sequence at a position drawn from ``(seed, epoch)``,
   so which samples miss an epoch changes every epoch. Eval mode keeps all ``N``.
3. **Batches.** Train: every rank yields the same number of batches of ``per_rank`` samples. Eval: the
   ``ceil(N / batch_size)`` batches are dealt to ranks as evenly as possible (ranks differ by at most
   one batch) and every sample comes exactly once. A rank's batches are dealt to its workers as evenly
   as possible, the first workers taking one more. ``torch.utils.data.DataLoader`` returns batches
   round-robin over its workers, so the rank's ``j``-th batch comes from worker ``j % num_workers``
   (:func:`delivered_by_worker` and :func:`resumed_worker` rely on it).
4. **Samples.** Train: the kept sequence is cut into blocks of about ``1 / BLOCKS_PER_WORKER`` of a
   worker's share, dealt in turn to every worker of every rank (:func:`deal`): a worker's samples
   come from ``BLOCKS_PER_WORKER`` places spread over the whole epoch, so every worker interleaves
   many shards and mixes shards that each hold one class, at any ``ranks x workers``; within a block
   the reads are sequential. Eval: each worker reads a contiguous range of its rank's samples.

A worker's samples are a few :class:`Segment` runs of consecutive samples inside shards; with fewer
shards than workers, workers share shards and each starts at its own offset, so no worker idles
while there is a batch left for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .seeds import DROPPED, SHARD_ORDER, epoch_rng

__all__ = [
    "BLOCKS_PER_WORKER",
    "Segment",
    "WorkerPlan",
    "block_size",
    "deal",
    "delivered_by_worker",
    "dropped_samples",
    "epoch_rng",
    "kept_per_rank",
    "kept_to_virtual",
    "positions_to_segments",
    "rank_batch_sizes",
    "rank_batches",
    "rank_sample_range",
    "resumed_worker",
    "segments",
    "shard_order",
    "worker_batches",
    "worker_plan",
    "worker_sample_counts",
]

# Blocks of the epoch each worker gets in train mode: as many as a worker interleaves at once
# (shuffle.interleave's max_open), so it mixes samples from all of them from its first batch.
BLOCKS_PER_WORKER = 16


@dataclass(frozen=True)
class Segment:
    """Samples ``[start, stop)`` of shard number ``shard``, less those in ``skip`` (already delivered)."""

    shard: int
    start: int
    stop: int
    skip: frozenset[int] = field(default=frozenset())

    def __len__(self) -> int:
        return self.stop - self.start - len(self.skip)


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker reads and yields in one epoch: its samples, and the size of each of its batches."""

    segments: tuple[Segment, ...]
    sizes: tuple[int, ...]

    @property
    def samples(self) -> int:
        """Samples this worker yields (planned; a damaged shard may hold fewer)."""
        return sum(self.sizes)

    @property
    def batches(self) -> int:
        """Batches this worker yields."""
        return len(self.sizes)


def shard_order(num_shards: int, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Return the epoch's order of shard numbers: a permutation from ``(seed, epoch)``, or index order."""
    if not shuffle:
        return np.arange(num_shards)
    return epoch_rng(seed, epoch, SHARD_ORDER).permutation(num_shards)


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


def rank_batch_sizes(samples: int, batches: int, batch_size: int) -> list[int]:
    """Sizes of a rank's ``batches`` batches holding ``samples``: full but for the last.

    ``samples`` may also fill only ``batches - 1`` batches exactly (an elastic resume, where ranks
    hold one sample more or less): then the last two batches share one sample, so none is empty.
    """
    if batches == 0:
        return []
    sizes = [batch_size] * (batches - 1) + [samples - (batches - 1) * batch_size]
    if sizes[-1] == 0:
        assert batches >= 2 and batch_size >= 2, (samples, batches, batch_size)
        sizes[-2:] = [batch_size - 1, 1]
    assert 0 < sizes[-1] <= batch_size, (samples, batches, batch_size)
    return sizes


def worker_batches(batches: int, num_workers: int) -> list[int]:
    """Deal a rank's batches to its workers, the first ``batches % num_workers`` workers taking one more."""
    return [batches // num_workers + (w < batches % num_workers) for w in range(num_workers)]


def worker_sample_counts(samples: int, batches: int, *, num_workers: int, batch_size: int) -> list[int]:
    """Samples each worker of a rank reads: whole batches, but for the rank's last (smaller) batch."""
    sizes = rank_batch_sizes(samples, batches, batch_size)
    return [sum(sizes[w::num_workers]) for w in range(num_workers)]


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


def block_size(samples: int, global_workers: int) -> int:
    """Samples in one dealt block: a worker's share split into :data:`BLOCKS_PER_WORKER` blocks."""
    return max(1, math.ceil(samples / (max(global_workers, 1) * BLOCKS_PER_WORKER)))


def deal(counts: Sequence[int], block: int, who: int) -> list[tuple[int, int]]:
    """Ranges of ``[0, sum(counts))`` dealt to ``who`` when blocks go to each of ``counts`` in turn.

    Round ``t`` gives every taker ``g`` with room left ``min(block, counts[g] - t * block)`` samples,
    takers in index order; so each taker ends with exactly ``counts[g]``, in blocks spread over the
    whole range.
    """
    c = np.asarray(counts, dtype=np.int64)
    rounds = -(-int(c.max(initial=0)) // block)
    taken = np.clip(c[:, None] - block * np.arange(rounds)[None, :], 0, block)  # [taker, round]
    ends = np.cumsum(taken.T.ravel()).reshape(rounds, len(c)).T
    return [(int(e - n), int(e)) for e, n in zip(ends[who], taken[who], strict=True) if n]


def kept_to_virtual(start: int, stop: int, *, gap_at: int, gap: int) -> list[tuple[int, int]]:
    """Map a range of kept samples to ranges of the virtual sequence, around the dropped run."""
    if stop <= gap_at or gap == 0:
        return [(start, stop)] if start < stop else []
    if start >= gap_at:
        return [(start + gap, stop + gap)]
    return [(start, gap_at), (gap_at + gap, stop + gap)]


def segments(
    order: Sequence[int] | np.ndarray, shard_samples: Sequence[int], start: int, stop: int
) -> list[Segment]:
    """Cut the range ``[start, stop)`` of the virtual sequence (shards in ``order``) into shard runs."""
    sizes = np.asarray(shard_samples, dtype=np.int64)[np.asarray(order, dtype=np.int64)]
    ends = np.cumsum(sizes)
    runs: list[Segment] = []
    k = int(np.searchsorted(ends, start, side="right"))
    while k < len(ends) and start < stop:
        begin = int(ends[k] - sizes[k])
        hi = min(stop, int(ends[k]))
        if start < hi:
            runs.append(Segment(int(order[k]), start - begin, hi - begin))
        start = max(start, hi)
        k += 1
    return runs


def positions_to_segments(
    order: Sequence[int] | np.ndarray, shard_samples: Sequence[int], positions: np.ndarray
) -> list[Segment]:
    """Cut sorted virtual positions (with holes) into shard runs that skip the holes."""
    if len(positions) == 0:
        return []
    sizes = np.asarray(shard_samples, dtype=np.int64)[np.asarray(order, dtype=np.int64)]
    ends = np.cumsum(sizes)
    where = np.searchsorted(ends, positions, side="right")
    runs = []
    for k in np.unique(where):
        mine = positions[where == k] - int(ends[k] - sizes[k])
        start, stop = int(mine[0]), int(mine[-1]) + 1
        skip = frozenset(range(start, stop)) - frozenset(mine.tolist())
        runs.append(Segment(int(order[k]), start, stop, skip))
    return runs


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
    kw: dict[str, Any] = dict(world_size=world_size, batch_size=batch_size, train=train, drop_last=drop_last)
    gap = dropped_samples(total, **kw)
    # Where the dropped run starts is drawn per epoch; unshuffled, it is the end of the split.
    gap_at = int(epoch_rng(seed, epoch, DROPPED).integers(0, total - gap + 1)) if shuffle else total - gap
    batches = rank_batches(total, **kw)
    sizes = [rank_batch_sizes(hi - lo, b, batch_size) for (lo, hi), b in _rank_ranges(total, batches, kw)]
    mine = tuple(sizes[rank][worker::num_workers])
    if train:
        counts = [sum(s[w::num_workers]) for s in sizes for w in range(num_workers)]
        ranges = deal(counts, block_size(sum(counts), len(counts)), rank * num_workers + worker)
    else:
        lo, _ = rank_sample_range(total, rank=rank, **kw)
        start = lo + sum(sum(sizes[rank][w::num_workers]) for w in range(worker))
        ranges = [(start, start + sum(mine))]
    runs = [
        seg
        for start, stop in ranges
        for a, b in kept_to_virtual(start, stop, gap_at=gap_at, gap=gap)
        for seg in segments(order, shard_samples, a, b)
    ]
    return WorkerPlan(segments=tuple(_merged(runs)), sizes=mine)


def _merged(runs: list[Segment]) -> list[Segment]:
    """Join runs that continue each other in one shard (a lone worker's blocks), so each shard opens once."""
    out: list[Segment] = []
    for seg in runs:
        if (
            out
            and out[-1].shard == seg.shard
            and out[-1].stop == seg.start
            and not (out[-1].skip or seg.skip)
        ):
            out[-1] = Segment(seg.shard, out[-1].start, seg.stop)
        else:
            out.append(seg)
    return out


def _rank_ranges(total: int, batches: list[int], kw: dict[str, Any]) -> list[tuple[tuple[int, int], int]]:
    return [(rank_sample_range(total, rank=r, **kw), b) for r, b in enumerate(batches)]
