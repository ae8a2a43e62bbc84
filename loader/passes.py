"""One pass of a :class:`~imgshards.loader.ShardDataset` in one process: its stages, composed.

The pass is a ``wds.DataPipeline`` of the public stages of :mod:`.stages`, for the epoch's plan of
this rank and worker (:mod:`.partition`, :mod:`.elastic`)::

    raw samples (plan -> read_runs -> interleave -> buffer shuffle)
        -> batches (skip delivered, make up damaged shards) -> each(raw_stages)
        -> decode_batches (decode -> transform) -> each(image_stages) -> collate_batches
                                               (decode_on: -> raw_batches, decoded by device.py)

The dataset holds the configuration and the shared state (epoch, resume point, counters); this
module holds what a pass does with them, so each stays short enough to read at once.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

import webdataset as wds
from torch.utils.data import get_worker_info

from . import partition
from . import stages as st
from .batch import Batch, BufferPool
from .control import CORRUPT, FILTERED, LOST, TRUNCATED, UNREADABLE
from .epoch.seeds import augment_seed, stages_seed
from .errors import CorruptImageError, ShardReadError
from .offload import RawBatch
from .pipeline import read_elsewhere, read_runs
from .profiling.stagetimes import NO_CLOCK, READ, NoClock, StageClock
from .reader import RawSample
from .shuffle import worker_order

if TYPE_CHECKING:
    from .dataset import ShardDataset
    from .state import Stage

__all__ = ["finish", "on_corrupt", "position", "raw_batches", "raw_samples", "run"]


def position(ds: ShardDataset) -> tuple[int, tuple[Stage, ...], int, int, int]:
    """Where this process's pass starts: ``(epoch, finished stages, first batch, worker, num_workers)``.

    Read from the shared state when a DataLoader starts the pass (or from a torchdata restore).
    """
    info = get_worker_info()
    worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
    if ds._pending is not None:  # a torchdata restore: this worker's own place, as saved
        (epoch, stages, first), ds._pending = ds._pending, None
        return epoch, stages, first, worker, num_workers
    epoch, stages, resume = ds._control.pass_state()  # as the pass began, not as the record is now
    # DataLoader asks worker 0 first on every pass, but after `resume` batches the next one is
    # worker `resume % num_workers`'s: each process plays the worker whose turn it would be.
    role = partition.resumed_worker(worker, resume, num_workers)
    return epoch, stages, partition.delivered_by_worker(resume, num_workers)[role], role, num_workers


def run(
    ds: ShardDataset,
    epoch: int,
    stages: tuple[Stage, ...],
    first: int,
    worker: int,
    num_workers: int,
    *,
    pool: BufferPool | None,
) -> Iterator[Batch | RawBatch]:
    """The batches of one pass: the stages of :mod:`.stages` as one ``wds.DataPipeline``."""
    clock = NO_CLOCK if ds.stage_times is None else ds.stage_times.clock()
    raw = raw_batches(ds, epoch, stages, first, worker, num_workers, clock=clock)
    yield from finish(ds, raw, epoch, stages, worker, num_workers, pool=pool, clock=clock)
    # A DataLoader worker may exit once its pass is over: its downloads must reach the cache first.
    ds.source.settle()


def raw_batches(
    ds: ShardDataset,
    epoch: int,
    stages: tuple[Stage, ...],
    first: int,
    worker: int,
    num_workers: int,
    *,
    clock: StageClock | NoClock = NO_CLOCK,
) -> Iterator[tuple[int, list[Any]]]:
    """The worker's batches ``(k, raw samples)`` from batch ``first`` on, through ``ds.raw_stages``."""
    plan = ds._plan(epoch, stages, worker, num_workers)
    train = ds.mode == "train"

    def source() -> Iterator[RawSample]:
        return clock.timed_iter(READ, _stream(ds, plan, epoch, len(stages), worker))

    def make_up() -> Iterator[RawSample]:  # a worker that lost every sample: other shards' samples
        order = partition.shard_order(len(ds._shard_samples), seed=ds.seed, epoch=epoch, shuffle=ds.shuffle)
        after = plan.segments[0].shard if plan.segments else None
        where = f"split {ds.split!r} at {ds.root} (rank {ds.rank})"
        limit = max(plan.sizes)
        return read_elsewhere(
            order, after, ds.split_info, ds.source, limit=limit, classes=ds.classes, what=where
        )

    def seed_of(k: int) -> int:  # a random filter is a pure function of the batch, as augmentation is
        return stages_seed(ds.seed, epoch, ds.rank, worker, k)

    dropped = _counter(ds, worker, FILTERED)
    return iter(
        wds.DataPipeline(
            source,
            st.batches(plan.sizes, first=first, make_up=make_up if train else None),
            st.each(ds.raw_stages, make_up=train, on_dropped=dropped, seed_of=seed_of)
            if ds.raw_stages
            else None,
        )
    )


