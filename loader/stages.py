"""The stages of a pass, public, in webdataset's stage protocol: callables from an iterator to one.

So they compose with ``wds.DataPipeline`` and with any ``wds`` stage.

Samples are webdataset's sample dicts: ``__key__``, ``__url__`` (the shard), one entry per member
(``jpg``, ``cls``, ``json``... as ``bytes``), plus ``__label__``, the class id the index gives (read
from ``.cls`` or a ``.json`` field, as the split says). After :func:`decode` a sample also has
``image``, ``uint8 [3, H, W]``. Stages never change the dicts they are given; they yield new ones.

A pipeline built by hand starts at :func:`samples` (this rank's and worker's part of the dataset's
epoch, read, interleaved, shuffled), then any ``wds`` stage and :func:`decode`, :func:`augment`,
:func:`label_from_json`, ``wds.batched``. The partition, the epoch's order and the shuffle are
imgshards'; the batch count is whatever the stages leave. A :class:`~imgshards.loader.ShardDataset`
runs the same stages (``raw_stages``, ``image_stages``) on whole batches, so that its guarantees hold
whatever they do (:mod:`imgshards.loader.pipeline.batches`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from torch.utils.data import IterableDataset
from webdataset.filters import pipelinefilter

from .errors import CorruptImageError
from .image.presets import Transform
from .pipeline.batches import IMAGE, LABEL, Sample, Stage, apply, check_stages, decode_one, transform_one
from .pipeline.tar import RawSample

__all__ = [
    "IMAGE",
    "LABEL",
    "Stage",
    "apply",
    "augment",
    "check_stages",
    "decode",
    "label_from_json",
    "samples",
]


# ---- the source of a hand-built pipeline -------------------------------------------------------


class _Reads(Protocol):
    def raw_samples(self) -> Iterator[RawSample]: ...


class _Samples(IterableDataset[RawSample]):
    def __init__(self, dataset: _Reads) -> None:
        super().__init__()
        self.dataset = dataset

    def __iter__(self) -> Iterator[RawSample]:
        return self.dataset.raw_samples()


def samples(dataset: _Reads) -> IterableDataset[RawSample]:
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
            image = decode_one(sample)
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
        yield {**sample, IMAGE: transform_one(sample, sample[IMAGE], transform)}


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
