"""One worker's pass: a frozen spec in, batches out.

:func:`raw_batches` then :func:`worker_pass` are the whole path of a sample through a DataLoader
worker, in order::

    plan -> read -> order -> cut -> raw stages -> (zip the parts) -> decode + transform
         -> image stages -> collate       or -> offload (decode_on: the training process decodes)

They take the dataset's frozen :class:`~.spec.Spec` (and one of its parts: what to read, in which
order, in which batches; how to decode, augment and stack), the pass's :class:`PassPosition` and a
handle on its counters, and return the batches. Nothing here holds or calls back into a dataset:
:class:`~imgshards.loader.ShardDataset` builds the spec once, and each pass starts from it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

from ..epoch import elastic, partition
from ..epoch.order import resumed_order, worker_order
from ..epoch.position import PassPosition
from ..epoch.seeds import augment_seed, mix_rng, user_seed
from ..errors import ShardReadError
from ..state.buffers import Batch, BufferPool, SentBatch
from ..state.cursor import FILTERED, TRUNCATED, UNREADABLE, Counters
from .batches import LABEL, Batches, collate_batches, decode_batches, each, offload_batches
from .collate import BatchRows
from .offload import RawBatch
from .runs import Resumed, RunReader, batched, read_elsewhere
from .spec import Part, Spec
from .steps import NO_CLOCK, READ, NoClock, StepClock
from .tar import RawSample

__all__ = ["plan", "raw_batches", "raw_pass", "raw_samples", "worker_pass"]


def worker_pass(
    s: Spec,
    raw: Batches,
    at: PassPosition,
    counters: Counters,
    *,
    pool: BufferPool | None,
    clock: StepClock | NoClock = NO_CLOCK,
) -> Iterator[Batch | SentBatch | RawBatch]:
    """The batches one process makes of ``raw`` (:func:`raw_batches`).

    With ``decode_on`` the workers stop at raw batches: the training process decodes (:mod:`..device`).
    """
    if s.decode_on is not None:
        # offload -> RawBatch: the batch's image bytes and labels, for the training process
        return offload_batches(raw, epoch=at.epoch, worker=at.worker, shared=pool is not None, clock=clock)
    on_corrupt = None if s.on_error == "raise" else counters.skip  # skip, count and warn
    seed = s.seed
    # decode -> (k, [sample + image uint8 [3, H, W]]): decoded and transformed, torch's generator seeded
    #           per batch; with no image stage each image goes into its batch's buffer at once
    batches = decode_batches(
        raw,
        s.transform,
        seed_of=lambda k: augment_seed(seed, at.epoch, at.rank, at.worker, k),
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


def raw_batches(
    s: Spec, at: PassPosition, counters: Counters, clock: StepClock | NoClock = NO_CLOCK
) -> Batches:
    """``(k, raw samples)`` of the pass of ``at``, the user's raw stages run; several parts zipped.

    Batch ``k`` of every part makes batch ``k`` of the spec: labels mapped onto the spec's classes,
    shuffled within the batch. The shortest part ends the epoch.
    """
    if len(s.parts) == 1:
        return raw_pass(s, s.parts[0], at, counters, clock=clock)
    return _zipped(s, at, counters, clock)


def _zipped(s: Spec, at: PassPosition, counters: Counters, clock: StepClock | NoClock) -> Batches:
    streams = [raw_pass(s, part, at, counters, clock=clock) for part in s.parts]
    for batches in zip(*streams, strict=False):  # the shortest part ends the epoch
        k = batches[0][0]
        samples = [
            x if part.relabel is None else {**x, LABEL: int(part.relabel[x[LABEL]])}
            for (_, raw), part in zip(batches, s.parts, strict=True)
            for x in raw
        ]
        rng = mix_rng(s.seed, at.epoch, at.rank, at.worker, k)
        yield k, [samples[i] for i in rng.permutation(len(samples))]
    for stream in streams:
        stream.close()  # type: ignore[attr-defined]


def plan(s: Spec, part: Part, at: PassPosition) -> partition.WorkerPlan:
    """What the worker of ``at`` reads of ``part`` in its pass: segments of shards, each batch's size."""
    layout = s.layout(part)
    where: dict[str, Any] = dict(
        rank=at.rank, world_size=at.world_size, worker=at.worker, num_workers=at.num_workers
    )
    if s.train:
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


