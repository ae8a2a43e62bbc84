"""Sample-level shuffling inside one worker: interleave its shard runs, then a shuffle buffer.

Both stages take any iterables (raw, undecoded samples in the loader) and a ``numpy`` Generator;
the same inputs and RNG state give the same output order, which is what mid-epoch resume replays.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

import numpy as np

__all__ = ["buffer_shuffle", "interleave", "worker_rng"]

T = TypeVar("T")

_TAG_WORKER = 2


def worker_rng(seed: int, epoch: int, rank: int, worker: int, stage: int = 0) -> np.random.Generator:
    """Return the RNG of one worker's sample order in one epoch (``stage``: after so many elastic resumes)."""
    return np.random.default_rng([seed, epoch, _TAG_WORKER, rank, worker] + ([stage] if stage else []))


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
