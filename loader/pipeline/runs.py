"""The raw-sample stages of one worker's pass, each a generator or a plain function.

:mod:`.passes` wires them, then the decode and batch stages of :mod:`imgshards.loader.stages`::

    elastic.plan (partition.worker_plan) -> RunReader.runs -> order.worker_order (interleave ->
        buffer_shuffle) -> batched (make up lost samples) -> stages (decode -> transform -> collate)

Each run is read by the split's :class:`~.splitreader.SplitReader` (the one reader of every
dataset: the shard opened and checked, a seek by the table of starts and the key there); here, how a
pass reads the file it opens (:class:`MappedShard`, or small reads) and what a run that ends short
costs. A resumed pass reads through :class:`Resumed`: the order up to the resume point replayed on
numbers alone, then only the samples still to come read. :func:`read_runs` (the runs of whole
segments) serves :func:`read_elsewhere` and callers outside a pass. Everything here handles raw
bytes, so shuffling and resume skipping never decode. The per-batch
augmentation seed (:func:`augment_seed`, :func:`seeded`) is shared by the workers and the device path.
"""

from __future__ import annotations

import contextlib
import functools
import io
import mmap
import os
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import BinaryIO, TypeVar, cast

import numpy as np
import torch

from ..epoch.order import Pending
from ..epoch.partition import Segment
from ..epoch.seeds import augment_seed
from ..errors import CorruptImageError, ResourceLimitError, ShardAccessError, ShardReadError
from ..state.cursor import LOST, Counters
from .splitreader import SplitReader
from .tar import RawSample

__all__ = [
    "Resumed",
    "RunReader",
    "augment_seed",
    "batched",
    "read_elsewhere",
    "read_runs",
    "seeded",
]

T = TypeVar("T")

# Read buffer of a shard file in a pass. A pass reads a run of samples, often from the middle of a
# shard (the partition deals blocks of shards to every worker), stepping over the headers of the
# samples before it: with a 1 MiB buffer each step refills the buffer, copying the skipped images
# from the page cache (about 300 KB an image delivered, in a 2-worker pass's first batches). With 8 KiB
# a step reads little more than the next header, and an image member, larger than the buffer, is
# read straight into its bytes: 20-70 us an image less CPU here (docs/loader-pass.md).
_SHARD_BUFFER = 8192
# A local shard is read through a memory map instead (MappedShard) when no user stage sees the
# samples. Reads shorter than _COPY_BELOW are copied out of the map as bytes (tar headers, labels, a
# short .json), longer ones (images) are views of it. A map holds a file descriptor until its last
# view is gone; shards of _MAP_AT_LEAST bytes or more bound how many a shuffle buffer keeps alive
# (its bytes / 1 MiB: about 200 for 2,000 images of 100 KB), so shards below it are read.
_COPY_BELOW = 1024
_MAP_AT_LEAST = 1 << 20
# A map lives on after its run ends while a shuffle buffer holds views of it, and each holds a file
# descriptor: at 10M samples a worker went from 32 to 95 maps in a minute (issue 37), and a whole
# epoch's shards once every finished run stayed referenced. At most _MAX_MAPS maps live in a
# process; a shard opened past that is read (images copied out), so a worker holds at most
# interleave's 32 open runs plus _MAX_MAPS descriptors of shards, whatever the split's size.
_MAX_MAPS = 32
# Pages of a map more than _KEEP_BEHIND bytes behind its reader are handed back to the page cache
# (MADV_DONTNEED) every _DROP_EVERY bytes read, and all of them once its run ends: a view still held
# faults its pages back in from the cache. Without it every page a worker read stayed in its
# resident set for the whole pass (file-backed memory 86 -> 746 MB in a minute, issue 37). A shuffle
# buffer's views reach about its bytes behind the reader (2,000 images of 100 KB: 200 MB), so 32 MiB
# behind made them fault again: 2-3% more CPU an image on ImageNet-like shards (bench/loader.py
# --against 1bc048c). So a shard of the default 256 MB keeps its pages until its run ends, and only
# a shard of more than 1 GiB gives them back as it goes.
_KEEP_BEHIND = 1 << 30
_DROP_EVERY = 256 << 20
_maps: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()  # the process's live maps of shards


