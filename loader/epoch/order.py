"""A worker's sample order: its shard runs interleaved, then through a shuffle buffer.

:func:`worker_order` is the one definition of that order. The pass calls it on runs of raw samples
(:mod:`..pipeline.passes`), the elastic replay on runs of sample positions (:mod:`.elastic`), so what a resume
recomputes is what the read did. Each stage takes any iterables and a ``numpy`` Generator of its
own; the same inputs and RNG states give the same output order.

Both stages are built so that where they stand after any number of items is found without
stepping through the items before it, so a resume costs O(runs + buffer) and a small draw per
1,024 items, not a step per sample:

- the interleave picks its runs a block of :data:`_BLOCK` picks at a time, each block from its own
  slice of the interleave's stream (the generator advanced to ``block * _STRIDE``): how many of the
  block's picks go to each open run is one multivariate hypergeometric draw (what a uniformly random
  interleaving of them gives), their order a permutation of those picks. Where the interleave
  stands after ``n`` items is then one small draw a block, and its items are drawn only for the
  blocks asked for;
- the shuffle buffer draws one number an item it gives, the i-th item's being its stream's i-th
  (the generator advanced to it): the buffer's content at any point is each slot's last item
  written, found from the last steps' numbers with numpy.

:func:`resumed_order` is that order from a resume point on (issue 49: a worker of a 100 M-sample
epoch resumes at its end in about a second, where a replay of every position took minutes);
:func:`replayed` tells what a worker delivered, for an elastic resume.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any, TypeVar

import numpy as np

from .seeds import worker_rng, worker_rngs

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

_MAX_OPEN = 32  # runs interleave keeps open at a time
_BLOCK = 4096  # the interleave's picks drawn at once
_STRIDE = 1 << 32  # numbers of the interleave's stream set aside for each block (it takes a few thousand)
_DRAWS = 4096  # the shuffle's numbers drawn at once


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
    leg)``, a stream a stage. The items may be samples (the read) or positions (the elastic replay):
    the order is the same, item for item.
    """
    if not order.shuffle:
        return (item for run in runs for item in run)
    merge_rng, shuffle_rng = worker_rngs(order.seed, epoch, rank, worker, leg)
    return buffer_shuffle(
        interleave(runs, sizes, merge_rng), shuffle_rng, size=order.buffer, initial=order.initial
    )


def interleave(
    streams: Sequence[Iterable[T]],
    sizes: Sequence[int],
    rng: np.random.Generator,
    *,
    max_open: int = _MAX_OPEN,
) -> Iterator[T]:
    """Merge ``streams`` in random order, each next item from a stream with odds by what it has left.

    The streams are taken ``max_open`` at a time, in the given order, the next joining as one ends
    (at the next block of picks); among those open the interleaving is uniformly random, so a
    worker whose samples come from several shards mixes them from its first batch even when each
    shard holds one class. ``sizes`` are the planned lengths: the picks follow them, and a stream
    that ends early (a truncated shard) just drops out.

    A stream is opened when first picked and closed (a generator's ``close()``) once it has given
    its ``size`` items, so a run of a shard holds its file only while it is read (issue 37).
    """
    picks = _Picks(sizes, rng, max_open)
    return _merged(lambda k: streams[k], picks, picks.start(), list(sizes))


class _Picks:
    """The interleave's picks of runs of ``sizes``, block by block, each a pure function of its number."""

    def __init__(self, sizes: Sequence[int], rng: np.random.Generator, max_open: int) -> None:
        self.sizes, self.max_open = np.asarray(sizes, dtype=np.int64), max_open
        self.bit_generator = _advancing(rng)
        self.base = self.bit_generator.state  # the stream's start: block b draws from b * _STRIDE on

    def start(self) -> _MergeAt:
        """Where a fresh interleave stands: no pick made, the first runs open."""
        at = _MergeAt(left=self.sizes.copy(), open=[], next_run=0, block=0)
        self._open_more(at)
        return at

    def next_block(self, at: _MergeAt, *, order: bool = True) -> np.ndarray | None:
        """Block ``at.block``'s picks (run numbers; None after the last), ``at`` moved past them.

        ``order=False``: only how many each run got matters (their order is not drawn: an empty array).
        """
        if not at.open:
            return None
        self.bit_generator.state = self.base
        self.bit_generator.advance(at.block * _STRIDE)
        rng = np.random.Generator(self.bit_generator)
        runs = np.asarray(at.open, dtype=np.int64)
        have = at.left[runs]
        n = min(_BLOCK, int(have.sum()))
        counts = rng.multivariate_hypergeometric(have, n) if len(runs) > 1 else np.array([n])
        picks = rng.permutation(np.repeat(runs, counts)) if order else np.empty(0, dtype=np.int64)
        at.left[runs] -= counts
        at.open = [int(k) for k in runs[at.left[runs] > 0]]
        at.block += 1
        self._open_more(at)
        return picks

    def _open_more(self, at: _MergeAt) -> None:
        sizes = self.sizes
        while at.next_run < len(sizes) and len(at.open) < self.max_open:
            if sizes[at.next_run] > 0:
                at.open.append(at.next_run)
            at.next_run += 1


