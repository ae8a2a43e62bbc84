"""One pass of a :class:`~imgshards.loader.ShardDataset` in one process, built in one function.

:func:`worker_pass` lists every stage of a worker's pass in order, as webdataset's
``WebDataset.__init__`` does, each with what flows out of it. Where a pass stands is a
:class:`~.state.PassPosition`. The dataset holds the configuration and the shared state (the epoch cursor,
the counters); the pass reads them through the dataset's public methods (``plan``, ``count``,
``made``), never its private fields.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

import webdataset as wds

from .. import stages as st
from ..epoch import partition
from ..epoch.order import worker_order
from ..epoch.seeds import augment_seed, user_seed
from ..errors import CorruptImageError, ShardReadError
from ..state.checkpoint import PassPosition
from ..state.cursor import CORRUPT, FILTERED, LOST, TRUNCATED, UNREADABLE
from .batch import BatchRows, BufferPool
from .read import read_elsewhere, read_runs
from .reader import RawSample
from .steps import NO_CLOCK, READ, NoClock, StepClock

if TYPE_CHECKING:
    from ..dataset import ShardDataset

__all__ = ["PIPELINE", "on_corrupt", "picture", "raw_batches", "raw_samples", "worker_pass"]

RawBatches = Iterator[tuple[int, list[Any]]]


# The stages of worker_pass, in its order, with what flows out of each: each is marked `# [name]`
# there (tests/loader/test_passes.py holds the two to each other, and the docs' picture to this).
PIPELINE: tuple[tuple[str, str], ...] = (
    ("plan", "WorkerPlan: this worker's segments (shard, start, stop) and the size of each batch"),
    ("read", "RawSample {__key__, __url__, jpg: bytes (or a view of a mapped shard), cls: bytes, __label__}"),
    ("order", "RawSample, in the worker's order: runs interleaved, then a shuffle buffer"),
    ("cut", "(k, [RawSample]): batch k of the plan; earlier ones read, not decoded"),
    ("raw_stages", "(k, [sample dict]): the user's raw stages; drops made up in train"),
    ("progress", "(k, [sample dict]): the same; the position recorded for state_dict()"),
    ("offload", "decode_on only: RawBatch (image bytes, labels) for the training process"),
    ("decode", "(k, [sample dict + image uint8 [3, H, W]]): decoded, transformed, seeded per batch"),
    ("image_stages", "(k, [sample dict]): the user's image stages"),
    ("collate", "Batch(images uint8 [B, 3, h, w], labels int64 [B]), in shared memory"),
)


def picture() -> str:
    """The pass as text, one stage a line with what flows out of it (generated from :data:`PIPELINE`)."""
    width = max(len(name) for name, _ in PIPELINE)
    return "\n".join(f"{name:>{width}}  -> {out}" for name, out in PIPELINE)


def worker_pass(
    ds: ShardDataset,
    at: PassPosition,
    *,
    pool: BufferPool | None,
    raw: Callable[[StepClock | NoClock], RawBatches] | None = None,
    raw_only: bool = False,
    clock: StepClock | NoClock | None = None,
) -> Iterator[Any]:
    """The batches one process makes in a pass of ``ds`` from ``at``: the whole path of a sample.

    ``raw_only``: stop after the user's raw stages, at ``(k, raw samples)`` (a mix's sources).
    ``raw``: make the raw batches that way instead, given the clock (a mix zips its sources').
    With ``decode_on`` the workers stop at raw batches: the training process decodes (:mod:`.device`).
    ``clock`` times the stages (default: the profiler's, if one is attached to ``ds``).
    """
    if clock is None:
        clock = NO_CLOCK if ds.step_times is None else ds.step_times.clock()
    train, worker, rank = ds.mode == "train", at.worker, ds.rank  # the rank this pass settled
    dropped = _counter(ds, worker, FILTERED)
    if raw is None:
        # [plan] -> WorkerPlan: this rank's and worker's segments of shards, the size of each batch
        plan = ds.plan(at)
        head: list[Any] = [
            # [read] -> RawSample {__key__, __url__, jpg: bytes or a view, cls: bytes, __label__}: one run of
            #           samples a segment, read from the tar (reader.read_run, read.read_runs)
            # [order] -> RawSample, in the worker's order: runs interleaved, buffer-shuffled
            #            (epoch.order.worker_order, which the elastic replay calls too)
            lambda: clock.timed_iter(READ, _read(ds, plan, at)),
            # [cut] -> (k, [RawSample]): batch k of the plan; batches before at.first read, not
            #          decoded; in train what a damaged shard lost is made up from recent samples
            st.batches(plan.sizes, first=at.first, make_up=_make_up(ds, plan, at) if train else None),
            # [raw_stages] -> (k, [sample dict]): the user's raw stages, a random filter seeded per
            #                 batch; in train what they drop is made up, so ranks keep len() batches
            st.each(
                ds.raw_stages,
                make_up=train,
                on_dropped=dropped,
                seed_of=lambda k: user_seed(ds.seed, at.epoch, rank, worker, k),
            )
            if ds.raw_stages
            else None,
        ]
    else:
        head = [lambda: raw(clock)]  # a mix: batch k of every source, zipped (mix.py)
    if raw_only:
        return iter(wds.DataPipeline(*head))

    def progress(data: RawBatches) -> RawBatches:
        for k, samples in data:
            ds.made(at.at(k + 1))
            yield k, samples

    # [progress] -> (k, [sample dict]): the same; this process has made batch k (state_dict())
    tail: list[Any] = [progress]
    if ds.decode_on is not None:
        # [offload] -> RawBatch: the batch's image bytes and labels, for the training process
        tail += [st.raw_batches(epoch=at.epoch, worker=worker, shared=pool is not None, clock=clock)]
    else:
        tail += [
            # [decode] -> (k, [sample dict + image uint8 [3, H, W]]): decoded and transformed,
            #             torch's generator seeded per batch; corrupt images counted and dropped;
            #             with no image stage, each image is written into its batch's buffer at once
            st.decode_batches(
                ds.transform,
                seed_of=lambda k: augment_seed(ds.seed, at.epoch, rank, worker, k),
                restore=pool is None,
                on_corrupt=on_corrupt(ds, worker),
                clock=clock,
                rows=None if ds.image_stages else lambda n: BatchRows(n, pool=pool),
            ),
            # [image_stages] -> (k, [sample dict]): the user's image stages (drops counted)
            st.each(ds.image_stages, make_up=False, on_dropped=dropped) if ds.image_stages else None,
            # [collate] -> Batch(images uint8 [B, 3, h, w], labels int64 [B]), in shared memory
            #              (the rows the decode stage wrote, as they stand, when it wrote them)
            st.collate_batches(pool=pool, clock=clock),
        ]
    return iter(wds.DataPipeline(*head, *tail, _settled(ds)))


def raw_batches(ds: ShardDataset, at: PassPosition, *, clock: StepClock | NoClock = NO_CLOCK) -> RawBatches:
    """``(k, raw samples)`` of a pass from batch ``at.first`` on: :func:`worker_pass` to its raw stages."""
    return worker_pass(ds, at, pool=None, raw_only=True, clock=clock)


def _settled(ds: ShardDataset) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def settled(data: Iterator[Any]) -> Iterator[Any]:
        yield from data
        # A DataLoader worker may exit once its pass is over: its downloads must reach the cache first.
        ds.source.settle()

    return settled


def _make_up(
    ds: ShardDataset, plan: partition.WorkerPlan, at: PassPosition
) -> Callable[[], Iterator[RawSample]]:
    def make_up() -> Iterator[RawSample]:  # a worker that lost every sample: other shards' samples
        shards = len(ds.split_info.shards)
        order = partition.shard_order(shards, seed=ds.seed, epoch=at.epoch, shuffle=ds.shuffle)
        after = plan.segments[0].shard if plan.segments else None
        where = f"split {ds.split!r} at {ds.root} (rank {ds.rank})"
        return read_elsewhere(
            order, after, ds.split_info, ds.source, limit=max(plan.sizes), classes=ds.classes, what=where
        )

    return make_up


def raw_samples(ds: ShardDataset, at: PassPosition) -> Iterator[RawSample]:
    """The raw samples of a pass from ``at``, with every member (:func:`.stages.samples`)."""
    plan = ds.plan(at)
    skip = sum(plan.sizes[: at.first])  # delivered before a resume
    return islice(_read(ds, plan, at, keep_all=True), skip, None)


def _read(
    ds: ShardDataset, plan: partition.WorkerPlan, at: PassPosition, *, keep_all: bool = False
) -> Iterator[RawSample]:
    """The plan's samples, read (one run a segment) and put in the worker's order."""
    worker = at.worker

    def on_truncated(message: str) -> None:
        ds.count(worker, TRUNCATED)
        warnings.warn(message, RuntimeWarning, stacklevel=2)

    def on_unreadable(e: ShardReadError) -> None:
        ds.count(worker, UNREADABLE)
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
        views=not (keep_all or ds.raw_stages or ds.image_stages),  # images as views: no stage keeps them
    )
    sizes = [len(seg) for seg in plan.segments]
    return worker_order(runs, sizes, ds.order, epoch=at.epoch, rank=ds.rank, worker=worker, leg=at.leg)


def _counter(ds: ShardDataset, worker: int, what: int) -> Callable[[int], None]:
    return lambda n: ds.count(worker, what, n)


def on_corrupt(ds: ShardDataset, worker: int) -> Callable[[CorruptImageError], None] | None:
    """Skip, count and warn about a sample that is not usable; ``None`` (raise) with on_error="raise"."""
    if ds.on_error == "raise":
        return None

    def skip(e: CorruptImageError) -> None:
        ds.count(worker, CORRUPT)
        warnings.warn(f"skipped: {e}", RuntimeWarning, stacklevel=3)

    return skip
