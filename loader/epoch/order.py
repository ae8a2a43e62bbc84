"""A worker's sample order: its shard runs interleaved, then through a shuffle buffer.

:func:`worker_order` is the one definition of that order. The pass calls it on runs of raw samples
(:mod:`..pipeline.passes`), the elastic replay on runs of sample positions (:mod:`.elastic`), so what a resume
recomputes is what the read did. Both stages take any iterables and a ``numpy`` Generator; the same
inputs and RNG state give the same output order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TypeVar

import numpy as np

from .seeds import worker_rng

__all__ = ["Order", "buffer_shuffle", "interleave", "worker_order", "worker_rng"]

T = TypeVar("T")


@dataclass(frozen=True)
class Order:
    """The settings that fix a worker's sample order, besides its plan and place."""

    seed: int
    shuffle: bool
    buffer: int
    initial: int


def worker_order(
    runs: Sequence[Iterable[T]],
    sizes: Sequence[int],
    order: Order,
    *,
    epoch: int,
    rank: int,
    worker: int,
    leg: int,
) -> Iterator[T]:
    """The items of ``runs`` (one a segment of the worker's plan, ``sizes`` long) in the worker's order.

    Without shuffling, the runs one after another; else interleaved at random (odds by what each
    has left) and shuffled through a buffer, from the worker's RNG of ``(seed, epoch, rank, worker,
    leg)``. The items may be samples (the read) or positions (the elastic replay): the order is the
    same, item for item.
    """
    if not order.shuffle:
        return (item for run in runs for item in run)
    rng = worker_rng(order.seed, epoch, rank, worker, leg)
    return buffer_shuffle(interleave(runs, sizes, rng), rng, size=order.buffer, initial=order.initial)


def interleave(
    streams: Sequence[Iterable[T]], sizes: Sequence[int], rng: np.random.Generator, *, max_open: int = 32
) -> Iterator[T]:
    """Merge ``streams`` in random order, drawing each next item from a stream with odds by what it has left.

    With all streams open this is a uniformly random interleaving, so a worker whose samples come
    from several shards mixes them from its first batch even when each shard holds one class. At
    most ``max_open`` streams are open at a time; the next opens when one ends. ``sizes`` are the
    planned lengths; a stream that ends early (a truncated shard) just drops out.

    A stream is held only while it is read: once it has given its ``size`` items it is closed (a
    generator's ``close()``), so a run of a shard lets go of its file at once, and no list of every
    stream of the pass stays alive (that kept every finished shard of a pass open: issue 37).
    """
    pending = list(zip(streams, sizes, strict=True))
    pending.reverse()  # pop() takes them in the given order
    del streams  # the caller's list: each stream lives in `pending`, then in `reading`, then nowhere
    bits = _bits(rng)
    reading: list[Iterator[T] | None] = []  # by stream number: None once it ended
    left: list[int] = []
    now = 0  # streams open
    # One slot per item the open streams have left, holding its stream's number: a uniform pick of
    # a slot picks a stream with odds by what it has left, in O(1) (a stream that ended early
    # leaves void slots, passed over when picked).
    slots: list[int] = []
    while True:
        while pending and now < max_open:
            stream, size = pending.pop()
            if size > 0:
                slots += [len(reading)] * size
                reading.append(iter(stream))
                left.append(size)
                now += 1
        if not slots:
            return
        j = (next(bits) * len(slots)) >> 32
        n = slots[j]
        slots[j] = slots[-1]
        slots.pop()
        it = reading[n]
        if it is None:
            continue
        item = next(it, _END)
        left[n] -= 1
        if item is _END or not left[n]:
            reading[n] = None
            now -= 1
            _close(it)
        if item is not _END:
            yield item  # type: ignore[misc]


_END = object()
_DRAWS = 4096  # random numbers drawn at once: one numpy call per 4,096 picks, not one a pick


def _bits(rng: np.random.Generator) -> Iterator[int]:
    """Uniform 32-bit ints drawn in blocks; ``(next(bits) * n) >> 32`` is a uniform int in ``0..n-1``.

    That is Lemire's mapping: exact integer arithmetic, always below ``n``, off uniform by at most
    ``n / 2**32``. A numpy call per pick cost 2 us of the 6 us an item took to order, and a resume
    replays the order of millions of samples (issue 37).
    """
    return chain.from_iterable(iter(lambda: rng.integers(0, 1 << 32, _DRAWS, dtype=np.uint64).tolist(), None))


def _close(it: Iterator[object]) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


def buffer_shuffle(items: Iterable[T], rng: np.random.Generator, *, size: int, initial: int) -> Iterator[T]:
    """Shuffle a stream through a buffer of ``size`` items, starting once ``initial`` are in.

    Like webdataset's ``shuffle(bufsize, initial)``: while the buffer is below ``size`` it takes two
    items for each it gives, so it yields early (fast start) and still fills up. ``size <= 1`` keeps
    the order.
    """
    if size <= 1:
        yield from items
        return
    it = iter(items)
    buf: list[T] = []
    bits = _bits(rng)
    initial = min(max(initial, 1), size)
    for item in it:
        buf.append(item)
        if len(buf) < size:
            nxt = next(it, _END)
            if nxt is not _END:
                buf.append(nxt)  # type: ignore[arg-type]
        if len(buf) >= initial:
            i = (next(bits) * len(buf)) >> 32
            buf[i], buf[-1] = buf[-1], buf[i]
            yield buf.pop()
    while buf:
        i = (next(bits) * len(buf)) >> 32
        buf[i], buf[-1] = buf[-1], buf[i]
        yield buf.pop()