@dataclass
class _MergeAt:
    """Where the interleave stands at a block's start: what each run has left, the runs open."""

    left: np.ndarray  # by run: its items not yet picked
    open: list[int]  # the runs open, in the order they opened
    next_run: int  # the next run to open
    block: int  # the next block of picks


_END = object()


def _merged(
    open_stream: Callable[[int], Iterable[T]],
    picks: _Picks,
    at: _MergeAt,
    left: list[int],
    first: np.ndarray | None = None,
) -> Iterator[T]:
    """The interleave's items from ``at`` on: ``first`` (the rest of a block), then block after block.

    ``left[k]``: what run ``k`` is still to give; ``open_stream(k)`` gives them, opened on its first pick.
    """
    reading: dict[int, Iterator[Any] | None] = {}  # by run: its iterator, None once it ended
    block = first if first is not None else picks.next_block(at)
    while block is not None:
        for k in block.tolist():
            if k in reading:
                it = reading[k]
                if it is None:  # it ended early: its picks are void
                    continue
            else:
                it = reading[k] = iter(open_stream(k))
            item = next(it, _END)
            left[k] -= 1
            if item is _END or not left[k]:
                reading[k] = None
                _close(it)
            if item is not _END:
                yield item  # type: ignore[misc]  # not _END: one of the stream's items
        block = picks.next_block(at)


def _close(it: Iterator[object]) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


def _bits(rng: np.random.Generator, at: int = 0) -> Iterator[int]:
    """The stream's 32-bit numbers from its ``at``-th on; ``(next(bits) * n) >> 32`` is uniform in ``0..n-1``.

    The top half of each 64-bit output of the generator (number ``i`` is output ``i``, so the
    generator advanced by ``at`` gives number ``at``), drawn in blocks. The mapping is Lemire's:
    exact integer arithmetic, always below ``n``, off uniform by at most ``n / 2**32``.
    """
    bit_generator = _advancing(rng)
    if at:
        bit_generator.advance(at)
    return chain.from_iterable(
        iter(lambda: (bit_generator.random_raw(_DRAWS) >> np.uint64(32)).tolist(), None)
    )


def _advancing(rng: np.random.Generator) -> np.random.PCG64:
    """``rng``'s bit generator, one that can jump ahead (``default_rng``'s PCG64)."""
    bit_generator = rng.bit_generator
    assert isinstance(bit_generator, np.random.PCG64)
    return bit_generator


def _numbers(base: Mapping[str, Any], rng: np.random.Generator, start: int, count: int) -> np.ndarray:
    """Numbers ``[start, start + count)`` of the stream :func:`_bits` gives, as an array."""
    bit_generator = _advancing(rng)
    bit_generator.state = base  # type: ignore[assignment]  # a state this generator gave
    bit_generator.advance(start)
    return bit_generator.random_raw(count) >> np.uint64(32)


def buffer_shuffle(items: Iterable[T], rng: np.random.Generator, *, size: int, initial: int) -> Iterator[T]:
    """Shuffle a stream through a buffer of ``size`` items, starting once ``initial`` are in.

    Like webdataset's ``shuffle(bufsize, initial)``: while the buffer is below ``size`` it takes two
    items for each it gives, so it yields early (fast start) and still fills up. ``size <= 1`` keeps
    the order. The item given i-th is picked with the i-th number of ``rng``'s stream.
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

    ``open_run(k, j)`` gives run ``k`` (``sizes[k]`` items, exactly) from its item ``j`` on. Where
    both stages stand at ``skip`` is found on numbers alone (:func:`_replay`); then each run still
    to be read opens where the replay left it, and the items the shuffle buffer holds at ``skip``
    come out as :data:`Pending` pairs, each in its place in the order, for the caller to read one by one.
    """
    if not order.shuffle:
        k, j = 0, skip
        while k < len(sizes) and j >= sizes[k]:
            j -= sizes[k]
            k += 1
        return (item for r in range(k, len(sizes)) for item in open_run(r, j if r == k else 0))
    state = _replay(sizes, order, skip, *worker_rngs(order.seed, epoch, rank, worker, leg))
    taken = state.taken
    left = [n - int(t) for n, t in zip(sizes, taken.tolist(), strict=True)]
    merged = _merged(lambda k: open_run(k, int(taken[k])), state.picks, state.at, left, state.rest)
    if order.buffer <= 1:
        return merged
    bits = _bits(worker_rngs(order.seed, epoch, rank, worker, leg)[1], skip)  # from the next item's number on
    return _shuffled(merged, state.buffer, bits, order.buffer, min(max(order.initial, 1), order.buffer))