def finish(
    ds: ShardDataset,
    raw: Iterator[tuple[int, list[Any]]],
    epoch: int,
    stages: tuple[Stage, ...],
    worker: int,
    num_workers: int,
    *,
    pool: BufferPool | None,
    clock: StageClock | NoClock = NO_CLOCK,
) -> Iterator[Batch | RawBatch]:
    """Raw batches to what a worker yields: decoded, transformed, through ``ds.image_stages``, stacked."""

    def progress(data: Iterator[tuple[int, list[Any]]]) -> Iterator[tuple[int, list[Any]]]:
        for k, samples in data:  # for state_dict(): this process has made batch k
            ds._progress = (epoch, stages, worker, num_workers, k + 1)
            yield k, samples

    def seed_of(k: int) -> int:
        return augment_seed(ds.seed, epoch, ds.rank, worker, k)

    dropped = _counter(ds, worker, FILTERED)
    return iter(
        wds.DataPipeline(lambda: raw, progress, *_decoded(ds, epoch, worker, pool, clock, seed_of, dropped))
    )


def _decoded(
    ds: ShardDataset,
    epoch: int,
    worker: int,
    pool: BufferPool | None,
    clock: StageClock | NoClock,
    seed_of: Callable[[int], int],
    dropped: Callable[[int], None],
) -> list[Any]:
    """The stages from a batch of raw samples to what the worker yields."""
    if ds.decode_on is not None:  # the training process decodes (device.py)
        return [st.raw_batches(epoch=epoch, worker=worker, shared=pool is not None, clock=clock)]
    return [
        st.decode_batches(
            ds.transform,
            seed_of=seed_of,
            restore=pool is None,
            on_corrupt=on_corrupt(ds, worker),
            clock=clock,
        ),
        st.each(ds.image_stages, make_up=False, on_dropped=dropped) if ds.image_stages else None,
        st.collate_batches(pool=pool, clock=clock),
    ]


def raw_samples(ds: ShardDataset) -> Iterator[RawSample]:
    """The raw samples of this process's current pass, with every member (:func:`.stages.samples`)."""
    epoch, stages, first, worker, num_workers = position(ds)
    plan = ds._plan(epoch, stages, worker, num_workers)
    skip = sum(plan.sizes[:first])  # delivered before a resume
    return islice(_stream(ds, plan, epoch, len(stages), worker, keep_all=True), skip, None)


def _stream(
    ds: ShardDataset,
    plan: partition.WorkerPlan,
    epoch: int,
    stage: int,
    worker: int,
    *,
    keep_all: bool = False,
) -> Iterator[RawSample]:
    def on_truncated(message: str) -> None:
        ds._control.count(worker, TRUNCATED)
        warnings.warn(message, RuntimeWarning, stacklevel=2)

    def on_unreadable(e: ShardReadError) -> None:
        ds._control.count(worker, UNREADABLE)
        warnings.warn(f"skipped the rest of a shard: {e}", RuntimeWarning, stacklevel=2)

    runs = read_runs(
        plan.segments,
        ds.split_info,
        ds.source,
        on_truncated=on_truncated,
        on_unreadable=None if ds.on_error == "raise" else on_unreadable,
        classes=ds.manifest.classes,
        on_corrupt=on_corrupt(ds, worker),  # a label outside the classes, no image...
        on_lost=_counter(ds, worker, LOST),
        keep_all=keep_all or bool(ds.raw_stages),  # the user's stages may want any member
    )
    sizes = [len(seg) for seg in plan.segments]
    return worker_order(runs, sizes, ds._layout.order, epoch=epoch, rank=ds.rank, worker=worker, leg=stage)


def _counter(ds: ShardDataset, worker: int, what: int) -> Callable[[int], None]:
    return lambda n: ds._control.count(worker, what, n)


def on_corrupt(ds: ShardDataset, worker: int) -> Callable[[CorruptImageError], None] | None:
    """Skip, count and warn about a sample that is not usable; ``None`` (raise) with on_error="raise"."""
    if ds.on_error == "raise":
        return None

    def skip(e: CorruptImageError) -> None:
        ds._control.count(worker, CORRUPT)
        warnings.warn(f"skipped: {e}", RuntimeWarning, stacklevel=3)

    return skip