def read_runs(
    segments: Sequence[Segment],
    reader: SplitReader,
    *,
    on_truncated: Callable[[str], None],
    on_unreadable: Callable[[ShardReadError], None] | None,
    on_corrupt: Callable[[CorruptImageError], None] | None = None,
    counters: Counters | None = None,
    keep_all: bool = False,
    views: bool = False,
) -> list[Iterator[RawSample]]:
    """One lazy run of raw samples per segment of ``reader``'s split, in the given order.

    A segment's ``skip`` samples are read past, never yielded. A shard that cannot be read ends its
    run and is reported to ``on_unreadable``; with ``on_unreadable=None`` the
    :class:`ShardReadError` propagates. A :class:`ShardAccessError` (no credentials, no access, a
    listed shard not found, a shard changed during the pass, out of file descriptors or memory)
    always propagates: only damage is skipped. A run that ends short of its segment (damaged shard)
    adds the samples it lacks to ``counters``' :data:`~..state.cursor.LOST` (without ``counters``:
    not counted). Labels are read as the split says (``.cls``, or a ``.json`` field); one that is
    not one of the split's classes goes to ``on_corrupt`` (raises with None). ``keep_all`` reads
    every member of a sample (else a ``.json`` that holds no label is skipped).
    """
    return RunReader(
        segments,
        reader,
        on_truncated=on_truncated,
        on_unreadable=on_unreadable,
        on_corrupt=on_corrupt,
        counters=counters,
        keep_all=keep_all,
        views=views,
    ).runs()


class RunReader:
    """How the runs of one pass are read (see :func:`read_runs`): the split's reader, what to tell.

    Each run is :meth:`.splitreader.SplitReader.run`: the one reader of every dataset (its shard
    opened and checked, its seek and the key there); here, how a pass reads the shard it opens (a
    local one mapped, or in small pieces) and what it counts.
    """

    def __init__(
        self,
        segments: Sequence[Segment],
        reader: SplitReader,
        *,
        on_truncated: Callable[[str], None],
        on_unreadable: Callable[[ShardReadError], None] | None,
        on_corrupt: Callable[[CorruptImageError], None] | None,
        counters: Counters | None,
        keep_all: bool,
        views: bool,
    ) -> None:
        self.segments, self.reader = segments, reader
        self.on_truncated, self.on_unreadable, self.on_corrupt = on_truncated, on_unreadable, on_corrupt
        self.counters, self.keep_all, self.views = counters, keep_all, views
        shards = reader.split.shards
        reader.source.set_read_order([shards[seg.shard] for seg in segments])  # prefetch in this order

    def runs(self) -> list[Iterator[RawSample]]:
        """One lazy run a segment, in the given order."""
        return [self.run(seg) for seg in self.segments]

    def run(self, seg: Segment, start: int | None = None, *, one: bool = False) -> Iterator[RawSample]:
        """Samples ``[start, seg.stop)`` of ``seg`` (from ``seg.start``), less its ``skip``.

        ``one``: ``seg`` is one sample, read alone (copied, not mapped: the shard is not read on).
        """
        start = seg.start if start is None else start
        run = self.reader.run(
            seg.shard,
            start,
            seg.stop,
            file=functools.partial(_for_run, views=self.views and not one, one=one),
            on_truncated=self.on_truncated,
            on_corrupt=self.on_corrupt,
            keep_all=self.keep_all,
        )
        expected = seg.stop - start
        if seg.skip:
            run = _skipping(run, seg.skip, start)
            expected -= sum(1 for i in seg.skip if start <= i < seg.stop)
        return _accounted(run, expected, self.counters, self.on_unreadable)


class Resumed:
    """The runs of a pass resumed after ``skip`` samples, which reads no byte of those it skips.

    The worker's order up to the resume point is replayed on numbers alone
    (:func:`~..epoch.order.resumed_order`, the very order of :func:`~..epoch.order.worker_order`),
    then each run still to be read opens its shard at its next sample (the table of starts: a
    seek, checked by the key there), and the samples that were in the shuffle buffer at that point come as
    :data:`~..epoch.order.Pending` pairs, read one by one at their offsets (:meth:`samples`). So a
    resume at the end of an epoch reads the samples left in it, not the epoch (issue 37), and the
    batches are those of the pass it resumes.

    Damage in the skipped part: the pass being resumed drew its order from the runs as they were
    read, and a damaged shard's run ended early, while the replay's runs have their planned
    lengths; the samples that pass delivered are then not exactly those skipped here, so some
    come twice or never in that epoch (every sample still comes at most once after the resume,
    and the batch count holds). Damage met after the resume is counted as in any pass.
    """

    def __init__(self, runs: RunReader) -> None:
        self._runs = runs

    def open_run(self, k: int, j: int) -> Iterator[RawSample]:
        """Segment ``k``'s run from its item ``j`` on (its samples but those it skips, in order)."""
        seg = self._runs.segments[k]
        return self._runs.run(seg, _index(seg, j))

    def samples(self, ordered: Iterator[RawSample | Pending]) -> Iterator[RawSample]:
        """``ordered`` (a :func:`~..epoch.order.resumed_order`), its pending items read one by one."""
        segments = self._runs.segments
        unreadable: set[int] = set()  # shards whose sample left here could not be read: not tried again
        for item in ordered:
            if type(item) is tuple:  # in the shuffle buffer at the resume point: read it alone
                k, j = item
                seg = segments[k]
                if seg.shard in unreadable:
                    if self._runs.counters is not None:
                        self._runs.counters.add(LOST, 1)  # as its run would count it
                    continue
                i = _index(seg, j)
                got = False
                for sample in self._runs.run(Segment(seg.shard, i, i + 1), one=True):
                    got = True
                    yield sample
                if not got:  # damaged (a lost sample, counted) or unreadable (warned about once)
                    unreadable.add(seg.shard)
            else:
                yield item  # type: ignore[misc]


