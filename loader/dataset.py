"""``ShardDataset``: an ``IterableDataset`` over a packed split that yields whole batches.

:class:`PassDataset` is what every dataset of the loader shares (a :class:`~.mix.MixedDataset`
too): the epoch, shared with the DataLoader workers (:mod:`.state`), and a pass, which starts from
where the epoch stands and runs :func:`.pipeline.passes.worker_pass` on the dataset's frozen
settings. :class:`ShardDataset` reads one split: its settings are fixed once, in ``__init__``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from torch.utils.data import IterableDataset, get_worker_info

from imgshards.converter.locate import INDEX_NAME, is_url, local_path, redact_url
from imgshards.converter.manifest import Manifest, SplitInfo, read_manifest

from .epoch import elastic, partition
from .epoch.position import PassPosition
from .errors import ConfigError, ShardReadError, check_choice
from .image.pil_input import user_transform
from .image.presets import PRESETS, Transform, preset
from .pipeline.batches import Batches
from .pipeline.collate import Batch, BufferPool
from .pipeline.offload import DecodeOn, RawBatch
from .pipeline.passes import ImageSettings, ReadSettings, raw_pass, raw_samples, worker_pass
from .pipeline.steps import NO_CLOCK, NoClock, StepClock, StepTimes
from .pipeline.tar import RawSample
from .remote import ShardSource
from .remote.ranges import DEFAULT_TIMEOUT
from .stages import Stage, check_stages
from .state.checkpoint import EpochState, shards_digest
from .state.cursor import Counters, SharedControl
from .state.ranks import settle_ranks

__all__ = ["DEFAULT_MAX_LOST", "Mode", "OnError", "PassDataset", "ShardDataset", "allowed_lost"]

Mode = Literal["train", "eval"]
OnError = Literal["skip", "raise"]
MODES: tuple[str, ...] = get_args(Mode)
ON_ERROR: tuple[str, ...] = get_args(OnError)
DEFAULT_MAX_LOST = 0.01  # a pass may lose 1% of a rank's samples to damaged shards, warned about


def allowed_lost(max_lost: float, planned: int) -> int:
    """The samples a pass that planned ``planned`` may lose: ``floor(max_lost x planned)``, exactly.

    ``max_lost`` counts as the decimal it is written as: ``max_lost=0.29`` of 100 samples allows 29,
    where the float product ``0.29 * 100`` is 28.999999999999996.
    """
    return math.floor(Fraction(str(max_lost)) * planned)


class PassDataset(EpochState, IterableDataset[Batch | RawBatch]):
    """An epoch of batches, shared with the DataLoader workers, and the pass each of them runs.

    A subclass sets its settings (:attr:`image_settings`, the attributes :class:`EpochState` reads) and
    says how a pass gets its raw batches (:meth:`_raw`), how many batches a leg has
    (:meth:`leg_batches`) and how many samples a rank's pass plans (:meth:`rank_samples`).
    """

    image_settings: ImageSettings
    split: str
    mode: Mode
    batch_size: int
    seed: int
    num_samples: int
    max_lost: float
    decode_on: DecodeOn | None

    def __init__(self, rank: int | None, world_size: int | None) -> None:
        super().__init__()
        # Checked now for an early error, but settled as each pass starts (see .state.ranks).
        settle_ranks(rank, world_size)
        self._asked = (rank, world_size)
        # Shared with the DataLoader workers, persistent ones included (they hold a copy of this
        # object made once, at their start): the epoch and the resume point are read from here at
        # the start of every pass, and each worker adds up what it skipped in its own slots.
        self._control = SharedControl()
        self._pool: BufferPool | None = None  # made in each worker process, on its first batch
        # This process's pass, for state_dict() (``first``: the batches made); and a place loaded by
        # load_state_dict() that the next pass of this process starts from.
        self._progress = PassPosition()
        self._pending: PassPosition | None = None
        # Set by a ShardLoader: it begins each pass in the training process. Else (a plain DataLoader)
        # the workers settle each pass among themselves; _passes counts this copy's passes for that.
        self.loader_passes = False
        self._passes = 0
        # Off unless a profiler attaches one before the workers start (imgshards.loader.profiling):
        # then each worker times its steps and counts its batches in it.
        self.step_times: StepTimes | None = None

    @property
    def transform(self) -> Transform:
        """The transform each image goes through (a preset, or the caller's)."""
        return self.image_settings.transform

    @property
    def on_error(self) -> str:
        """``"skip"`` (drop, count and warn) or ``"raise"``."""
        return self.image_settings.on_error

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch, for any number of DataLoader workers.

        Batches, not samples, on purpose: this dataset yields whole batches (``DataLoader(...,
        batch_size=None)``), and a DataLoader's ``len()`` over an ``IterableDataset`` is
        ``len(dataset)``, so ``len(loader)`` is right in every trainer. :attr:`num_samples` counts
        samples. After an elastic resume it counts the epoch's batches delivered before it too.
        """
        return sum(k for _, _, k in self.cursor.legs) + self.leg_batches()

    def leg_batches(self) -> int:
        """Batches this rank yields in the current leg of the epoch (the epoch, without a resume)."""
        raise NotImplementedError

    def rank_samples(self) -> int:
        """Samples this rank's pass plans to deliver (what :attr:`max_lost` is a share of)."""
        raise NotImplementedError

    def check_lost(self, epoch: int, lost: int) -> None:
        """Raise :class:`ShardReadError` if this rank's pass of ``epoch`` lost more than ``max_lost`` allows.

        ``lost``: the samples the pass's plan held that damaged or unreadable shards did not give.
        :class:`~imgshards.loader.ShardLoader` calls it as it hands over a pass's last batch (or
        after the pass, if it ended short). A pass may lose :func:`allowed_lost` samples, a whole number.
        Each rank judges its own pass, with no collective
        operation: a rank that raises ends a ``torchrun`` or Lightning job (the launcher stops the
        other ranks), where a collective would leave them waiting on it if it never got there.
        """
        planned = self.rank_samples()
        if lost and (lost > allowed_lost(self.max_lost, planned) or lost >= planned):
            roots = self._roots()
            verify = " and ".join(f"`imgshards verify {redact_url(str(root))}`" for root in roots)
            raise ShardReadError(
                f"epoch {epoch}: rank {self.rank} lost {lost} of its {planned} sample(s) of split "
                f"{self.split!r} at {', '.join(redact_url(str(r)) for r in roots)} to truncated or "
                f"unreadable shards, more than max_lost={self.max_lost:g} allows: run {verify} to name them "
                "and repack or replace them (or raise max_lost)"
            )

    def _roots(self) -> list[Path | str]:
        """Where the data is."""
        raise NotImplementedError

    def _sources(self) -> list[ShardSource]:
        """What the pass reads from (settled as it ends: downloads reach the cache)."""
        raise NotImplementedError

    def release(self, token: int, storage: torch.UntypedStorage) -> None:
        """Hand a worker's batch buffer back to it (the main process no longer refers to that batch)."""
        self._control.release(token, storage)

    def kept_buffer(self, token: int) -> torch.UntypedStorage | None:
        """The batch buffer ``token`` as this (main) process keeps it mapped, if it does."""
        return self._control.kept_buffer(token)

    def forget_buffers(self) -> None:
        """Unmap the batch buffers kept for workers that exited (see :mod:`.pipeline.collate`)."""
        self._control.forget_buffers()

    def counters(self, worker: int) -> Counters:
        """The counters of process ``worker``, a handle its pass counts in."""
        return self._control.counters(worker)

    # ---- a pass -----------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch | RawBatch]:
        at = self.begin_pass()
        info = get_worker_info()
        if info is not None and self._pool is None:
            self._pool = self._control.pool(info.id)  # made in each worker process, on its first pass
        return self.worker_batches(at, pool=self._pool if info is not None else None)

    def worker_batches(self, at: PassPosition, *, pool: BufferPool | None = None) -> Iterator[Any]:
        """The batches the worker of ``at`` makes in its pass, from batch ``at.first`` on.

        In a DataLoader worker ``pool`` holds its batch buffers in shared memory.
        """
        clock = NO_CLOCK if self.step_times is None else self.step_times.clock()
        counters = self.counters(at.worker)
        raw = self._raw(at, counters, clock)
        return self._recorded(worker_pass(self.image_settings, raw, at, counters, pool=pool, clock=clock), at)

    def _raw(self, at: PassPosition, counters: Counters, clock: StepClock | NoClock) -> Batches:
        """``(k, raw samples)`` of the pass of ``at``, the user's raw stages run."""
        raise NotImplementedError

    def _recorded(self, batches: Iterator[Any], at: PassPosition) -> Iterator[Any]:
        """``batches``, with where this process's pass is recorded for :meth:`state_dict` as each goes."""
        for k, batch in enumerate(batches, at.first):  # batch k of the worker's plan
            self._progress = at.at(k + 1)
            yield batch
        # A DataLoader worker may exit once its pass is over: its downloads must reach the cache first.
        for source in self._sources():
            source.settle()

    def begin_pass(self) -> PassPosition:
        """Where this process's pass starts, read when a DataLoader starts it (or a torchdata restore).

        Under a :class:`~imgshards.loader.ShardLoader`, the pass it began (:meth:`.state.cursor.
        EpochCursor.pass_state`), as the pass began, not as it is now: the main process may have
        moved it on. Under a plain ``DataLoader`` the workers settle the pass among themselves
        (:meth:`.state.cursor.EpochCursor.plain_pass`): every pass a whole one, the next epoch
        unless ``set_epoch`` said otherwise since the latest pass began.
        """
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        # Settled here in the training process; a worker reads what it recorded.
        rank, world_size = self._pass_ranks()
        if self._pending is not None:  # a torchdata restore: this worker's own place, as saved
            at, self._pending = self._pending, None
            if not self.loader_passes:
                self._plain_pass(info, restored=at.epoch)  # the restored pass is this DataLoader's pass
            at = PassPosition(at.epoch, at.legs, at.first, worker, num_workers, rank, world_size)
        else:
            epoch, legs, resume = self.cursor.pass_state() if self.loader_passes else self._plain_pass(info)
            # DataLoader asks worker 0 first on every pass, but after `resume` batches the next one is
            # worker `resume % num_workers`'s: each process plays the worker whose turn it would be.
            role = partition.resumed_worker(worker, resume, num_workers)
            first = partition.delivered_by_worker(resume, num_workers)[role]
            at = PassPosition(epoch, legs, first, role, num_workers, rank, world_size)
        self._progress = at
        return at

    def _plain_pass(
        self, info: Any, restored: int | None = None
    ) -> tuple[int, tuple[tuple[int, int, int], ...], int]:
        """The pass of a plain DataLoader this process starts now (see :meth:`.EpochCursor.plain_pass`)."""
        self._passes += 1
        if info is None:  # the training process: each __iter__ is a pass of its own
            return self.cursor.plain_pass(None, None, restored)
        # One value for every worker of a DataLoader pass: DataLoader's base seed (drawn anew for
        # each iterator; a worker's seed is it plus the worker id) and this copy's passes (persistent
        # workers keep their copy, so it counts their passes; new workers copy the training process's).
        token = hash((info.seed - info.id, self._passes)) & 0xFFFF
        return self.cursor.plain_pass(token, info.id, restored)


class ShardDataset(PassDataset):
    """Batches of one split of a packed dataset, split exactly across ranks and DataLoader workers.

    Iterate it through :func:`~imgshards.loader.make_loader` (or a ``DataLoader`` /
    torchdata ``StatefulDataLoader`` with ``batch_size=None``: it makes the batches itself). Every
    pass reads the next epoch, whole; :meth:`set_epoch` sets the epoch of the next one.
    In train mode each worker reads blocks spread over the epoch's shuffled shard sequence (see
    :mod:`.epoch.partition`), interleaves them, shuffles through a buffer, then decodes, transforms and
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
    with a warning and its lost samples are counted in :attr:`lost_samples`. In train mode they are
    made up by repeating the worker's most recent samples (or, when a worker lost every sample it
    had, samples read from the next readable shards), so every rank still yields ``len()`` batches
    (a DDP job must not hang on a damaged file); in eval mode nothing is made up: the batches hold
    what exists and the loader warns how many samples the pass lacked.

    A remote shard (``source`` a URL) is streamed in ranged requests: its first samples are read
    before the rest has arrived, and a request that fails with a transient error (connection reset,
    timeout, 5xx) is retried with backoff from where it broke. A shard that keeps failing raises
    :class:`~imgshards.loader.errors.ShardReadError` naming it with ``on_error="raise"``; with
    ``"skip"`` the rest of that shard is skipped, warned about and counted in
    :attr:`unreadable_shards`, and made up for like a truncated shard. With ``cache_dir``, shards are
    written into a local cache of at most ``cache_limit`` bytes as they stream, the next
    ``prefetch`` shards of each worker are downloaded ahead, and later epochs read from the cache
    (see :mod:`imgshards.loader.remote.cache` for its invariants).

    Args:
        source: Directory or URL of a packed dataset (holding ``index.json``): ``s3://bucket/prefix``,
            ``gs://...``, ``https://host/path`` or any fsspec URL; or a
            :class:`~imgshards.loader.ShardSource` for finer control of remote reading (request
            size, readahead, retries), which then holds the remote options below.
        split: Which split to read.
        batch_size: Samples per batch.
        mode: ``"train"`` (equal batches on every rank, shuffled) or ``"eval"`` (every sample once).
        transform: A preset name (``"train"``, ``"resnet"``, ``"eval"``) or a callable from ``uint8
            [3, H, W]`` to an image tensor of one fixed size (``uint8``, or a float one: a batch
            stacks what it returns); default: the preset named like ``mode``. A torchvision
            transform written for ``ImageFolder`` (one with ``ToTensor`` or ``PILToTensor``) gets
            PIL images, as there (:mod:`.image.pil_input`). A callable that draws random numbers
            should use torch's default generator, which is seeded per batch.
        image_size: Output size of a preset transform.
        shuffle: Shuffle shard order and samples (default: in train mode only).
        shuffle_buffer: Samples in each worker's shuffle buffer (``<= 1``: no buffer).
        shuffle_initial: Samples in the buffer before the first is yielded (fast start).
        drop_last: Train mode only: drop each rank's partial last batch.
        seed: Seed of every random choice; the same on every rank.
        rank: This process's rank, for a job that has neither a process group nor a launcher's
            environment; default 0. Rank and world size are settled as each pass starts (and for
            ``len()``), not here: from ``torch.distributed``'s process group if one is initialized by
            then, else from the launcher's ``RANK`` / ``WORLD_SIZE`` (torchrun), else from these
            arguments; given beside either, they must agree with it (:mod:`.state.ranks`).
        world_size: Number of ranks, as for ``rank``; default 1.
        on_error: ``"skip"`` (drop, count and warn) or ``"raise"`` for an image that does not decode
            or a remote shard that cannot be read.
        max_lost: The share of its samples a rank's pass may lose to truncated or unreadable shards
            (warned about, and made up in train mode); a pass that loses more raises
            :class:`ShardReadError` as its last batch is handed over (:meth:`check_lost`). It may lose
            ``floor(max_lost x planned)`` samples, computed exactly (:func:`allowed_lost`: ``0.29``
            of 100 allows 29). ``0``: any loss raises; ``1``: none does, unless the pass lost every
            sample.
        storage_options: Options of the URL's fsspec file system (endpoint, credentials...);
            fsspec's own configuration applies as usual.
        cache_dir: Local directory caching remote shards, shared by workers and ranks of a machine.
        cache_limit: Most bytes the cache directory holds (required with ``cache_dir``).
        prefetch: Shards each worker downloads into the cache ahead of its reading.
        timeout: Seconds a remote request may wait on the server (to connect, and for each next
            piece of its answer) before the try fails and is retried; a shard whose tries all stall
            is unreadable, as above. A timeout set in ``storage_options`` wins.
        decode_on: ``"cuda"`` (nvjpeg and the presets on the GPU), ``"cpu"`` or a :class:`DecodeOn`:
            the workers only read and batch raw bytes, the training process decodes and augments
            (same order and augmentation) and yields normalized images there (:mod:`.device`).

    Raises:
        ManifestError: no index at ``source``, a bad index, an unknown split, or a missing shard.
        ConfigError: an argument out of range or not among the allowed values, or ``rank`` /
            ``world_size`` that the process group or the launcher's environment contradicts.

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
        max_lost: float = DEFAULT_MAX_LOST,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        prefetch: int = 2,
        timeout: float = DEFAULT_TIMEOUT,
        decode_on: DecodeOn | str | torch.device | None = None,
        raw_stages: Sequence[Stage] | None = None,
        image_stages: Sequence[Stage] | None = None,
    ) -> None:
        super().__init__(rank, world_size)
        check_choice("mode", mode, MODES)
        check_choice("on_error", on_error, ON_ERROR)
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        if seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {seed}")
        if drop_last and mode == "eval":
            raise ConfigError("drop_last applies to mode='train' only: eval yields every sample exactly once")
        if not 0 <= max_lost <= 1:
            raise ConfigError(f"max_lost is a share of the samples, from 0 (none) to 1 (all), got {max_lost}")
        if shuffle_buffer < 0 or shuffle_initial < 0:
            raise ConfigError(
                f"shuffle_buffer and shuffle_initial must be >= 0, got {shuffle_buffer}, {shuffle_initial}"
            )

        if isinstance(source, ShardSource):
            if (
                storage_options is not None
                or cache_dir is not None
                or cache_limit is not None
                or timeout != DEFAULT_TIMEOUT
            ):
                raise ConfigError(
                    "pass storage_options, cache_dir, cache_limit and timeout to the ShardSource, "
                    "not beside it"
                )
            self.source = source
        else:
            self.source = ShardSource(
                _dataset_dir(source),
                storage_options=storage_options,
                cache_dir=cache_dir,
                cache_limit=cache_limit,
                prefetch=prefetch,
                timeout=timeout,
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
        self.shuffle = (mode == "train") if shuffle is None else shuffle
        self.shuffle_buffer = shuffle_buffer
        self.shuffle_initial = shuffle_initial
        self.drop_last = drop_last
        self.seed = seed
        self.max_lost = max_lost
        self.decode_on = DecodeOn.of(decode_on)
        raw_stages = check_stages("raw_stages", raw_stages)
        image_stages = check_stages("image_stages", image_stages)
        if image_stages and self.decode_on is not None:
            raise ConfigError(
                "image_stages run in the workers on decoded images; with decode_on the training process "
                "decodes: transform its batches in the training loop instead"
            )
        shard_samples = tuple(s.samples for s in self.split_info.shards)
        self.num_samples = sum(shard_samples)  # samples in the split (len() counts batches)
        self.shards_digest = shards_digest(self.split_info.shards)  # which data a resume state is of
        self.layout = elastic.Layout(
            shard_samples, seed, batch_size, drop_last, self.shuffle, shuffle_buffer, shuffle_initial
        )
        # What a pass reads, and how it makes batches of it: fixed here, the same in every pass.
        self.read_settings = ReadSettings(
            self.split_info,
            self.source,
            tuple(self.manifest.classes),
            self.layout,
            train=mode == "train",
            on_error=on_error,
            raw_stages=raw_stages,
            views=not (raw_stages or image_stages),
            where=f"split {split!r} at {redact_url(str(self.root))}",
        )
        if self.decode_on is None:
            # A torchvision transform written for ImageFolder (ToTensor...) gets PIL images, as there.
            transform = user_transform(transform)
        self.image_settings = ImageSettings(
            transform, seed, on_error, image_stages=image_stages, offload=self.decode_on is not None
        )

    @property
    def raw_stages(self) -> tuple[Stage, ...]:
        """The user's stages on raw samples."""
        return self.read_settings.raw_stages

    @property
    def image_stages(self) -> tuple[Stage, ...]:
        """The user's stages on decoded images."""
        return self.image_settings.image_stages

    # ---- what an epoch holds ------------------------------------------------------------------

    @property
    def classes(self) -> list[str]:
        """Class names, as ``torchvision.datasets.ImageFolder.classes``: a label is a position here."""
        return list(self.manifest.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label, as ``ImageFolder.class_to_idx``."""
        return {name: i for i, name in enumerate(self.manifest.classes)}

    @property
    def dropped_per_epoch(self) -> int:
        """Samples of the split no rank sees in one epoch (0 in eval mode; see the class docstring)."""
        return partition.dropped_samples(self.num_samples, world_size=self.world_size, **self._kw())

    def leg_batches(self) -> int:
        """Batches this rank yields in the current leg of the epoch (the epoch, without a resume)."""
        rank, world_size = self._pass_ranks()
        if self.mode == "eval":
            return partition.rank_batches(self.num_samples, world_size=world_size, **self._kw())[rank]
        return elastic.rank_batches(
            self.layout, epoch=self.epoch, legs=self.cursor.legs, world_size=world_size
        )

    def batches_in_leg(self, epoch: int, legs: tuple[elastic.Leg, ...], world_size: int) -> int:
        """The most batches a rank yields in ``epoch``'s leg after ``legs`` at ``world_size`` ranks."""
        if self.mode == "eval":  # eval has no legs: its ranks yield one batch apart at most
            return max(partition.rank_batches(self.num_samples, world_size=world_size, **self._kw()))
        return elastic.rank_batches(self.layout, epoch=epoch, legs=legs, world_size=world_size)

    def rank_samples(self) -> int:
        """Samples this rank's pass plans to deliver (what :attr:`max_lost` is a share of)."""
        rank, world_size = self._ranks()
        start, stop = partition.rank_sample_range(
            self.num_samples, rank=rank, world_size=world_size, **self._kw()
        )
        return stop - start

    def resume_settings(self) -> dict[str, Any]:
        """The settings that fix the order of this dataset's epochs, but for the topology."""
        return {
            "split": self.split,
            "shards": self.shards_digest,
            "samples": self.num_samples,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "mode": self.mode,
            "shuffle": self.shuffle,
            "shuffle_buffer": self.shuffle_buffer,
            "shuffle_initial": self.shuffle_initial,
            "drop_last": self.drop_last,
        }

    def _kw(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "train": self.mode == "train", "drop_last": self.drop_last}

    def _roots(self) -> list[Path | str]:
        return [self.root]

    def _sources(self) -> list[ShardSource]:
        return [self.source]

    def _raw(self, at: PassPosition, counters: Counters, clock: StepClock | NoClock) -> Batches:
        return raw_pass(self.read_settings, at, counters, clock=clock)

    def raw_samples(self) -> Iterator[RawSample]:
        """The raw samples of a pass of this process starting now, every member (:func:`.stages.samples`)."""
        at = self.begin_pass()
        return raw_samples(self.read_settings, at, self.counters(at.worker))

    def plan(self, at: PassPosition) -> partition.WorkerPlan:
        """What the worker of ``at`` reads in its pass: segments of shards and the size of each batch."""
        return self.read_settings.plan(at)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({redact_url(str(self.root))!r}, split={self.split!r}, "
            f"mode={self.mode!r}, "
            f"batch_size={self.batch_size}, samples={self.num_samples}, rank={self.rank}/{self.world_size}, "
            f"transform={self.transform!r})"
        )


def _dataset_dir(source: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """``shards/index.json`` -> ``shards``: the shards are read beside their index (as the CLI takes it)."""
    if is_url(source):
        url = str(source)
        return url[: -len(INDEX_NAME) - 1] if url.endswith(f"/{INDEX_NAME}") else source
    path = local_path(source)
    return path.parent if path.suffix == ".json" and path.is_file() else source
