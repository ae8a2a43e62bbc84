"""The stages of a pass, public, in webdataset's stage protocol: callables from an iterator to one.

So they compose with ``wds.DataPipeline`` and with any ``wds`` stage.

Samples are webdataset's sample dicts: ``__key__``, ``__url__`` (the shard), one entry per member
(``jpg``, ``cls``, ``json``... as ``bytes``), plus ``__label__``, the class id the index gives (read
from ``.cls`` or a ``.json`` field, as the split says). After :func:`decode` a sample also has
``image``, ``uint8 [3, H, W]``. Stages never change the dicts they are given; they yield new ones.

Two levels, one pipeline each:

- **Samples**, for a pipeline built by hand: :func:`samples` (the source: this rank's and worker's
  part of the dataset's epoch, read, interleaved, shuffled), then any ``wds`` stage and
  :func:`decode`, :func:`augment`, :func:`label_from_json`, ``wds.batched``. The partition, the
  epoch's order and the shuffle are imgshards'; the batch count is whatever the stages leave.
- **Batches** ``(k, [samples])``, batch ``k`` of this worker, what :class:`~imgshards.loader.ShardDataset`
  runs so that its guarantees hold whatever the user's stages do::

      raw samples -> batches (cut on the raw sequence; damaged shards made up) -> each(raw stages)
          -> decode_batches (decode -> transform, seeded per batch) -> each(image stages)
          -> collate_batches                     (or, with decode_on, raw_batches: bytes to the GPU)

  A batch is cut from the raw sequence before any user stage runs, so a filter cannot move batch
  boundaries: resume stays exact, and in train mode :func:`each` makes up what a filter dropped
  (repeating the batch's, or the worker's latest, kept samples), so every rank keeps ``len()``
  batches. In eval mode the dropped samples are counted, not made up.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from torch.utils.data import IterableDataset
from webdataset.filters import pipelinefilter

from .device.offload import RawBatch, raw_batch
from .errors import ConfigError, CorruptImageError, ImageShapeError
from .image.decode import decode as decode_image
from .image.presets import Transform
from .image.scaled import ScaledDecoder, scaled_decoder
from .pipeline.batch import Batch, BatchRows, BufferPool, SentBatch, collate
from .pipeline.read import batched, seeded
from .pipeline.reader import RawSample, image_member, sample_shard
from .pipeline.steps import AUGMENT, COLLATE, DECODE, NO_CLOCK, NoClock, StepClock

if TYPE_CHECKING:
    from .dataset import ShardDataset

__all__ = [
    "IMAGE",
    "LABEL",
    "Stage",
    "apply",
    "augment",
    "batches",
    "check_stages",
    "collate_batches",
    "decode",
    "decode_batches",
    "each",
    "label_from_json",
    "raw_batches",
    "samples",
]

Sample = dict[str, Any]
Stage = Callable[[Iterator[Any]], Iterator[Any]]
IMAGE = "image"  # the decoded image, uint8 [3, H, W]
LABEL = "__label__"  # the class id


def apply(stages: Sequence[Stage], items: Iterable[Any]) -> Iterator[Any]:
    """Run ``items`` through ``stages`` in order, as ``wds.DataPipeline`` runs its stages."""
    it: Iterator[Any] = iter(items)
    for stage in stages:
        it = iter(stage(it))
    return it


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


def _decode_one(sample: Mapping[str, Any], decode_: Callable[..., Any] = decode_image) -> Any:
    ext = image_member(sample)
    if not ext:
        raise CorruptImageError.for_sample(
            str(sample.get("__key__")), sample_shard(sample), "no image member"
        )
    return decode_(sample[ext], ext, key=str(sample.get("__key__")), shard=sample_shard(sample))


def _scaled_one(sample: Mapping[str, Any], scaled: ScaledDecoder | None) -> Any:
    """The sample's image decoded at a reduced scale and transformed; ``None``: the usual path."""
    ext = image_member(sample) if scaled is not None else None
    return scaled(sample[ext], ext) if scaled is not None and ext else None


def _transform_one(sample: Mapping[str, Any], image: Any, transform: Transform) -> Any:
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


# ---- the source of a hand-built pipeline -------------------------------------------------------


class _Samples(IterableDataset[RawSample]):
    def __init__(self, dataset: ShardDataset) -> None:
        super().__init__()
        self.dataset = dataset

    def __iter__(self) -> Iterator[RawSample]:
        from .pipeline.passes import raw_samples  # the pass module builds on these stages

        return raw_samples(self.dataset, self.dataset.begin_pass())


