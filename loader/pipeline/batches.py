"""The batch steps of a pass, plain generators over ``(k, [samples])``: batch ``k`` of a worker's plan.

:func:`~.passes.worker_pass` chains them; the public stages (:mod:`imgshards.loader.stages`) reuse the
sample helpers here. A batch is cut from the raw sequence (:func:`.runs.batched`) before any user
stage runs, so a filter cannot move batch boundaries: resume stays exact, and in train mode
:func:`each` makes up what a filter dropped (repeating the batch's, or the worker's latest, kept
samples), so every rank keeps ``len()`` batches. In eval mode the dropped samples are counted, not
made up.

Samples are webdataset's sample dicts: ``__key__``, ``__url__`` (the shard), one entry per member,
plus ``__label__``; after decoding, ``image`` (``uint8 [3, H, W]``). No step changes the dicts it is
given; each yields new ones.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

from ..errors import ConfigError, CorruptImageError, ImageShapeError
from ..image.decode import decode as decode_image
from ..image.presets import Transform
from ..image.scaled import ScaledDecoder, scaled_decoder
from ..state.buffers import Batch, BufferPool, SentBatch
from .collate import BatchRows, collate
from .offload import RawBatch, raw_batch
from .runs import seeded
from .steps import AUGMENT, COLLATE, DECODE, NoClock, StepClock
from .tar import image_member, sample_shard, source_path

__all__ = [
    "IMAGE",
    "LABEL",
    "Batches",
    "Sample",
    "Stage",
    "apply",
    "check_stages",
    "collate_batches",
    "decode_batches",
    "decode_one",
    "each",
    "offload_batches",
    "transform_one",
]

Sample = dict[str, Any]
Stage = Callable[[Iterator[Any]], Iterator[Any]]  # a webdataset stage: samples in, samples out
Batches = Iterator[tuple[int, list[Any]]]
IMAGE = "image"  # the decoded image, uint8 [3, H, W]
LABEL = "__label__"  # the class id


def apply(stages: Sequence[Stage], items: Iterable[Any]) -> Iterator[Any]:
    """Run ``items`` through ``stages`` in order, as ``wds.DataPipeline`` runs its stages."""
    it: Iterator[Any] = iter(items)
    for stage in stages:
        it = iter(stage(it))
    return it


def decode_one(sample: Mapping[str, Any], decode: Callable[..., Any] = decode_image) -> Any:
    """The image of ``sample`` decoded; :class:`CorruptImageError` naming the sample if it has none."""
    ext = image_member(sample)
    if not ext:
        raise CorruptImageError.for_sample(
            str(sample.get("__key__")), sample_shard(sample), "no image member"
        )
    key, shard = str(sample.get("__key__")), sample_shard(sample)

    def damaged(said: str) -> None:  # libjpeg decoded it, complaining: kept, and named
        path = source_path(sample)
        where = f"{path} (sample {key!r} in shard {shard})" if path else f"{key!r} in shard {shard}"
        warnings.warn(
            f"image {where} is damaged, decoded as far as its data goes (libjpeg: {said}); "
            "re-pack with the default checks to leave it out",
            RuntimeWarning,
            stacklevel=2,
        )

    return decode(sample[ext], ext, key=key, shard=shard, on_damage=damaged)


def transform_one(sample: Mapping[str, Any], image: Any, transform: Transform) -> Any:
    """``transform(image)``; an image it refuses raises :class:`CorruptImageError` naming the sample.

    Refused: a shape a preset will not resize (:class:`ImageShapeError`, a 65500x1 image in eval
    mode), or memory the resize cannot have. Any other error is a bug of the transform's, and is
    raised as it is.
    """
    try:
        return transform(image)
    except (ImageShapeError, MemoryError) as e:
        reason = str(e) if isinstance(e, ImageShapeError) else f"{type(e).__name__}: {e}"
    except RuntimeError as e:  # torch's CPU allocator failing; not a MemoryError
        if "can't allocate memory" not in str(e):
            raise
        reason = f"{type(e).__name__}: {e}"
    raise CorruptImageError.for_transform(str(sample.get("__key__")), sample_shard(sample), reason)


def each(
    batches: Batches,
    stages: Sequence[Stage],
    *,
    keep_size: bool,
    on_dropped: Callable[[int], None],
    seed_of: Callable[[int], int] | None = None,
) -> Batches:
    """Run each batch's samples through the user's ``stages`` (``wds.select``, ``wds.map``...).

    The samples a stage drops are told to ``on_dropped`` (a count per batch); with ``keep_size``
    they are replaced by repeating the batch's kept samples (or, if it kept none, the worker's
    latest), so the batch keeps its size. With ``seed_of``, torch's generator is seeded with
    ``seed_of(k)`` while batch ``k`` runs, so a stage drawing from it is reproducible.
    """
    ahead: deque[tuple[int, int, list[Sample]]] = deque()  # batches run through the stages early
    recent: deque[Sample] = deque(maxlen=256)  # the latest kept samples, to repeat

    def run(k: int, samples: list[Sample]) -> tuple[int, int, list[Sample]]:
        if seed_of is None:
            return k, len(samples), list(apply(stages, samples))
        with seeded(seed_of(k), restore=True):  # a random filter is a pure function of the batch too
            return k, len(samples), list(apply(stages, samples))

    while True:
        if ahead:
            k, size, kept = ahead.popleft()
        else:
            item = next(batches, None)
            if item is None:
                return
            k, size, kept = run(*item)
        dropped = size - len(kept)
        if dropped > 0:
            on_dropped(dropped)
        recent.extend(kept)
        if dropped > 0 and keep_size:
            while not recent:  # nothing kept yet: take from the batches after this one
                item = next(batches, None)
                if item is None:
                    raise ConfigError(
                        "the raw stages dropped every sample of this worker's part of the epoch: "
                        "nothing is left to make up the batches with"
                    )
                ahead.append(run(*item))
                recent.extend(ahead[-1][2])
            pool = kept or list(recent)
            kept = kept + [dict(pool[i % len(pool)]) for i in range(dropped)]
        yield k, kept


def decode_batches(
    batches: Batches,
    transform: Transform,
    *,
    seed_of: Callable[[int], int],
    restore: bool,
    on_corrupt: Callable[[CorruptImageError], None] | None,
    clock: StepClock | NoClock,
    rows: Callable[[int], BatchRows] | None = None,
) -> Batches:
    """Decode and transform every sample of batch ``k``, torch's generator seeded by ``seed_of(k)``.

    ``restore``: put the caller's generator state back (the main process). With a preset, a large
    JPEG is decoded at the scale its view needs (:mod:`..image.scaled`). An image that does not
    decode, or that the transform refuses (a shape a preset will not resize, memory it cannot
    have), goes to ``on_corrupt`` and leaves its batch one smaller (raises without ``on_corrupt``).
    With ``rows`` (a batch buffer for ``n`` images) each image is written into its batch's buffer as
    soon as it is made, and :func:`collate_batches` takes the rows as they stand.
    """
    decode, transform_ = clock.timed(DECODE, decode_image), clock.timed(AUGMENT, transform)
    # A preset decodes a large JPEG at the scale its view needs (None: every image the usual way).
    scaled = scaled_decoder(transform, partial(clock.timed, DECODE), partial(clock.timed, AUGMENT))
    put = clock.timed(COLLATE, BatchRows.put)
    for k, samples in batches:
        out = _Decoded()
        into = out.rows = rows(len(samples)) if rows is not None else None
        with seeded(seed_of(k), restore=restore):
            for sample in samples:
                image = sample.get(IMAGE)
                try:
                    if image is None and (done := _scaled_one(sample, scaled)) is not None:
                        image = done  # decoded at the scale its view needs, and transformed
                    else:
                        if image is None:
                            image = decode_one(sample, decode)
                        image = transform_one(sample, image, transform_)
                except CorruptImageError as e:
                    named = e.named(source_path(sample))  # the file it was packed from, read only now
                    if on_corrupt is None:
                        raise named from None
                    on_corrupt(named)
                    continue
                if into is not None:
                    image = put(into, image)
                out.append({**sample, IMAGE: image})
        yield k, out


def _scaled_one(sample: Mapping[str, Any], scaled: ScaledDecoder | None) -> Any:
    """The sample's image decoded at a reduced scale and transformed; ``None``: the usual path."""
    ext = image_member(sample) if scaled is not None else None
    return scaled(sample[ext], ext) if scaled is not None and ext else None


