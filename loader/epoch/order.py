"""A worker's sample order: its shard runs interleaved, then through a shuffle buffer.

:func:`worker_order` is the one definition of that order. The pass calls it on runs of raw samples
(:mod:`..pipeline.passes`), the elastic replay on runs of sample positions (:mod:`.elastic`), so what a resume
recomputes is what the read did. Both stages take any iterables and a ``numpy`` Generator; the same
inputs and RNG state give the same output order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
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
    """
    pending = list(zip(streams, sizes, strict=True))
    pending.reverse()  # pop() takes them in the given order
    open_iters: list[Iterator[T]] = []
    left: list[int] = []
    while pending or open_iters:
        while pending and len(open_iters) < max_open:
            stream, size = pending.pop()
            if size > 0:
                open_iters.append(iter(stream))
                left.append(size)
        if not open_iters:
            return
        # Pick a stream with probability proportional to the items it has left.
        draw = int(rng.integers(sum(left)))
        i = 0
        while draw >= left[i]:
            draw -= left[i]
            i += 1
        item = next(open_iters[i], _END)
        left[i] -= 1
        if item is _END or left[i] == 0:
            del open_iters[i], left[i]
        if item is not _END:
            yield item  # type: ignore[misc]


_END = object()


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
    initial = min(max(initial, 1), size)
    for item in it:
        buf.append(item)
        if len(buf) < size:
            nxt = next(it, _END)
            if nxt is not _END:
                buf.append(nxt)  # type: ignore[arg-type]
        if len(buf) >= initial:
            yield _pop_random(buf, rng)
    while buf:
        yield _pop_random(buf, rng)


def _pop_random(buf: list[T], rng: np.random.Generator) -> T:
    i = int(rng.integers(len(buf)))
    buf[i], buf[-1] = buf[-1], buf[i]
    return buf.pop()