def samples(dataset: ShardDataset) -> IterableDataset[RawSample]:
    """Source stage: this process's raw samples of ``dataset``'s current epoch (``dataset.set_epoch``).

    The samples of this rank and DataLoader worker (imgshards' partition replaces webdataset's
    ``split_by_node`` and ``split_by_worker``), read by the fast reader with every member, in the
    order of a ``ShardDataset`` pass: shards interleaved and shuffled through the buffer. A pipeline
    that starts here is a ``wds.DataPipeline`` to run under a ``DataLoader`` (or ``wds.WebLoader``)
    with ``batch_size=None``; how many batches it yields is up to its stages.
    """
    return _Samples(dataset)


# ---- sample stages ------------------------------------------------------------------------------


def _decode(
    data: Iterable[Sample], on_corrupt: Callable[[CorruptImageError], None] | None = None
) -> Iterator[Sample]:
    for sample in data:
        if IMAGE in sample:  # decoded by a stage of the user's (a custom decoder)
            yield sample
            continue
        try:
            image = _decode_one(sample)
        except CorruptImageError as e:
            if on_corrupt is None:
                raise
            on_corrupt(e)
            continue
        yield {**sample, IMAGE: image}


decode = pipelinefilter(_decode)
decode.__doc__ = """Stage: add ``image`` (``uint8 [3, H, W]``, RGB) decoded from each sample's image member.

A sample that already has ``image`` (a custom decoder ran before) passes as it is. One that does
not decode goes to ``on_corrupt`` and is dropped; without ``on_corrupt`` it raises
:class:`~imgshards.loader.CorruptImageError`.
"""


def _augment(data: Iterable[Sample], transform: Transform) -> Iterator[Sample]:
    for sample in data:
        yield {**sample, IMAGE: _transform_one(sample, sample[IMAGE], transform)}


augment = pipelinefilter(_augment)
augment.__doc__ = (
    """Stage: ``image = transform(image)`` (a preset, or any callable on ``uint8 [3, H, W]``)."""
)


def _label_from_json(
    data: Iterable[Sample], field: str, classes: Sequence[str] | None = None
) -> Iterator[Sample]:
    index = {name: i for i, name in enumerate(classes or ())}
    for sample in data:
        value = json.loads(sample["json"]).get(field) if "json" in sample else None
        if isinstance(value, str) and value in index:
            label = index[value]
        elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            label = value
        else:
            raise ValueError(
                f"sample {sample.get('__key__')!r}: .json field {field!r} is {value!r}, neither a class id "
                f"nor one of the {len(index)} class names given"
            )
        yield {**sample, LABEL: label}


label_from_json = pipelinefilter(_label_from_json)
label_from_json.__doc__ = """Stage: ``__label__`` from a field of each sample's ``.json`` (a class id,
or a name looked up in ``classes``). Raises ``ValueError`` naming the sample when there is neither.
"""


# ---- batch stages: (k, [samples]) ---------------------------------------------------------------


def _batches(
    data: Iterable[RawSample],
    sizes: Sequence[int],
    first: int = 0,
    make_up: Callable[[], Iterator[RawSample]] | None = None,
) -> Iterator[tuple[int, list[RawSample]]]:
    yield from batched(iter(data), sizes=sizes, first=first, make_up=make_up)


batches = pipelinefilter(_batches)
batches.__doc__ = """Stage: cut raw samples into this worker's batches ``(k, samples)`` of ``sizes[k]``.

From batch ``first`` on (earlier ones were delivered before a resume: read, never decoded). In
train mode (``make_up`` given) the samples a damaged shard did not give are made up by repeating
the latest ones, so the batch count holds (see :func:`~imgshards.loader.pipeline.batched`).
"""


def _each(
    data: Iterable[tuple[int, list[Sample]]],
    stages: Sequence[Stage],
    *,
    make_up: bool,
    on_dropped: Callable[[int], None],
    seed_of: Callable[[int], int] | None = None,
) -> Iterator[tuple[int, list[Sample]]]:
    """See :data:`each`."""
    it = iter(data)
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
            item = next(it, None)
            if item is None:
                return
            k, size, kept = run(*item)
        dropped = size - len(kept)
        if dropped > 0:
            on_dropped(dropped)
        recent.extend(kept)
        if dropped > 0 and make_up:
            while not recent:  # nothing kept yet: take from the batches after this one
                item = next(it, None)
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