def _index(seg: Segment, j: int) -> int:
    """The shard index of item ``j`` of ``seg``'s run (its samples but those it skips); ``stop`` past them."""
    if not seg.skip:
        return seg.start + j
    for i in range(seg.start, seg.stop):
        if i not in seg.skip:
            if not j:
                return i
            j -= 1
    return seg.stop


def _for_run(f: BinaryIO, *, views: bool, one: bool = False) -> BinaryIO:
    """How a run reads shard file ``f``; ``one``: for one sample (a resume's), read in small pieces."""
    if isinstance(f, io.BufferedReader) and isinstance(f.raw, io.FileIO):  # a local regular file
        if views:
            mapped = MappedShard.of(f)
            if mapped is not None:
                return cast(BinaryIO, mapped)
        return io.BufferedReader(f.detach(), buffer_size=_SHARD_BUFFER)
    if one and isinstance(f, io.BufferedReader):
        # A remote shard's reader refills its 1 MiB buffer to the full: to the shard's end,
        # for the one sample a resume reads here (its ranged reader still reads whole chunks).
        return io.BufferedReader(f.detach(), buffer_size=_SHARD_BUFFER)
    return f


class MappedShard:
    """A local shard read through a read-only memory map: its images are views of the page cache.

    ``read`` of a tar header or a small member (a label) returns ``bytes``; a larger member (an
    image) returns a ``memoryview`` of the map, so reading it copies nothing and a worker's shuffle
    buffer of encoded images takes no memory of its own (with ``bytes``, each image read while the
    buffer fills is a copy into freshly faulted memory: 50-90 us for 100 KB, against 12 us into
    reused memory; docs/loader-pass.md). The map lives as long as a view of it does, and holds a
    file descriptor meanwhile: :meth:`of` maps no more than ``_MAX_MAPS`` shards in a process.
    Pages well behind the reader, and all of them once it is closed, are given back to the page
    cache (views of them fault them in again). Reading past the file's end as mapped returns what
    there is, as ``read`` does; a file cut shorter *while* mapped faults the reading process
    (SIGBUS): shards are written once and renamed into place.
    """

    __slots__ = ("_dropped", "_map", "_pos", "_size", "_view")

    def __init__(self, mapped: mmap.mmap) -> None:
        self._map, self._view = mapped, memoryview(mapped)
        self._pos, self._size, self._dropped = 0, len(mapped), 0

    @classmethod
    def of(cls, f: io.BufferedReader) -> MappedShard | None:
        """``f`` mapped and closed (the map holds its own descriptor); None, ``f`` left open, if not.

        Not mapped: a small file, a file system that does not map, or ``_MAX_MAPS`` maps alive in
        this process already. Out of descriptors or memory is a :class:`ResourceLimitError`.
        """
        try:
            if len(_maps) >= _MAX_MAPS or os.fstat(f.fileno()).st_size < _MAP_AT_LEAST:
                return None
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:  # a file system that does not map
            out = ResourceLimitError.of(e, path=f.name, shard=os.path.basename(f.name))
            if out is not None:
                raise out from e
            return None
        if hasattr(mmap, "MADV_SEQUENTIAL"):
            mapped.madvise(mmap.MADV_SEQUENTIAL)  # runs are read in order: read ahead as read() would
        _maps.add(mapped)
        f.close()
        return cls(mapped)

    def read(self, n: int = -1) -> bytes | memoryview:
        start = self._pos
        stop = self._size if n < 0 else min(self._size, start + n)
        self._pos = max(start, stop)
        if stop - self._dropped > _DROP_EVERY:
            self._drop(stop - _KEEP_BEHIND)
        if stop - start < _COPY_BELOW:
            return self._map[start:stop]
        return self._view[start:stop]

    def _drop(self, stop: int) -> None:
        """Give the map's pages from ``_dropped`` up to ``stop`` back to the page cache."""
        start = self._dropped - self._dropped % mmap.PAGESIZE
        stop -= stop % mmap.PAGESIZE
        if stop > start and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, start, stop - start)
        self._dropped = max(self._dropped, stop)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = (0, self._pos, self._size)[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if self._map is not None:
            self._dropped = 0
            self._drop(self._size)  # all of it: the views left fault back in what they use
        self._view = self._map = None  # type: ignore[assignment]  # freed with the last view of it

    def __enter__(self) -> MappedShard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_elsewhere(
    order: Sequence[int] | np.ndarray,
    after: int | None,
    reader: SplitReader,
    *,
    limit: int,
    what: str,
) -> Iterator[RawSample]:
    """Up to ``limit`` samples of whole shards, in ``order`` from the shard after ``after`` on.

    What a worker that lost all its own samples repeats (the same on every run), with a warning.
    Damaged shards and samples are passed over quietly: each was warned about when its own reader
    met it. With none readable anywhere no rank can make a batch, and each raises
    :class:`ShardReadError` saying so (``what`` names the split and where it is).
    """
    at = int(np.flatnonzero(np.asarray(order) == after)[0]) + 1 if after is not None else 0
    shards = reader.split.shards
    segments = [Segment(int(s), 0, shards[s].samples) for s in np.roll(np.asarray(order), -at)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = read_runs(segments, reader, on_truncated=_ignore, on_unreadable=_ignore, on_corrupt=_ignore)
        found = list(islice((s for run in runs for s in run), limit))
    if not found:
        raise ShardReadError(
            f"no shard of {what} holds a readable sample; re-pack or re-download the shards "
            "(imgshards verify names the damaged ones)"
        )
    warnings.warn(
        f"a worker lost every sample of its plan to damaged shards; its batches repeat {len(found)} "
        "sample(s) of other shards, so the rank keeps len() batches",
        RuntimeWarning,
        stacklevel=2,
    )
    return iter(found)


def _ignore(_: object) -> None:
    pass


def _skipping(run: Iterator[RawSample], skip: frozenset[int], start: int) -> Iterator[RawSample]:
    return (s for i, s in enumerate(run, start) if i not in skip)


def _accounted(
    run: Iterator[RawSample],
    expected: int,
    counters: Counters | None,
    on_unreadable: Callable[[ShardReadError], None] | None,
) -> Iterator[RawSample]:
    """``run``'s samples; a shard that cannot be read ends it (raised with no ``on_unreadable``).

    What the run lacks of its ``expected`` samples once it ends is added to ``counters``'
    :data:`~..state.cursor.LOST` (the one place a lost sample is counted). A
    :class:`ShardAccessError` (a setting to fix, not damage to count) always propagates.
    """
    got = 0
    try:
        for sample in run:
            got += 1
            yield sample
    except ShardAccessError:
        raise
    except ShardReadError as e:
        if on_unreadable is None:
            raise
        on_unreadable(e)
    if got < expected and counters is not None:
        counters.add(LOST, expected - got)


def batched(
    raw: Iterator[RawSample],
    *,
    sizes: Sequence[int],
    first: int = 0,
    make_up: Callable[[], Iterator[RawSample]] | None,
) -> Iterator[tuple[int, list[RawSample]]]:
    """Cut ``raw`` into this worker's batches ``(k, samples)`` of ``sizes[k]``, from batch ``first`` on.

    ``raw`` starts at batch ``first``: the samples of the batches before it (delivered before a
    resume) are left out of it (:class:`Resumed`), never read. Samples that ``raw`` lacks (a
    truncated or unreadable shard) are made up by repeating the most recent ones (of this pass:
    after a resume, from its first batch on), so the batch count holds; a worker that has read
    nothing at all repeats the samples ``make_up()`` gives (samples from elsewhere in the split).
    With ``make_up=None`` (eval) nothing is made up: a batch holds what exists, and the batches end
    when nothing is left.
    """
    recent: deque[RawSample] = deque(maxlen=max(sizes, default=1))  # the latest samples read
    for k in range(first, len(sizes)):
        batch = list(islice(raw, sizes[k]))
        recent.extend(batch)
        if len(batch) < sizes[k]:
            if make_up is None:
                if not batch:
                    return
            else:
                if not recent:
                    recent.extend(islice(make_up(), recent.maxlen))
                batch += _make_up(recent, sizes[k] - len(batch))
        yield k, batch


def _make_up(recent: deque[RawSample], missing: int) -> list[RawSample]:
    pool = list(recent)
    assert pool, "make_up() found no sample"
    return [pool[i % len(pool)] for i in range(missing)]


@contextlib.contextmanager
def seeded(seed: int, *, restore: bool) -> Iterator[None]:
    """Seed torch's default CPU generator; in the main process, put its state back afterwards."""
    state = torch.get_rng_state() if restore else None
    torch.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        if state is not None:
            torch.set_rng_state(state)
