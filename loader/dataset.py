"""``ShardDataset``: an ``IterableDataset`` over a packed split that yields whole batches.

Per worker and epoch the stages run in this order::

    worker_plan -> read_run per segment -> interleave -> buffer_shuffle -> skip delivered
        -> [decode -> transform] x batch -> collate

Everything before ``decode`` handles raw bytes, so shuffling and resume skipping never decode.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections import deque
from collections.abc import Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from imgshards.converter.manifest import Manifest, SplitInfo, read_manifest

from . import partition
from .batch import Batch, BufferPool, collate
from .decode import decode
from .errors import ConfigError, CorruptImageError, ShardReadError
from .presets import PRESETS, Transform, preset
from .reader import RawSample, read_run
from .shuffle import buffer_shuffle, interleave, worker_rng
from .source import ShardSource
from .stagetimes import AUGMENT, COLLATE, DECODE, NO_CLOCK, READ, NoClock, StageClock, StageTimes

__all__ = ["Mode", "OnError", "ShardDataset"]

Mode = Literal["train", "eval"]
OnError = Literal["skip", "raise"]
MODES: tuple[str, ...] = get_args(Mode)
ON_ERROR: tuple[str, ...] = get_args(OnError)

# Layout of the shared control tensor (see ShardDataset._control): the epoch and resume point, then
# per worker process three counters, then per worker process the free flags of its batch buffers.
_EPOCH, _RESUME, _COUNTERS = 0, 1, 2
_MAX_WORKER_SLOTS = 256
_PER_WORKER = 3
_POOL_BUFFERS = 8
_POOL = _COUNTERS + _PER_WORKER * _MAX_WORKER_SLOTS
_CONTROL_SIZE = _POOL + _POOL_BUFFERS * _MAX_WORKER_SLOTS
_CORRUPT, _TRUNCATED, _UNREADABLE = 0, 1, 2
_TAG_AUGMENT = 3


class ShardDataset(IterableDataset[Batch]):
    """Batches of one split of a packed dataset, split exactly across ranks and DataLoader workers.

    Iterate it through :func:`~imgshards.loader.make_loader` (or a ``DataLoader`` with
    ``batch_size=None``). Each worker reads a contiguous range of the epoch's shuffled shard sequence,
    interleaves the shards it touches, shuffles through a buffer, then decodes, transforms and
    stacks a whole batch, so one message per batch crosses to the main process.

    Guarantees, for ``N`` samples in the split, ``W`` world size and batch size ``B``:

    - ``mode="train"``: every rank yields exactly ``len(dataset)`` batches, the same on every rank:
      ``ceil((N // W) / B)`` (``(N // W) // B`` with ``drop_last``). Each epoch drops ``N mod W``
      samples (fewer than the world size), plus with ``drop_last`` the ``(N // W) mod B`` samples
      of each rank's partial batch: a contiguous run of the shuffled sequence placed anew each epoch,
      so no sample is always left out. Nothing is repeated. Only a rank's last batch can be smaller.
    - ``mode="eval"``: over all ranks every sample comes exactly once; ranks yield
      ``ceil(ceil(N / B) / W)`` or one fewer batch each. Only the globally last batch can be smaller.
    - The order is a pure function of ``(seed, epoch, world size, num_workers)``: the same arguments
      give the same batches (images included: augmentation is seeded per batch) on any machine.

    With ``on_error="skip"`` a corrupt image is dropped from its batch (that batch is one smaller)
    and counted in :attr:`corrupt_skipped`; the batch count does not change. A truncated shard ends
    with a warning; its missing samples are made up by repeating the worker's most recent samples, so
    the batch counts above still hold (a DDP job must not hang on a damaged file).

    A remote shard (``source`` a URL) is streamed in ranged requests: its first samples are read
    before the rest has arrived, and a request that fails with a transient error (connection reset,
    timeout, 5xx) is retried with backoff from where it broke. A shard that keeps failing raises
    :class:`~imgshards.loader.errors.ShardReadError` naming it with ``on_error="raise"``; with
    ``"skip"`` the rest of that shard is skipped, warned about and counted in
    :attr:`unreadable_shards`, and made up for like a truncated shard. With ``cache_dir``, shards are
    written into a local cache of at most ``cache_limit`` bytes as they stream, the next
    ``prefetch`` shards of each worker are downloaded ahead, and later epochs read from the cache
    (see :mod:`imgshards.loader.cache` for its invariants).

    Args:
        source: Directory or URL of a packed dataset (holding ``index.json``): ``s3://bucket/prefix``,
            ``gs://...``, ``https://host/path`` or any fsspec URL; or a
            :class:`~imgshards.loader.ShardSource` for finer control of remote reading (request
            size, readahead, retries), which then holds the remote options below.
        split: Which split to read.
        batch_size: Samples per batch.
        mode: ``"train"`` (equal batches on every rank, shuffled) or ``"eval"`` (every sample once).
        transform: A preset name (``"train"``, ``"resnet"``, ``"eval"``) or a callable from ``uint8
            [3, H, W]`` to ``uint8 [3, h, w]`` of one fixed size; default: the preset named like
            ``mode``. A callable that draws random numbers should use torch's default generator,
            which is seeded per batch.
        image_size: Output size of a preset transform.
        shuffle: Shuffle shard order and samples (default: in train mode only).
        shuffle_buffer: Samples in each worker's shuffle buffer (``<= 1``: no buffer).
        shuffle_initial: Samples in the buffer before the first is yielded (fast start).
        drop_last: Train mode only: drop each rank's partial last batch.
        seed: Seed of every random choice; the same on every rank.
        rank: This process's rank; default ``torch.distributed``'s rank, or 0.
        world_size: Number of ranks; default ``torch.distributed``'s world size, or 1.
        on_error: ``"skip"`` (drop, count and warn) or ``"raise"`` for an image that does not decode
            or a remote shard that cannot be read.
        storage_options: Options of the URL's fsspec file system (endpoint, credentials...);
            fsspec's own configuration applies as usual.
        cache_dir: Local directory caching remote shards, shared by workers and ranks of a machine.
        cache_limit: Most bytes the cache directory holds (required with ``cache_dir``).
        prefetch: Shards each worker downloads into the cache ahead of its reading.

    Raises:
        ManifestError: no index at ``source``, a bad index, an unknown split, or a missing shard.
        ConfigError: an argument out of range or not among the allowed values.

    """

    def __init__(
        self,
        source: str | os.PathLike[str] | ShardSource,
        *,
        split: str = "train",
        batch_size: int = 64,
        mode: Mode = "train",
        transform: str | Transform | None = None,
        image_size: int = 224,
        shuffle: bool | None = None,
        shuffle_buffer: int = 2000,
        shuffle_initial: int = 100,
        drop_last: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        on_error: OnError = "skip",
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        prefetch: int = 2,
    ) -> None:
        super().__init__()
        _check_choice("mode", mode, MODES)
        _check_choice("on_error", on_error, ON_ERROR)
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        if seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {seed}")
        if drop_last and mode == "eval":
            raise ConfigError("drop_last applies to mode='train' only: eval yields every sample exactly once")
        if shuffle_buffer < 0 or shuffle_initial < 0:
            raise ConfigError(
                f"shuffle_buffer and shuffle_initial must be >= 0, got {shuffle_buffer}, {shuffle_initial}"
            )
        rank, world_size = _resolve_rank(rank, world_size)

        if isinstance(source, ShardSource):
            if storage_options is not None or cache_dir is not None or cache_limit is not None:
                raise ConfigError(
                    "pass storage_options, cache_dir and cache_limit to the ShardSource, not beside it"
                )
            self.source = source
        else:
            self.source = ShardSource(
                source,
                storage_options=storage_options,
                cache_dir=cache_dir,
                cache_limit=cache_limit,
                prefetch=prefetch,
            )
        self.root: Path | str = self.source.root if self.source.remote else Path(self.source.root)
        self.manifest: Manifest = read_manifest(self.root, storage_options=self.source.storage_options)
        self.split_info: SplitInfo = self.manifest.split(split)
        self.source.check(self.split_info.shards, split)

        if transform is None:
            transform = mode
        if isinstance(transform, str):
            transform = preset(transform, size=image_size)
        elif not callable(transform):
            raise ConfigError(f"transform must be one of {list(PRESETS)} or a callable, got {transform!r}")

        self.split = split
        self.batch_size = batch_size
        self.mode: Mode = mode
        self.transform: Transform = transform
        self.shuffle = (mode == "train") if shuffle is None else shuffle
        self.shuffle_buffer = shuffle_buffer
        self.shuffle_initial = shuffle_initial
        self.drop_last = drop_last
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.on_error: OnError = on_error
        self._shard_samples = tuple(s.samples for s in self.split_info.shards)
        # Shared with the DataLoader workers, persistent ones included (they hold a copy of this
        # object made once, at their start): the epoch and the resume point are read from here at
        # the start of every pass, and each worker adds up what it skipped in its own slots.
        self._control = torch.zeros(_CONTROL_SIZE, dtype=torch.int64).share_memory_()
        self._pool: BufferPool | None = None  # made in each worker process, on its first batch
        # Off unless a profiler attaches one before the workers start (imgshards.loader.profiling):
        # then each worker times its stages and counts its batches in it.
        self.stage_times: StageTimes | None = None

    # ---- what an epoch holds ------------------------------------------------------------------

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; a label is a position in this tuple."""
        return self.manifest.classes

    @property
    def num_samples(self) -> int:
        """Samples in the split."""
        return sum(self._shard_samples)

    @property
    def dropped_per_epoch(self) -> int:
        """Samples of the split no rank sees in one epoch (0 in eval mode; see the class docstring)."""
        return partition.dropped_samples(
            self.num_samples,
            world_size=self.world_size,
            batch_size=self.batch_size,
            train=self.mode == "train",
            drop_last=self.drop_last,
        )

    def __len__(self) -> int:
        """Batches this rank yields in one epoch, for any number of DataLoader workers."""
        return partition.rank_batches(
            self.num_samples,
            world_size=self.world_size,
            batch_size=self.batch_size,
            train=self.mode == "train",
            drop_last=self.drop_last,
        )[self.rank]

    # ---- state shared with the workers -------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next pass reads."""
        return int(self._control[_EPOCH])

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass read epoch ``epoch`` (another shard order and sample order)."""
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        self._control[_EPOCH] = epoch

    def _set_resume(self, batches: int) -> None:
        """Make the next pass skip the first ``batches`` batches this rank would yield (resume)."""
        self._control[_RESUME] = batches

    @property
    def corrupt_skipped(self) -> int:
        """Images skipped because they did not decode, over all passes so far (all workers)."""
        return int(self._control[_COUNTERS + _CORRUPT : _POOL : _PER_WORKER].sum())

    @property
    def truncated_shards(self) -> int:
        """Times a shard ended before its index said it would, over all passes so far."""
        return int(self._control[_COUNTERS + _TRUNCATED : _POOL : _PER_WORKER].sum())

    @property
    def unreadable_shards(self) -> int:
        """Times a remote shard was skipped because it could not be read, over all passes so far."""
        return int(self._control[_COUNTERS + _UNREADABLE : _POOL : _PER_WORKER].sum())

    def _count(self, worker: int, what: int) -> None:
        self._control[_COUNTERS + _PER_WORKER * (worker % _MAX_WORKER_SLOTS) + what] += 1

    def _worker_pool(self, process: int) -> BufferPool:
        if self._pool is None:
            first = _POOL + _POOL_BUFFERS * (process % _MAX_WORKER_SLOTS)
            self._pool = BufferPool(self._control[first : first + _POOL_BUFFERS], first_token=first)
        return self._pool

    def _release(self, token: int) -> None:
        """Hand a worker's batch buffer back to it (the main process no longer refers to that batch)."""
        assert _POOL <= token < _CONTROL_SIZE, token
        self._control[token] = 1

    # ---- iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        # Read the shared state now: a DataLoader creates this iterator when a pass starts.
        epoch, resume = int(self._control[_EPOCH]), int(self._control[_RESUME])
        # DataLoader asks worker 0 first on every pass, but after `resume` batches the next one is
        # worker `resume % num_workers`'s: each process plays the worker whose turn it would be.
        role = partition.resumed_worker(worker, resume, num_workers)
        pool = self._worker_pool(worker) if info is not None else None
        return self._batches(epoch, resume, role, num_workers, pool=pool)

    def _batches(
        self, epoch: int, resume: int, worker: int, num_workers: int, *, pool: BufferPool | None
    ) -> Iterator[Batch]:
        plan = partition.worker_plan(
            self._shard_samples,
            seed=self.seed,
            epoch=epoch,
            rank=self.rank,
            world_size=self.world_size,
            worker=worker,
            num_workers=num_workers,
            batch_size=self.batch_size,
            train=self.mode == "train",
            drop_last=self.drop_last,
            shuffle=self.shuffle,
        )
        done = partition.delivered_by_worker(resume, num_workers)[worker]
        clock = NO_CLOCK if self.stage_times is None else self.stage_times.clock()
        raw = clock.timed_iter(READ, self._raw_stream(plan, epoch, worker))
        recent: deque[RawSample] = deque(maxlen=self.batch_size)
        raw = _remember(raw, recent)
        # Resume: the samples of batches already delivered are read and dropped, never decoded.
        skip = min(done * self.batch_size, plan.samples)
        for _ in islice(raw, skip):
            pass
        for k in range(done, plan.batches):
            size = min(self.batch_size, plan.samples - k * self.batch_size)
            samples = list(islice(raw, size))
            if len(samples) < size:
                samples += self._make_up(recent, size - len(samples))
                if not samples:
                    return
            with _seeded(_augment_seed(self.seed, epoch, self.rank, worker, k), restore=pool is None):
                images, labels = self._decode_batch(samples, worker, clock)
            batch = clock.timed(COLLATE, collate)(images, labels, pool=pool)
            clock.batch_done(len(labels))
            yield batch
        # A DataLoader worker may exit once its pass is over: its downloads must reach the cache first.
        self.source.settle()

    def _raw_stream(self, plan: partition.WorkerPlan, epoch: int, worker: int) -> Iterator[RawSample]:
        shards = self.split_info.shards

        def on_truncated(message: str) -> None:
            self._count(worker, _TRUNCATED)
            warnings.warn(message, RuntimeWarning, stacklevel=2)

        self.source.plan([shards[seg.shard] for seg in plan.segments])  # prefetch in this order
        runs = [
            self._unless_unreadable(
                read_run(
                    self.source.url(shards[seg.shard].name),
                    seg.start,
                    seg.stop,
                    on_truncated=on_truncated,
                    opener=functools.partial(self.source.open, shards[seg.shard]),
                ),
                worker,
            )
            for seg in plan.segments
        ]
        sizes = [len(seg) for seg in plan.segments]
        if not self.shuffle:
            return (sample for run in runs for sample in run)
        rng = worker_rng(self.seed, epoch, self.rank, worker)
        mixed = interleave(runs, sizes, rng)
        return buffer_shuffle(mixed, rng, size=self.shuffle_buffer, initial=self.shuffle_initial)

    def _unless_unreadable(self, run: Iterator[RawSample], worker: int) -> Iterator[RawSample]:
        """End a run whose shard cannot be read (skip: warn and count), or raise with on_error="raise"."""
        try:
            yield from run
        except ShardReadError as e:
            if self.on_error == "raise":
                raise
            self._count(worker, _UNREADABLE)
            warnings.warn(f"skipped the rest of a shard: {e}", RuntimeWarning, stacklevel=2)

    def _make_up(self, recent: deque[RawSample], missing: int) -> list[RawSample]:
        """Repeat recent samples in place of those a truncated shard lost, keeping the batch count."""
        if not recent:
            warnings.warn(
                f"rank {self.rank}: a truncated shard left a worker with no samples at all; this rank "
                "yields fewer batches this epoch than len() says (in DDP, other ranks may wait)",
                RuntimeWarning,
                stacklevel=3,
            )
            return []
        pool = list(recent)
        return [pool[i % len(pool)] for i in range(missing)]

    def _decode_batch(
        self, samples: list[RawSample], worker: int, clock: StageClock | NoClock = NO_CLOCK
    ) -> tuple[list[torch.Tensor], list[int]]:
        images: list[torch.Tensor] = []
        labels: list[int] = []
        decode_, transform = clock.timed(DECODE, decode), clock.timed(AUGMENT, self.transform)
        for s in samples:
            try:
                image = decode_(s.data, s.ext, key=s.key, shard=s.shard)
            except CorruptImageError as e:
                if self.on_error == "raise":
                    raise
                self._count(worker, _CORRUPT)
                warnings.warn(f"skipped: {e}", RuntimeWarning, stacklevel=2)
                continue
            images.append(transform(image))
            labels.append(s.label)
        return images, labels

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({str(self.root)!r}, split={self.split!r}, mode={self.mode!r}, "
            f"batch_size={self.batch_size}, samples={self.num_samples}, rank={self.rank}/{self.world_size}, "
            f"transform={self.transform!r})"
        )


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"unknown {name} {value!r}; expected one of {list(allowed)}")


def _resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    dist = torch.distributed
    initialized = dist.is_available() and dist.is_initialized()
    if world_size is None:
        world_size = dist.get_world_size() if initialized else 1
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return rank, world_size


def _remember(samples: Iterator[RawSample], recent: deque[RawSample]) -> Iterator[RawSample]:
    for s in samples:
        recent.append(s)
        yield s


def _augment_seed(seed: int, epoch: int, rank: int, worker: int, batch: int) -> int:
    """Seed of torch's generator while batch ``batch`` of a worker is transformed."""
    return int(np.random.SeedSequence([seed, epoch, _TAG_AUGMENT, rank, worker, batch]).generate_state(1)[0])


@contextlib.contextmanager
def _seeded(seed: int, *, restore: bool) -> Iterator[None]:
    """Seed torch's default CPU generator; in the main process, put its state back afterwards."""
    state = torch.get_rng_state() if restore else None
    torch.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        if state is not None:
            torch.set_rng_state(state)
