"""A worker's sample order: its shard runs interleaved, then through a shuffle buffer.

:func:`worker_order` is the one definition of that order. The pass calls it on runs of raw samples
(:mod:`..pipeline.passes`), the elastic replay on runs of sample positions (:mod:`.elastic`), so what a resume
recomputes is what the read did. Both stages take any iterables and a ``numpy`` Generator; the same
inputs and RNG state give the same output order.

:func:`resumed_order` is that order from a resume point on: the part before it replayed on numbers
alone, in vectorized steps (0.18 us an item where the generators take 0.6), so a resume reads only
what comes after it (issue 37: 2.6 s to the first batch at the end of a 10M-sample epoch).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain
from typing import Any, TypeVar

import numpy as np

from .seeds import worker_rng

__all__ = [
    "Order",
    "Pending",
    "buffer_shuffle",
    "interleave",
    "replayed",
    "resumed_order",
    "worker_order",
    "worker_rng",
]

T = TypeVar("T")

_MAX_OPEN = 32  # streams interleave keeps open at a time


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
    streams: Sequence[Iterable[T]],
    sizes: Sequence[int],
    rng: np.random.Generator,
    *,
    max_open: int = _MAX_OPEN,
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
    return _merged(_Merge(pending, [], [], [], 0), _bits(rng), max_open)


@dataclass
class _Merge:
    """Where :func:`interleave` stands: what a fresh pass starts from, and what a resume continues from."""

    pending: list[Any]  # (stream, planned size), the next one last (a replay's: run numbers)
    reading: list[Any]  # by stream number: its iterator (a replay's: run number), None once it ended
    left: list[int]  # by stream number: the items it has left
    # One slot per item the open streams have left, holding its stream's number: a uniform pick of
    # a slot picks a stream with odds by what it has left, in O(1) (a stream that ended early
    # leaves void slots, passed over when picked).
    slots: list[int]
    now: int  # streams open


def _merged(m: _Merge, bits: Iterator[int], max_open: int) -> Iterator[Any]:
    pending, reading, left, slots, now = m.pending, m.reading, m.left, m.slots, m.now
    del m  # each stream lives in `pending`, then in `reading`, then nowhere
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
            yield item


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
        return iter(items)
    return _shuffled(iter(items), [], _bits(rng), size, min(max(initial, 1), size))


def _shuffled(it: Iterator[T], buf: list[T], bits: Iterator[int], size: int, initial: int) -> Iterator[T]:
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


Pending = tuple[int, int]
"""An item :func:`resumed_order` leaves to its caller: ``(k, j)``, item ``j`` of run ``k``."""


def resumed_order(
    open_run: Callable[[int, int], Iterable[T]],
    sizes: Sequence[int],
    order: Order,
    *,
    skip: int,
    epoch: int,
    rank: int,
    worker: int,
    leg: int,
) -> Iterator[T | Pending]:
    """:func:`worker_order`'s items from its item ``skip`` on, no run opened where it is only skipped.

    ``open_run(k, j)`` gives run ``k`` (``sizes[k]`` items, exactly) from its item ``j`` on. The
    order up to ``skip`` is replayed on numbers alone (:func:`_replay`), with the draws of
    :func:`worker_order` in the sequence it makes them; then each run still open opens where the
    replay left it, and the items the shuffle buffer holds at ``skip`` come out as :data:`Pending`
    pairs, each in its place in the order, for the caller to read one by one.
    """
    if not order.shuffle:
        k, j = 0, skip
        while k < len(sizes) and j >= sizes[k]:
            j -= sizes[k]
            k += 1
        return (item for r in range(k, len(sizes)) for item in open_run(r, j if r == k else 0))
    m, taken, buf, merge_draws, shuffle_draws = _replayed(
        sizes, order, skip=skip, epoch=epoch, rank=rank, worker=worker, leg=leg
    )
    pending: list[tuple[Any, int]] = [(_Opened(open_run, k, 0), n) for k, n in m.pending]
    reading = [None if k is None else iter(open_run(k, taken[k])) for k in m.reading]
    merged = _merged(_Merge(pending, reading, m.left, m.slots, m.now), merge_draws.rest(), _MAX_OPEN)
    if order.buffer <= 1:
        return merged
    return _shuffled(
        merged, buf, shuffle_draws.rest(), order.buffer, min(max(order.initial, 1), order.buffer)
    )


def replayed(
    sizes: Sequence[int], order: Order, *, skip: int, epoch: int, rank: int, worker: int, leg: int
) -> tuple[list[int], list[Pending]]:
    """Where :func:`worker_order` stands once it has given ``skip`` items, on numbers alone.

    Returns the items it has taken from each run (``taken[k]``: run ``k``'s first ones) and those
    of them its shuffle buffer still holds (:data:`Pending` pairs): the items given are the first
    ``taken[k]`` of each run ``k`` less the buffer's. The vectorized replay of :func:`resumed_order`
    (0.1 us an item), with no run opened: what an elastic resume needs of each worker of a leg.
    """
    if not order.shuffle:
        taken, left = [], skip
        for n in sizes:
            taken.append(min(n, left))
            left -= taken[-1]
        return taken, []
    m, reading, buf, _, _ = _replayed(sizes, order, skip=skip, epoch=epoch, rank=rank, worker=worker, leg=leg)
    # _replay counts the runs still open; those ended were read whole, those still pending not at all.
    ended = set(range(len(sizes))) - {k for k, _ in m.pending} - {k for k in m.reading if k is not None}
    return [sizes[k] if k in ended else n for k, n in enumerate(reading)], buf


def _replayed(
    sizes: Sequence[int], order: Order, *, skip: int, epoch: int, rank: int, worker: int, leg: int
) -> tuple[_Merge, list[int], list[Pending], _Draws, _Draws]:
    """:func:`_replay` from the worker's RNG, with both stages' draws left where the generators' would be."""
    size, initial = order.buffer, min(max(order.initial, 1), order.buffer)
    tail = None
    while True:
        rng = worker_rng(order.seed, epoch, rank, worker, leg)
        merge_draws, shuffle_draws = _Draws(rng), _Draws(rng)  # each draws its blocks as worker_order's do
        try:
            m, taken, buf = _replay(
                sizes, skip, merge_draws, shuffle_draws, size=size, initial=initial, tail=tail
            )
            return m, taken, buf, merge_draws, shuffle_draws
        except _TailTooShort:  # (odds under size * e**-64) again, every item kept
            tail = skip


class _Opened:
    """Run ``k`` from item ``j`` on, opened only when the merge first reads it."""

    def __init__(self, open_run: Callable[[int, int], Iterable[Any]], k: int, j: int) -> None:
        self.open_run, self.k, self.j = open_run, k, j

    def __iter__(self) -> Iterator[Any]:
        return iter(self.open_run(self.k, self.j))


class _Draws:
    """One stage's random numbers as :func:`_bits` gives them, its blocks drawn when it would draw them.

    :func:`_replay` takes them one at a time (:meth:`next`) or a block's worth at once
    (:meth:`ensure`, :meth:`take`), then hands the rest to the generators (:meth:`rest`).
    """

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.block = np.empty(0, dtype=np.uint64)
        self.at = 0

    def ensure(self) -> int:
        """Numbers left in the block, drawing the next block if none is (when :func:`_bits` would)."""
        if self.at == len(self.block):
            self.block, self.at = self.rng.integers(0, 1 << 32, _DRAWS, dtype=np.uint64), 0
        return len(self.block) - self.at

    def next(self) -> int:
        self.ensure()
        self.at += 1
        return int(self.block[self.at - 1])

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` numbers, all of this block (``n <= ensure()``)."""
        self.at += n
        return self.block[self.at - n : self.at]

    def rest(self) -> Iterator[int]:
        """What :func:`_bits` would give from here: this block's rest, then new blocks."""
        return chain(self.block[self.at :].tolist(), _bits(self.rng))


def _replay(
    sizes: Sequence[int],
    skip: int,
    merge_draws: _Draws,
    shuffle_draws: _Draws,
    *,
    size: int,
    initial: int,
    tail: int | None = None,
) -> tuple[_Merge, list[int], list[Pending]]:
    """:func:`interleave` then :func:`buffer_shuffle` up to their ``skip``-th item, on numbers alone.

    Returns the merge's state (its runs by number), the items taken from each run, and the buffer of
    ``(k, j)`` pairs; the draws are left where the generators' would be. An item is a number, its
    place in the runs one after another. The buffer's filling and draining are stepped as
    :func:`_shuffled` steps them; in between, the full buffer's steps (nearly all of them) are not:
    each takes one item in and gives one out, so it only overwrites the slot it gives, and the
    slots it gives are drawn from the shuffle's numbers alone. The buffer at ``skip`` is then each
    slot's last item written, found from the last steps' slots, with numpy; what remains a step is
    the merge's pick, from numbers drawn a block at a time. 0.1 us an item where the generators take
    0.6: a resume at the end of a 10M-sample epoch replays all of it (issue 37).
    tests/loader/epoch/test_order.py holds it to :func:`worker_order`, item by item.

    The items of the last ``tail`` full steps are kept (default: 64 buffers' worth, or 256 Ki): a
    slot not written in them (odds under ``size * e**-64``) raises :class:`_TailTooShort`.
    """
    starts = list(accumulate(sizes, initial=0))  # item j of run k is number starts[k] + j
    pending = [k for k in reversed(range(len(sizes))) if sizes[k]]  # runs not open yet, the next last
    reading: list[Any] = []  # by stream number: its run's number, None once it ended
    left: list[int] = []
    ends: list[int] = []  # by stream number: the number after its run's last item
    slots: list[int] = []

    def open_more() -> None:  # the merge opening runs as others end (it does at its next step)
        while pending and len(ends) - reading.count(None) < _MAX_OPEN:
            k = pending.pop()
            slots.extend([len(reading)] * sizes[k])
            reading.append(k)
            left.append(sizes[k])
            ends.append(starts[k + 1])

    def take() -> int | None:  # the merge's next item, as _merged takes it
        if not slots:
            return None
        j = (merge_draws.next() * len(slots)) >> 32
        n = slots[j]
        slots[j] = slots[-1]
        slots.pop()
        left[n] -= 1
        if not left[n]:
            reading[n] = None
            open_more()
        return ends[n] - left[n] - 1

    open_more()
    buf: list[int] = []
    given = 0
    full = size - 1  # what a full buffer holds between steps
    while given < skip and not (size <= 1 or len(buf) == full):  # the buffer fills, as _shuffled fills it
        item = take()
        if item is None:  # the merge is over: the buffer drains
            break
        buf.append(item)
        if len(buf) < size:
            item = take()
            if item is not None:
                buf.append(item)
        if len(buf) >= initial:
            i = (shuffle_draws.next() * len(buf)) >> 32
            buf[i], buf[-1] = buf[-1], buf[i]
            buf.pop()
            given += 1
    if size <= 1 or len(buf) == full:
        steps = min(skip - given, len(slots) + sum(sizes[k] for k in pending))  # till skip or the merge's end
        merge = _Merge(pending, reading, left, slots, 0)  # (its runs by number)
        _full_steps(
            steps, merge, ends, open_more, merge_draws, shuffle_draws if size > 1 else None, buf, tail
        )
        given += steps
    while given < skip and buf:  # the merge is over: the buffer drains
        i = (shuffle_draws.next() * len(buf)) >> 32
        buf[i], buf[-1] = buf[-1], buf[i]
        buf.pop()
        given += 1
    taken = [0] * len(sizes)
    for n, k in enumerate(reading):
        if k is not None:
            taken[k] = sizes[k] - left[n]
    now = len(ends) - reading.count(None)
    at = [(bisect_right(starts, item) - 1, item) for item in buf]
    return (
        _Merge([(k, sizes[k]) for k in pending], reading, left, slots, now),
        taken,
        [(k, item - starts[k]) for k, item in at],
    )


# The full steps whose items _full_steps keeps: the last 64 buffers' worth, at least 256 Ki. A slot
# is then left unwritten with odds (1 - 1/size)**(64 * size), under e**-64.
_KEPT_STEPS = 1 << 18
_KEPT_BUFFERS = 64


class _TailTooShort(Exception):
    """A slot of the buffer was last written before the steps whose items :func:`_full_steps` kept."""


def _full_steps(
    steps: int,
    merge: _Merge,
    ends: list[int],
    open_more: Callable[[], None],
    merge_draws: _Draws,
    shuffle_draws: _Draws | None,
    buf: list[int],
    tail: int | None,
) -> None:
    """``steps`` steps of the full buffer of ``buf`` (or of the merge alone: ``shuffle_draws`` None).

    A step is the merge's pick (a slot of ``merge.slots``, its stream's next item) then the shuffle's
    (a slot of the buffer, overwritten with that item). Both stages' numbers are taken a chunk at a
    time, a chunk ending where either block does, so each block is drawn when the generators would
    draw it (the merge's first, when both need one at the same step). The merge's picks are computed
    a chunk at a time (its slots fall by one a step, till a stream ends and another opens); the
    shuffle's only for the last ``tail`` steps, the buffer's slots then set to their last items.
    """
    slots = merge.slots
    full = len(buf)
    tail = max(_KEPT_STEPS, _KEPT_BUFFERS * (full + 1)) if tail is None else tail
    keep_from = steps - tail  # the steps whose items and buffer slots are kept
    kept: list[int] = []
    picks: list[np.ndarray] = []
    done = 0
    while done < steps:
        chunk = merge_draws.ensure()
        if shuffle_draws is not None:
            chunk = min(chunk, shuffle_draws.ensure())
        chunk = min(chunk, steps - done)
        bits = merge_draws.take(chunk)
        if shuffle_draws is not None:
            shuffled = shuffle_draws.take(chunk)
            if done + chunk > keep_from:
                picks.append((shuffled[max(keep_from - done, 0) :] * np.uint64(full + 1)) >> np.uint64(32))
        at = 0
        while at < chunk:
            # The merge's picks from here, its slots falling by one a step; stopped where a stream
            # ends and another opens (its slots then jump), or where the kept steps start.
            stop = chunk if done + at >= keep_from else min(chunk, keep_from - done)
            count = len(slots)
            falling = np.arange(count, count - (stop - at), -1, dtype=np.int64).clip(1).astype(np.uint64)
            keep = kept if done + at >= keep_from else None
            at += _merge_steps(
                ((bits[at:stop] * falling) >> np.uint64(32)).tolist(), merge, ends, keep, open_more
            )
        done += chunk
    if shuffle_draws is None or not steps:
        return
    # Each slot's last item: the last kept step that gave it (a step giving slot `full` gave its own).
    last = np.concatenate(picks)[::-1]
    found, first = np.unique(last, return_index=True)
    for slot, back in zip(found.tolist(), first.tolist(), strict=True):
        if slot < full:
            buf[slot] = kept[len(kept) - 1 - back]
    if keep_from > 0 and np.count_nonzero(found < full) < full:
        raise _TailTooShort


def _merge_steps(
    picks: list[int], merge: _Merge, ends: list[int], kept: list[int] | None, open_more: Callable[[], None]
) -> int:
    """The merge's steps at ``picks`` (slots of ``merge.slots``), till a stream's end opens another.

    Returns the steps taken. ``kept``: the items taken are appended to it.
    """
    slots, left, reading = merge.slots, merge.left, merge.reading
    pending = merge.pending
    for t, j in enumerate(picks):
        n = slots[j]
        slots[j] = slots[-1]
        slots.pop()
        left[n] -= 1
        if kept is not None:
            kept.append(ends[n] - left[n] - 1)
        if not left[n]:
            reading[n] = None
            if pending:
                open_more()
                return t + 1  # its slots jumped: the next picks are drawn on the new count
    return len(picks)