def raw_pass(
    s: Spec, part: Part, at: PassPosition, counters: Counters, *, clock: StepClock | NoClock = NO_CLOCK
) -> Batches:
    """``(k, raw samples)``: batch ``k`` of ``part``'s plan for ``at``, from batch ``at.first`` on.

    In train mode what a damaged shard lost, and what the raw stages dropped, is made up, so every
    rank keeps ``len()`` batches.
    """
    # plan -> WorkerPlan: this rank's and worker's segments of shards, the size of each batch
    worker_plan = plan(s, part, at)
    # read, order -> RawSample, one run a segment (splitreader: read_run, a seek checked by its key),
    #                interleaved and buffer-shuffled,
    #                from batch at.first on (the samples before it replayed from the index, not read)
    samples = clock.timed_iter(READ, _read(s, part, worker_plan, at, counters))
    # cut -> (k, [RawSample]): batches from at.first on; in train what a damaged shard lost is made
    #        up from recent samples
    make_up = _elsewhere(s, part, worker_plan, at) if s.train else None
    batches = batched(samples, sizes=worker_plan.sizes, first=at.first, make_up=make_up)
    if s.raw_stages:
        # raw stages -> (k, [sample]): the user's stages, a random filter seeded per batch
        batches = each(
            batches,
            s.raw_stages,
            keep_size=s.train,
            on_dropped=counters.adder(FILTERED),
            seed_of=lambda k: user_seed(part.seed, at.epoch, at.rank, at.worker, k),
        )
    return batches


def raw_samples(s: Spec, part: Part, at: PassPosition, counters: Counters) -> Iterator[RawSample]:
    """The raw samples of a pass from ``at``, with every member (:func:`imgshards.loader.stages.samples`)."""
    return _read(s, part, plan(s, part, at), at, counters, keep_all=True)


def _elsewhere(
    s: Spec, part: Part, worker_plan: partition.WorkerPlan, at: PassPosition
) -> Callable[[], Iterator[RawSample]]:
    def make_up() -> Iterator[RawSample]:  # a worker that lost every sample: other shards' samples
        shards = len(part.split.shards)
        order = partition.shard_order(shards, seed=part.seed, epoch=at.epoch, shuffle=s.shuffle)
        after = worker_plan.segments[0].shard if worker_plan.segments else None
        what = f"{part.where} (rank {at.rank})"
        return read_elsewhere(order, after, part.reader, limit=max(worker_plan.sizes), what=what)

    return make_up


def _read(
    s: Spec,
    part: Part,
    worker_plan: partition.WorkerPlan,
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
        worker_plan.segments,
        part.reader,
        on_truncated=on_truncated,
        on_unreadable=None if s.on_error == "raise" else on_unreadable,
        on_corrupt=None if s.on_error == "raise" else counters.skip,  # a label outside the classes...
        counters=counters,  # counts the samples a damaged shard's run lacks
        keep_all=keep_all,
        views=s.views and not keep_all,
    )
    sizes = [len(seg) for seg in worker_plan.segments]
    where = dict(epoch=at.epoch, rank=at.rank, worker=at.worker, leg=at.leg)
    skip = sum(worker_plan.sizes[: at.first])  # delivered before a resume
    order = s.layout(part).order
    if not skip:
        return worker_order(reader.runs(), sizes, order, **where)
    resumed = Resumed(reader)
    return resumed.samples(resumed_order(resumed.open_run, sizes, order, skip=skip, **where))
