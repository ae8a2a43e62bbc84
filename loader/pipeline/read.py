"""The raw-sample stages of one worker's pass, each a generator or a plain function.

:mod:`.passes` wires them, then the decode and batch stages of :mod:`imgshards.loader.stages`::

    elastic.plan (partition.worker_plan) -> read_runs -> shuffle.worker_order (interleave -> buffer_shuffle)
        -> batched (skip delivered, make up lost samples) -> stages (decode -> transform -> collate)

Everything here handles raw bytes, so shuffling and resume skipping never decode. The per-batch
augmentation seed (:func:`augment_seed`, :func:`seeded`) is shared by the workers and the device path.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import BinaryIO, TypeVar, cast

import numpy as np
import torch

from imgshards.converter.locate import redact_url
from imgshards.converter.manifest import ShardInfo, SplitInfo

from ..epoch.partition import Segment
from ..epoch.seeds import augment_seed
from ..errors import CorruptImageError, ShardAccessError, ShardReadError
from ..remote import ShardSource
from .reader import RawSample, read_run

__all__ = [
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


def read_runs(
    segments: Sequence[Segment],
    split: SplitInfo,
    source: ShardSource,
    *,
    on_truncated: Callable[[str], None],
    on_unreadable: Callable[[ShardReadError], None] | None,
    classes: Sequence[str] | None = None,
    on_corrupt: Callable[[CorruptImageError], None] | None = None,
    on_lost: Callable[[int], None] = lambda n: None,
    keep_all: bool = False,
    views: bool = False,
) -> list[Iterator[RawSample]]:
    """One lazy run of raw samples per segment of ``split``, read from ``source`` in the given order.

    A segment's ``skip`` samples are read past, never yielded. A shard that cannot be read ends its
    run and is reported to ``on_unreadable``; with ``on_unreadable=None`` the
    :class:`ShardReadError` propagates. A :class:`ShardAccessError` (no credentials, no access, a
    listed shard not found, a shard changed during the pass) always propagates: only damage is
    skipped. A run that ends short of its segment (damaged shard) tells ``on_lost`` how many of its
    samples it lacks. Labels are read as the split says (``.cls``, or a ``.json`` field); one that
    is not one of ``classes`` goes to ``on_corrupt`` (raises with None).
    ``keep_all`` reads every member of a sample (else a ``.json`` that holds no label is skipped).
    """
    shards = split.shards
    class_to_idx = {name: i for i, name in enumerate(classes)} if classes is not None else None
    source.plan([shards[seg.shard] for seg in segments])  # prefetch in this order
    runs = []
    for seg in segments:
        shard = shards[seg.shard]
        run = read_run(
            redact_url(source.url(shard.name)),
            seg.start,
            seg.stop,
            on_truncated=on_truncated,
            opener=_opener(source, shard, views=views),
            num_classes=len(classes) if classes is not None else None,
            on_corrupt=on_corrupt,
            labels=split.labels,
            class_to_idx=class_to_idx,
            keep_all=keep_all,
            offset=shard.sample_offset(seg.start) if seg.start else None,  # a seek, not a walk
        )
        if seg.skip:
            run = _skipping(run, seg)
        runs.append(_accounted(run, len(seg), on_lost, on_unreadable))
    return runs


def _opener(source: ShardSource, shard: ShardInfo, *, views: bool) -> Callable[[], BinaryIO]:
    def open_shard() -> BinaryIO:
        f = source.open(shard)
        if isinstance(f, io.BufferedReader) and isinstance(f.raw, io.FileIO):  # a local regular file
            if views:
                mapped = MappedShard.of(f)
                if mapped is not None:
                    return cast(BinaryIO, mapped)
            return io.BufferedReader(f.detach(), buffer_size=_SHARD_BUFFER)
        return f

    return open_shard


class MappedShard:
    """A local shard read through a read-only memory map: its images are views of the page cache.

    ``read`` of a tar header or a small member (a label) returns ``bytes``; a larger member (an
    image) returns a ``memoryview`` of the map, so reading it copies nothing and a worker's shuffle
    buffer of encoded images takes no memory of its own (with ``bytes``, each image read while the
    buffer fills is a copy into freshly faulted memory: 50-90 us for 100 KB, against 12 us into
    reused memory; docs/loader-pass.md). The map lives as long as a view of it does. Reading past
    the file's end as mapped returns what there is, as ``read`` does; a file cut shorter *while*
    mapped faults the reading process (SIGBUS): shards are written once and renamed into place.
    """

    __slots__ = ("_map", "_pos", "_size", "_view")

    def __init__(self, mapped: mmap.mmap) -> None:
        self._map, self._view = mapped, memoryview(mapped)
        self._pos, self._size = 0, len(mapped)

    @classmethod
    def of(cls, f: io.BufferedReader) -> MappedShard | None:
        """``f`` mapped and closed (the map holds its own descriptor); None, ``f`` left open, if not."""
        try:
            if os.fstat(f.fileno()).st_size < _MAP_AT_LEAST:
                return None
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # a file system that does not map
            return None
        if hasattr(mmap, "MADV_SEQUENTIAL"):
            mapped.madvise(mmap.MADV_SEQUENTIAL)  # runs are read in order: read ahead as read() would
        f.close()
        return cls(mapped)

    def read(self, n: int = -1) -> bytes | memoryview:
        start = self._pos
        stop = self._size if n < 0 else min(self._size, start + n)
        self._pos = max(start, stop)
        if stop - start < _COPY_BELOW:
            return self._map[start:stop]
        return self._view[start:stop]

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = (0, self._pos, self._size)[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._view = self._map = None  # type: ignore[assignment]  # freed with the last view of it

    def __enter__(self) -> MappedShard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_elsewhere(
    order: Sequence[int] | np.ndarray,
    after: int | None,
    split: SplitInfo,
    source: ShardSource,
    *,
    limit: int,
    classes: Sequence[str] | None,
    what: str,
) -> Iterator[RawSample]:
    """Up to ``limit`` samples of whole shards, in ``order`` from the shard after ``after`` on.

    What a worker that lost all its own samples repeats (the same on every run), with a warning.
    Damaged shards and samples are passed over quietly: each was warned about when its own reader
    met it. With none readable anywhere no rank can make a batch, and each raises
    :class:`ShardReadError` saying so (``what`` names the split and where it is).
    """
    at = int(np.flatnonzero(np.asarray(order) == after)[0]) + 1 if after is not None else 0
    segments = [Segment(int(s), 0, split.shards[s].samples) for s in np.roll(np.asarray(order), -at)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = read_runs(
            segments,
            split,
            source,
            on_truncated=_ignore,
            on_unreadable=_ignore,
            classes=classes,
            on_corrupt=_ignore,
        )
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


def _skipping(run: Iterator[RawSample], seg: Segment) -> Iterator[RawSample]:
    return (s for i, s in enumerate(run, seg.start) if i not in seg.skip)


def _accounted(
    run: Iterator[RawSample],
    expected: int,
    on_lost: Callable[[int], None],
    on_unreadable: Callable[[ShardReadError], None] | None,
) -> Iterator[RawSample]:
    """``run``'s samples; a shard that cannot be read ends it (raised with no ``on_unreadable``).

    What the run lacks of its ``expected`` samples once it ends goes to ``on_lost``. A
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
    if got < expected:
        on_lost(expected - got)


def batched(
    raw: Iterator[RawSample],
    *,
    sizes: Sequence[int],
    first: int = 0,
    make_up: Callable[[], Iterator[RawSample]] | None,
) -> Iterator[tuple[int, list[RawSample]]]:
    """Cut ``raw`` into this worker's batches ``(k, samples)`` of ``sizes[k]``, from batch ``first`` on.

    The samples of batches before ``first`` (delivered before a resume) are read and dropped,
    never decoded. Samples that ``raw`` lacks (a truncated or unreadable shard) are made up by
    repeating the most recent ones, so the batch count holds; a worker that has read nothing at
    all repeats the samples ``make_up()`` gives (samples from elsewhere in the split). With
    ``make_up=None`` (eval) nothing is made up: a batch holds what exists, and the batches end when
    nothing is left.
    """
    recent: deque[RawSample] = deque(maxlen=max(sizes, default=1))  # the latest samples read
    recent.extend(islice(raw, sum(sizes[:first])))
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