class _Decoded(list[Sample]):
    """A batch's decoded samples; ``rows``: the batch buffer their images were written into, if any."""

    __slots__ = ("rows",)
    rows: BatchRows | None


def collate_batches(
    batches: Batches, *, pool: BufferPool | None, clock: StepClock | NoClock
) -> Iterator[Batch | SentBatch]:
    """Stack ``image`` and ``__label__`` into a :class:`Batch` (in ``pool``'s shared memory in a worker)."""
    for _, samples in batches:
        images = [s[IMAGE] for s in samples]
        labels = [int(s[LABEL]) for s in samples]
        rows = getattr(samples, "rows", None)  # written into a batch buffer as they were made
        batch = clock.timed(COLLATE, collate)(images, labels, pool=pool, rows=rows)
        clock.batch_done(len(labels))
        yield batch if pool is None else pool.sendable(batch)  # a Batch again in the main process


def offload_batches(
    batches: Batches, *, epoch: int, worker: int, shared: bool, clock: StepClock | NoClock
) -> Iterator[RawBatch]:
    """With ``decode_on``: each batch's image bytes and labels as a :class:`RawBatch`.

    In shared memory if ``shared``, for the training process to decode.
    """
    pack = clock.timed(COLLATE, raw_batch)
    for k, samples in batches:
        batch = pack(samples, epoch=epoch, worker=worker, index=k, shared=shared)
        clock.batch_done(len(samples))
        yield batch


def check_stages(name: str, stages: Sequence[Any] | None) -> tuple[Stage, ...]:
    """``stages`` as a tuple, each checked to be callable (a ``wds`` stage, or a function of an iterator)."""
    out = tuple(stages or ())
    for i, stage in enumerate(out):
        if not callable(stage):
            raise ConfigError(
                f"{name}[{i}] is {stage!r}: a stage is a callable from an iterator of samples to an "
                "iterator (wds.map(f), wds.select(pred), or a generator function)"
            )
    return out