def replayed(
    sizes: Sequence[int], order: Order, *, skip: int, epoch: int, rank: int, worker: int, leg: int
) -> tuple[list[int], list[Pending]]:
    """Where :func:`worker_order` stands once it has given ``skip`` items, on numbers alone.

    Returns the items it has taken from each run (``taken[k]``: run ``k``'s first ones) and those
    of them its shuffle buffer still holds (:data:`Pending` pairs): the items given are the first
    ``taken[k]`` of each run ``k`` less the buffer's. What an elastic resume needs of each worker
    of a leg; O(runs + buffer + ``skip`` / 1,024).
    """
    if not order.shuffle:
        taken, left = [], skip
        for n in sizes:
            taken.append(min(n, left))
            left -= taken[-1]
        return taken, []
    merge_rng, shuffle_rng = worker_rngs(order.seed, epoch, rank, worker, leg)
    state = _replay(sizes, order, skip, merge_rng, shuffle_rng)
    return state.taken.tolist(), list(state.buffer)


@dataclass
class _Replayed:
    """Where both stages stand after the items given.

    The interleave at block ``at``, with ``rest`` of the block before it still to come; each run's
    items taken; the buffer's items.
    """

    picks: _Picks
    at: _MergeAt
    rest: np.ndarray | None
    taken: np.ndarray
    buffer: list[Any]


# The full-buffer steps whose picks _replay looks at first: the last 64 buffers' worth, at least
# 256 Ki. A slot is then left unwritten with odds (1 - 1/size)**(64 * size), under e**-64 (then all).
_KEPT_STEPS = 1 << 18
_KEPT_BUFFERS = 64


def _replay(
    sizes: Sequence[int],
    order: Order,
    skip: int,
    merge_rng: np.random.Generator,
    shuffle_rng: np.random.Generator,
) -> _Replayed:
    """The stages of :func:`worker_order` after its ``skip``-th item, on numbers alone.

    The buffer's filling and draining are stepped as :func:`_shuffled` steps them, on the
    interleave's items (run and place, :class:`_Items`); in between, a full buffer's step takes one
    item in and gives one out, so it only overwrites the slot it gives, drawn from the shuffle's
    numbers alone: the buffer at ``skip`` is each slot's last item written, found with numpy from
    the last steps' numbers and the interleave's items at those steps.
    """
    size, initial = order.buffer, min(max(order.initial, 1), order.buffer)
    shuffle_base = shuffle_rng.bit_generator.state
    items = _Items(_Picks(sizes, merge_rng, _MAX_OPEN))
    total = int(np.sum(sizes, dtype=np.int64))
    if size <= 1:
        return items.at(min(skip, total), [])
    buf: list[Any] = []
    given = taken = 0
    draws = _numbers(shuffle_base, shuffle_rng, 0, min(skip, 2 * size + 2))  # the filling's, at most
    full = size - 1  # what a full buffer holds between steps

    def take() -> Any:
        nonlocal taken
        if taken >= total:
            return None
        taken += 1
        return items.one(taken - 1)

    while given < skip and len(buf) != full:  # the buffer fills, as _shuffled fills it
        item = take()
        if item is None:  # the merge is over: the buffer drains
            break
        buf.append(item)
        if len(buf) < size:
            item = take()
            if item is not None:
                buf.append(item)
        if len(buf) >= initial:
            i = (int(draws[given]) * len(buf)) >> 32
            buf[i], buf[-1] = buf[-1], buf[i]
            buf.pop()
            given += 1
    if len(buf) == full:
        steps = min(skip - given, total - taken)  # till skip or the merge's end
        if steps:
            _full_steps(buf, items, taken, given, steps, shuffle_base, shuffle_rng)
            taken += steps
            given += steps
    if given < skip and buf:  # the merge is over: the buffer drains
        drain = _numbers(shuffle_base, shuffle_rng, given, min(skip - given, len(buf)))
        for number in drain.tolist():
            i = (number * len(buf)) >> 32
            buf[i], buf[-1] = buf[-1], buf[i]
            buf.pop()
    return items.at(taken, buf)


