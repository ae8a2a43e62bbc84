"""The stages of one worker's pass over its part of an epoch, each a generator or a plain function.

:class:`~imgshards.loader.ShardDataset` wires them in this order::

    partition.worker_plan -> read_runs -> sample_stream (interleave -> buffer_shuffle)
        -> batched (skip delivered, make up lost samples) -> decode_batch (decode -> transform)
        -> batch.collate

Everything before ``decode_batch`` handles raw bytes, so shuffling and resume skipping never decode.
"""

from __future__ import annotations

import contextlib
import functools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from itertools import islice

import numpy as np
import torch

from imgshards.converter.manifest import ShardInfo

from .decode import decode
from .errors import CorruptImageError, ShardReadError
from .partition import WorkerPlan
from .presets import Transform
from .profiling.stagetimes import AUGMENT, DECODE, NO_CLOCK, NoClock, StageClock
from .reader import RawSample, read_run
from .remote import ShardSource
from .shuffle import buffer_shuffle, interleave

__all__ = ["augment_seed", "batched", "decode_batch", "read_runs", "sample_stream", "seeded"]

_TAG_AUGMENT = 3


def read_runs(
    plan: WorkerPlan,
    shards: Sequence[ShardInfo],
    source: ShardSource,
    *,
    on_truncated: Callable[[str], None],
    on_unreadable: Callable[[ShardReadError], None] | None,
    num_classes: int | None = None,
    on_corrupt: Callable[[CorruptImageError], None] | None = None,
) -> list[Iterator[RawSample]]:
    """One lazy run of raw samples per segment of ``plan``, read from ``source`` in the plan's order.

    A shard that cannot be read ends its run and is reported to ``on_unreadable``; with
    ``on_unreadable=None`` the :class:`ShardReadError` propagates. A sample whose label is not in
    ``0..num_classes-1`` goes to ``on_corrupt`` (raises with None).
    """
    source.plan([shards[seg.shard] for seg in plan.segments])  # prefetch in this order
    runs = []
    for seg in plan.segments:
        shard = shards[seg.shard]
        run = read_run(
            source.url(shard.name),
            seg.start,
            seg.stop,
            on_truncated=on_truncated,
            opener=functools.partial(source.open, shard),
            num_classes=num_classes,
            on_corrupt=on_corrupt,
        )
        runs.append(run if on_unreadable is None else _unless_unreadable(run, on_unreadable))
    return runs


def _unless_unreadable(
    run: Iterator[RawSample], on_unreadable: Callable[[ShardReadError], None]
) -> Iterator[RawSample]:
    try:
        yield from run
    except ShardReadError as e:
        on_unreadable(e)


def sample_stream(
    runs: Sequence[Iterator[RawSample]],
    sizes: Sequence[int],
    rng: np.random.Generator | None,
    *,
    buffer: int,
    initial: int,
) -> Iterator[RawSample]:
    """The worker's samples in order: runs one after another (``rng=None``), or interleaved and shuffled."""
    if rng is None:
        return (sample for run in runs for sample in run)
    return buffer_shuffle(interleave(runs, sizes, rng), rng, size=buffer, initial=initial)


def batched(
    raw: Iterator[RawSample],
    *,
    samples: int,
    batches: int,
    batch_size: int,
    first: int = 0,
    on_empty: Callable[[], None],
) -> Iterator[tuple[int, list[RawSample]]]:
    """Cut ``raw`` into this worker's ``batches`` batches ``(k, samples)``, from batch ``first`` on.

    The samples of batches before ``first`` (delivered before a resume) are read and dropped,
    never decoded. Samples that ``raw`` lacks (a truncated or unreadable shard) are made up by
    repeating the most recent ones, so the batch count holds; with nothing to repeat,
    ``on_empty`` is called and the batches end.
    """
    recent: deque[RawSample] = deque(maxlen=batch_size)
    raw = _remember(raw, recent)
    for _ in islice(raw, min(first * batch_size, samples)):
        pass
    for k in range(first, batches):
        size = min(batch_size, samples - k * batch_size)
        batch = list(islice(raw, size))
        if len(batch) < size:
            batch += _make_up(recent, size - len(batch))
            if not batch:
                on_empty()
                return
        yield k, batch


def _remember(samples: Iterator[RawSample], recent: deque[RawSample]) -> Iterator[RawSample]:
    for s in samples:
        recent.append(s)
        yield s


def _make_up(recent: deque[RawSample], missing: int) -> list[RawSample]:
    pool = list(recent)
    return [pool[i % len(pool)] for i in range(missing)] if pool else []


def decode_batch(
    samples: Sequence[RawSample],
    transform: Transform,
    *,
    on_corrupt: Callable[[CorruptImageError], None] | None,
    clock: StageClock | NoClock = NO_CLOCK,
) -> tuple[list[torch.Tensor], list[int]]:
    """Decode and transform ``samples``; an image that does not decode goes to ``on_corrupt`` (or raises)."""
    images: list[torch.Tensor] = []
    labels: list[int] = []
    decode_, transform_ = clock.timed(DECODE, decode), clock.timed(AUGMENT, transform)
    for s in samples:
        try:
            image = decode_(s.data, s.ext, key=s.key, shard=s.shard)
        except CorruptImageError as e:
            if on_corrupt is None:
                raise
            on_corrupt(e)
            continue
        images.append(transform_(image))
        labels.append(s.label)
    return images, labels


def augment_seed(seed: int, epoch: int, rank: int, worker: int, batch: int) -> int:
    """Seed of torch's generator while batch ``batch`` of a worker is transformed."""
    return int(np.random.SeedSequence([seed, epoch, _TAG_AUGMENT, rank, worker, batch]).generate_state(1)[0])


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