each = pipelinefilter(_each)
each.__doc__ = """Stage on batches: run each batch's samples through ``stages`` (any sample stages,
``wds.select``, ``wds.map``...).

The samples a stage drops are told to ``on_dropped`` (a count per batch); with ``make_up`` they are
replaced by repeating the batch's kept samples (or, if it kept none, the worker's latest), so the
batch keeps its size. With ``seed_of``, torch's generator is seeded with ``seed_of(k)`` while
batch ``k`` runs, so a stage drawing from it is reproducible.
"""


def _decode_batches(
    data: Iterable[tuple[int, list[Sample]]],
    transform: Transform,
    *,
    seed_of: Callable[[int], int],
    restore: bool,
    on_corrupt: Callable[[CorruptImageError], None] | None,
    clock: StepClock | NoClock = NO_CLOCK,
    rows: Callable[[int], BatchRows] | None = None,
) -> Iterator[tuple[int, list[Sample]]]:
    """See :data:`decode_batches`."""
    decode_, transform_ = clock.timed(DECODE, decode_image), clock.timed(AUGMENT, transform)
    # A preset decodes a large JPEG at the scale its view needs (None: every image the usual way).
    scaled = scaled_decoder(transform, partial(clock.timed, DECODE), partial(clock.timed, AUGMENT))
    put = clock.timed(COLLATE, BatchRows.put)
    for k, samples in data:
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
                            image = _decode_one(sample, decode_)
                        image = _transform_one(sample, image, transform_)
                except CorruptImageError as e:
                    if on_corrupt is None:
                        raise
                    on_corrupt(e)
                    continue
                if into is not None:
                    image = put(into, image)
                out.append({**sample, IMAGE: image})
        yield k, out


class _Decoded(list[Sample]):
    """A batch's decoded samples; ``rows``: the batch buffer their images were written into, if any."""

    __slots__ = ("rows",)
    rows: BatchRows | None


decode_batches = pipelinefilter(_decode_batches)
decode_batches.__doc__ = """Stage on batches: decode and transform every sample of batch ``k`` with
torch's generator seeded by ``seed_of(k)`` (``restore``: put the caller's generator state back).
With a preset, a large JPEG is decoded at the scale its view needs (:mod:`~imgshards.loader.image.scaled`).
An image that does not decode, or that the transform refuses (a shape a preset will not resize,
:class:`~imgshards.loader.ImageShapeError`; memory it cannot have), goes to ``on_corrupt`` and
leaves its batch one smaller (raises without ``on_corrupt``). With ``rows`` (a batch buffer for
``n`` images, :class:`~imgshards.loader.pipeline.batch.BatchRows`) each image is written into its batch's
buffer as soon as it is made, and :data:`collate_batches` takes the rows as they stand.
"""


def _raw_batches(
    data: Iterable[tuple[int, list[Sample]]],
    *,
    epoch: int,
    worker: int,
    shared: bool,
    clock: StepClock | NoClock = NO_CLOCK,
) -> Iterator[RawBatch]:
    for k, samples in data:
        batch = clock.timed(COLLATE, raw_batch)(samples, epoch=epoch, worker=worker, index=k, shared=shared)
        clock.batch_done(len(samples))
        yield batch


raw_batches = pipelinefilter(_raw_batches)
raw_batches.__doc__ = """Stage on batches, with ``decode_on``: pack each batch's image bytes into a
:class:`~imgshards.loader.device.offload.RawBatch` (in shared memory if ``shared``) for the training
process to decode."""


def _collate_batches(
    data: Iterable[tuple[int, list[Sample]]],
    *,
    pool: BufferPool | None = None,
    clock: StepClock | NoClock = NO_CLOCK,
) -> Iterator[Batch | SentBatch]:
    for _, samples in data:
        images = [s[IMAGE] for s in samples]
        labels = [int(s[LABEL]) for s in samples]
        rows = getattr(samples, "rows", None)  # written into a batch buffer as they were made
        batch = clock.timed(COLLATE, collate)(images, labels, pool=pool, rows=rows)
        clock.batch_done(len(labels))
        yield batch if pool is None else pool.sendable(batch)  # a Batch again in the main process


collate_batches = pipelinefilter(_collate_batches)
collate_batches.__doc__ = """Stage on batches: stack ``image`` and ``__label__`` into a
:class:`~imgshards.loader.Batch` (in ``pool``'s shared memory in a DataLoader worker)."""