def _full_steps(
    buf: list[Any],
    items: _Items,
    taken: int,
    given: int,
    steps: int,
    base: Mapping[str, Any],
    rng: np.random.Generator,
) -> None:
    """``steps`` steps of the full buffer ``buf`` from item ``taken`` in and item ``given`` out.

    Each slot of the buffer ends holding the item of the last step that picked it (a step picking
    the last slot gives its own item). The last steps are looked at first; where some slot was not
    picked in them (odds under ``size * e**-64``), all of them.
    """
    full = len(buf)
    tail = min(steps, max(_KEPT_STEPS, _KEPT_BUFFERS * (full + 1)))
    while True:
        first = steps - tail  # the steps looked at: [first, steps)
        slots = (_numbers(base, rng, given + first, tail) * np.uint64(full + 1)) >> np.uint64(32)
        last = slots[::-1]
        found, back = np.unique(last, return_index=True)
        written = found < full
        if first == 0 or np.count_nonzero(written) == full:
            break
        tail = steps
    step = tail - 1 - back[written]  # by slot, the step (from `first`) that wrote it last
    places = taken + first + step
    order = np.argsort(places)
    written_items = items.many(places[order])
    for slot, item in zip(found[written][order].tolist(), written_items.tolist(), strict=True):
        buf[slot] = (item[0], item[1])


class _Items:
    """The interleave's items by their place in its output, as ``(run, item of the run)`` pairs.

    Walks the interleave's blocks forward (back to the start when asked for an earlier place),
    drawing only how many picks each run gets in a block, and their order only in the blocks
    holding a place asked for.
    """

    def __init__(self, picks: _Picks) -> None:
        self.picks = picks
        self._start()

    def _start(self) -> None:
        self._next = self.picks.start()  # at the start of the block after the current one
        self._first = 0  # the place of the current block's first pick
        self._picks: np.ndarray | None = None  # the current block's picks (None: none drawn yet)
        self._before = self._next.left.copy()  # by run: items left at the current block's start
        self._rank: np.ndarray | None = None

    def one(self, place: int) -> Pending:
        """The item at ``place``."""
        run, j = self.many(np.array([place], dtype=np.int64))[0].tolist()
        return run, j

    def many(self, places: np.ndarray) -> np.ndarray:
        """The items at ``places`` (increasing), as rows ``(run, j)``."""
        out = np.empty((len(places), 2), dtype=np.int64)
        i = 0
        while i < len(places):
            picks = self._reach(int(places[i]))
            stop = int(np.searchsorted(places, self._first + len(picks), side="left"))
            offsets = places[i:stop] - self._first
            if self._rank is None:
                self._rank = _rank_in_block(picks)
            runs = picks[offsets]
            out[i:stop, 0] = runs
            out[i:stop, 1] = self.picks.sizes[runs] - self._before[runs] + self._rank[offsets]
            i = stop
        return out

    def at(self, place: int, buffer: list[Any]) -> _Replayed:
        """Both stages' state with ``place`` items taken from the interleave."""
        sizes = self.picks.sizes
        if place == 0:
            return _Replayed(self.picks, self.picks.start(), None, np.zeros(len(sizes), np.int64), buffer)
        picks = self._reach(place - 1)
        done = place - self._first  # of the current block's picks
        taken = sizes - self._before + np.bincount(picks[:done], minlength=len(sizes))
        rest = picks[done:] if done < len(picks) else None
        return _Replayed(self.picks, self._next, rest, taken, buffer)

    def _reach(self, place: int) -> np.ndarray:
        """The picks of the block holding pick ``place``, made the current one."""
        if place < self._first:
            self._start()
        while self._picks is None or place >= self._first + len(self._picks):
            if self._picks is not None:
                self._first += len(self._picks)
                self._picks, self._rank = None, None
            at = self._next
            before = at.left.copy()
            again = _MergeAt(before.copy(), list(at.open), at.next_run, at.block)
            if self.picks.next_block(at, order=False) is None:
                raise IndexError(f"item {place} of an interleave of {self._first}")
            n = int((before - at.left).sum())
            self._before = before
            if place < self._first + n:  # the block holding it: its picks' order too
                picks = self.picks.next_block(again)
                assert picks is not None
                self._next, self._picks = again, picks
            else:
                self._first += n
        return self._picks


def _rank_in_block(picks: np.ndarray) -> np.ndarray:
    """For each pick, how many picks of the same run come before it in the block."""
    order = np.argsort(picks, kind="stable")
    ranked = picks[order]
    starts = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
    within = np.arange(len(picks)) - np.repeat(starts, np.diff(np.r_[starts, len(picks)]))
    out = np.empty(len(picks), dtype=np.int64)
    out[order] = within
    return out
