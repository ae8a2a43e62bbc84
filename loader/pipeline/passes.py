"""One worker's pass over plain values: settings in, batches out.

:func:`worker_pass` is the whole path of a sample through a DataLoader worker, in order::

    plan -> read -> order -> cut -> raw stages -> decode + transform -> image stages -> collate
                                            or -> offload (decode_on: the training process decodes)

It takes frozen settings (:class:`ReadSettings`: what to read, in which order, in which batches;
:class:`ImageSettings`: how to decode, augment and stack), the pass's :class:`PassPosition` and a
handle on its counters, and returns the batches. Nothing here holds or calls back into a dataset:
:class:`~imgshards.loader.ShardDataset` builds the settings once, and each pass starts from them.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from imgshards.converter.format.manifest import SplitInfo

from ..epoch import elastic, partition
from ..epoch.order import resumed_order, worker_order
from ..epoch.position import PassPosition
from ..epoch.seeds import augment_seed, user_seed
from ..errors import ShardReadError
from ..image.presets import Transform
from ..remote import ShardSource
from ..state.buffers import Batch, BufferPool, SentBatch
from ..state.cursor import FILTERED, TRUNCATED, UNREADABLE, Counters
from .batches import Batches, Stage, collate_batches, decode_batches, each, offload_batches
from .collate import BatchRows
from .offload import RawBatch
from .runs import Resumed, RunReader, batched, read_elsewhere
from .steps import NO_CLOCK, READ, NoClock, StepClock
from .tar import RawSample

__all__ = ["ImageSettings", "ReadSettings", "raw_pass", "raw_samples", "worker_pass"]


@dataclass(frozen=True)
class ReadSettings:
    """What a pass reads, in which order, cut into which batches: the raw half of a pass."""

    split: SplitInfo
    source: ShardSource
    classes: tuple[str, ...]
    layout: elastic.Layout  # the shards' sizes, seed, batch size, shuffle and buffer
    train: bool
    on_error: str
    raw_stages: tuple[Stage, ...] = ()
    views: bool = True  # images as views of a mapped shard: no user stage sees (and keeps) them
    where: str = ""  # the split and its root, for messages

    def plan(self, at: PassPosition) -> partition.WorkerPlan:
        """What the worker of ``at`` reads in its pass: segments of shards and the size of each batch."""
        layout = self.layout
        where: dict[str, Any] = dict(
            rank=at.rank, world_size=at.world_size, worker=at.worker, num_workers=at.num_workers
        )
        if self.train:
            return elastic.plan(layout, epoch=at.epoch, legs=at.legs, **where)
        return partition.worker_plan(
            layout.shard_samples,
            seed=layout.seed,
            epoch=at.epoch,
            shuffle=layout.shuffle,
            batch_size=layout.batch_size,
            train=False,
            drop_last=False,
            **where,
        )


@dataclass(frozen=True)
class ImageSettings:
    """How a pass makes batches of its raw samples: the decoding half of a pass."""

    transform: Transform
    seed: int
    on_error: str
    image_stages: tuple[Stage, ...] = ()
    offload: bool = False  # decode_on: the workers send raw bytes, the training process decodes


def worker_pass(
    s: ImageSettings,
    raw: Batches,
    at: PassPosition,
    counters: Counters,
    *,
    pool: BufferPool | None,
    clock: StepClock | NoClock = NO_CLOCK,
) -> Iterator[Batch | SentBatch | RawBatch]:
    """The batches one process makes of ``raw`` (:func:`raw_pass`, or a mix's zip of several).

    With ``offload`` the workers stop at raw batches: the training process decodes (:mod:`..device`).
    """
    if s.offload:
        # offload -> RawBatch: the batch's image bytes and labels, for the training process
        return offload_batches(raw, epoch=at.epoch, worker=at.worker, shared=pool is not None, clock=clock)
    on_corrupt = None if s.on_error == "raise" else counters.skip  # skip, count and warn
    # decode -> (k, [sample + image uint8 [3, H, W]]): decoded and transformed, torch's generator seeded
    #           per batch; with no image stage each image goes into its batch's buffer at once
    batches = decode_batches(
        raw,
        s.transform,
        seed_of=lambda k: augment_seed(s.seed, at.epoch, at.rank, at.worker, k),
        restore=pool is None,
        on_corrupt=on_corrupt,
        clock=clock,
        rows=None if s.image_stages else lambda n: BatchRows(n, pool=pool),
    )
    if s.image_stages:
        # image stages -> (k, [sample]): the user's stages on decoded images (drops counted)
        batches = each(batches, s.image_stages, keep_size=False, on_dropped=counters.adder(FILTERED))
    # collate -> Batch(images uint8 [B, 3, h, w], labels int64 [B]), in shared memory
    return collate_batches(batches, pool=pool, clock=clock)


def raw_pass(
    s: ReadSettings, at: PassPosition, counters: Counters, *, clock: StepClock | NoClock = NO_CLOCK
) -> Batches:
    """``(k, raw samples)``: batch ``k`` of the plan of ``at``, from batch ``at.first`` on.

    In train mode what a damaged shard lost, and what the raw stages dropped, is made up, so every
    rank keeps ``len()`` batches.
    """
    # plan -> WorkerPlan: this rank's and worker's segments of shards, the size of each batch
    plan = s.plan(at)
    # read, order -> RawSample, one run a segment (reader.read_run), interleaved and buffer-shuffled,
    #                from batch at.first on (the samples before it replayed from the index, not read)
    samples = clock.timed_iter(READ, _read(s, plan, at, counters))
    # cut -> (k, [RawSample]): batches from at.first on; in train what a damaged shard lost is made
    #        up from recent samples
    batches = batched(
        samples, sizes=plan.sizes, first=at.first, make_up=_elsewhere(s, plan, at) if s.train else None
    )
    if s.raw_stages:
        # raw stages -> (k, [sample]): the user's stages, a random filter seeded per batch
        batches = each(
            batches,
            s.raw_stages,
            keep_size=s.train,
            on_dropped=counters.adder(FILTERED),
            seed_of=lambda k: user_seed(s.layout.seed, at.epoch, at.rank, at.worker, k),
        )
    return batches


def raw_samples(s: ReadSettings, at: PassPosition, counters: Counters) -> Iterator[RawSample]:
    """The raw samples of a pass from ``at``, with every member (:func:`imgshards.loader.stages.samples`)."""
    return _read(s, s.plan(at), at, counters, keep_all=True)


def _elsewhere(
    s: ReadSettings, plan: partition.WorkerPlan, at: PassPosition
) -> Callable[[], Iterator[RawSample]]:
    def make_up() -> Iterator[RawSample]:  # a worker that lost every sample: other shards' samples
        shards = len(s.split.shards)
        order = partition.shard_order(shards, seed=s.layout.seed, epoch=at.epoch, shuffle=s.layout.shuffle)
        after = plan.segments[0].shard if plan.segments else None
        what = f"{s.where} (rank {at.rank})"
        return read_elsewhere(
            order, after, s.split, s.source, limit=max(plan.sizes), classes=s.classes, what=what
        )

    return make_up


def _read(
    s: ReadSettings,
    plan: partition.WorkerPlan,
    at: PassPosition,
    counters: Counters,
    *,
    keep_all: bool = False,
) -> Iterator[RawSample]:
    """The plan's samples from batch ``at.first`` on, read (one run a segment), in the worker's order.

    A resumed pass (``at.first > 0``) replays the same order on numbers up to the samples of its
    first batch, and reads from there on only (:class:`~.runs.Resumed`).
    """

    def on_truncated(message: str) -> None:
        counters.add(TRUNCATED)
        warnings.warn(message, RuntimeWarning, stacklevel=2)

    def on_unreadable(e: ShardReadError) -> None:
        counters.add(UNREADABLE)
        warnings.warn(f"skipped the rest of a shard: {e}", RuntimeWarning, stacklevel=2)

    keep_all = keep_all or bool(s.raw_stages)  # the user's stages may want any member
    reader = RunReader(
        plan.segments,
        s.split,
        s.source,
        on_truncated=on_truncated,
        on_unreadable=None if s.on_error == "raise" else on_unreadable,
        classes=s.classes,
        on_corrupt=None if s.on_error == "raise" else counters.skip,  # a label outside the classes...
        counters=counters,  # counts the samples a damaged shard's run lacks
        keep_all=keep_all,
        views=s.views and not keep_all,
    )
    sizes = [len(seg) for seg in plan.segments]
    where = dict(epoch=at.epoch, rank=at.rank, worker=at.worker, leg=at.leg)
    skip = sum(plan.sizes[: at.first])  # delivered before a resume
    if not skip:
        return worker_order(reader.runs(), sizes, s.layout.order, **where)
    resumed = Resumed(reader)
    return resumed.samples(resumed_order(resumed.open_run, sizes, s.layout.order, skip=skip, **where))
