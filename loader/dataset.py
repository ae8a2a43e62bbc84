"""``ShardDataset``: an ``IterableDataset`` over a packed split that yields whole batches.

A dataset is two things: a frozen :class:`~.pipeline.spec.Spec` of what it reads (its parts, how
images are made, ``max_lost``, ``decode_on``), fixed in ``__init__``, and an
:class:`~.state.progress.EpochProgress`, its epoch shared with the DataLoader workers (the cursor,
the ranks, the counters, torchdata's state). :class:`PassDataset` holds the two (a
:class:`~.mix.MixedDataset` too): a pass starts from where the epoch stands and runs
:func:`.pipeline.passes.worker_pass` on the spec's raw batches. Every setting a user reads is a view
of the spec; setting one after the dataset is made is an error, not a silent change.
:class:`ShardDataset` reads one split: a spec of one part.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import torch
from torch.utils.data import IterableDataset

from imgshards.converter.format.locate import INDEX_NAME, is_url, local_path, redact_url
from imgshards.converter.format.manifest import Manifest, SplitInfo, read_manifest
from imgshards.converter.format.validate import MIN_SAMPLE_BYTES

from .epoch import elastic, partition
from .epoch.position import Leg, PassPosition
from .errors import ConfigError, SettingFixedError, check_choice
from .image.pil_input import user_transform
from .image.presets import PRESETS, Transform, preset
from .pipeline.offload import DecodeOn, RawBatch
from .pipeline.passes import ImageSettings, ReadSettings, raw_samples, worker_pass
from .pipeline.spec import Part, Spec
from .pipeline.steps import NO_CLOCK, StepTimes
from .pipeline.tar import RawSample
from .remote import ShardSource
from .remote.ranges import DEFAULT_TIMEOUT
from .stages import Stage, check_stages
from .state.buffers import Batch, BufferPool
from .state.checkpoint import shards_digest
from .state.cursor import CORRUPT, FILTERED, LOST, TRUNCATED, UNREADABLE, Counters, EpochCursor
from .state.progress import EpochProgress, PassCounts, allowed_lost
from .state.ranks import settle_ranks

__all__ = ["DEFAULT_MAX_LOST", "Mode", "OnError", "PassDataset", "ShardDataset", "allowed_lost"]

Mode = Literal["train", "eval"]
OnError = Literal["skip", "raise"]
MODES: tuple[str, ...] = get_args(Mode)
ON_ERROR: tuple[str, ...] = get_args(OnError)
DEFAULT_MAX_LOST = 0.01  # a pass may lose 1% of a rank's samples to damaged shards, warned about

# Not settings: set by a ShardLoader (it begins each pass) and by a profiler (imgshards.loader.profiling).
_SETTABLE = frozenset({"loader_passes", "step_times"})


class PassDataset(IterableDataset[Batch | RawBatch]):
    """An epoch of batches, shared with the DataLoader workers, and the pass each of them runs.

    It holds a frozen :class:`~.pipeline.spec.Spec` (what to read, how to make images) and an
    :class:`~.state.progress.EpochProgress` (where the epoch is); every setting is a read-only view of
    the spec: settings are fixed when the dataset is made.
    """

    # The names of the maker's arguments: setting one afterwards is refused, naming the way to make a new one.
    _arguments: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, spec: Spec, rank: int | None, world_size: int | None) -> None:
        super().__init__()
        self._spec = spec
        self._progress = EpochProgress(spec, rank, world_size)
        # Off unless a profiler attaches one before the workers start (imgshards.loader.profiling):
        # then each worker times its steps and counts its batches in it.
        self.step_times: StepTimes | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and name not in _SETTABLE and self._is_setting(name):
            raise SettingFixedError(self._fixed(name, value))
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if not name.startswith("_") and name not in _SETTABLE and self._is_setting(name):
            raise SettingFixedError(self._fixed(name, None))
        super().__delattr__(name)

    @classmethod
    def _is_setting(cls, name: str) -> bool:
        return name in cls._arguments or isinstance(inspect.getattr_static(cls, name, None), property)

    def _fixed(self, name: str, value: Any) -> str:
        """The one line refusing to set ``name`` after the dataset is made."""
        kind = type(self).__name__
        if name == "epoch":
            return (
                f"{kind}.epoch is read-only: call set_epoch({value!r}) (or the loader's) to read that epoch"
            )
        if name in self._arguments:
            # A number or a short string as given (a URL's password hidden); anything else (a transform,
            # storage options that may hold credentials) as "...".
            shown = repr(redact_url(value) if isinstance(value, str) else value)
            if not isinstance(value, (bool, int, float, str)) or len(shown) > 40:
                shown = "..."
            return (
                f"{kind}.{name} cannot be set: settings are fixed when the dataset is made (its order, "
                f"batches and resume checks follow from them); make a new one: {kind}(..., {name}={shown})"
            )
        return (
            f"{kind}.{name} is read-only: it follows from the data and the settings, which are fixed when "
            f"the dataset is made; make a new {kind}(...) to change them"
        )

    @property
    def loader_passes(self) -> bool:
        """Whether a :class:`~imgshards.loader.ShardLoader` begins each pass (it sets this).

        Else the workers of a plain ``DataLoader`` settle each pass among themselves.
        """
        return self._progress.loader_passes

    @loader_passes.setter
    def loader_passes(self, value: bool) -> None:
        self._progress.loader_passes = value

    # ---- the settings: views of the spec ------------------------------------------------------

    @property
    def split(self) -> str:
        """The split read."""
        return self._spec.split

    @property
    def batch_size(self) -> int:
        """Samples per batch."""
        return self._spec.batch_size

    @property
    def mode(self) -> Mode:
        """``"train"`` or ``"eval"``."""
        return self._spec.mode  # type: ignore[return-value]

    @property
    def seed(self) -> int:
        """Seed of every random choice."""
        return self._spec.seed

    @property
    def max_lost(self) -> float:
        """The share of its samples a rank's pass may lose to truncated or unreadable shards."""
        return self._spec.max_lost

    @property
    def decode_on(self) -> DecodeOn | None:
        """Where the training process decodes (``None``: the workers do)."""
        return self._spec.decode_on

    @property
    def num_samples(self) -> int:
        """Samples of the data (``len()`` counts batches)."""
        return self._spec.num_samples

    @property
    def shards_digest(self) -> str:
        """Which data a resume state is of (:func:`~.state.checkpoint.shards_digest`)."""
        return self._spec.shards_digest

    @property
    def image_settings(self) -> ImageSettings:
        """How a pass makes batches of its raw samples."""
        return self._spec.image

    @property
    def transform(self) -> Transform:
        """The transform each image goes through (a preset, or the caller's)."""
        return self._spec.image.transform

    @property
    def on_error(self) -> str:
        """``"skip"`` (drop, count and warn) or ``"raise"``."""
        return self._spec.image.on_error

    @property
    def raw_stages(self) -> tuple[Stage, ...]:
        """The user's stages on raw samples."""
        return self._spec.parts[0].read.raw_stages

    @property
    def image_stages(self) -> tuple[Stage, ...]:
        """The user's stages on decoded images."""
        return self._spec.image.image_stages

    @property
    def classes(self) -> list[str]:
        """Class names, as ``torchvision.datasets.ImageFolder.classes``: a label is a position here.

        Of a mix, the sorted union of its sources' names: a name several sources hold is one label.
        """
        return list(self._spec.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label, as ``ImageFolder.class_to_idx``."""
        return {name: i for i, name in enumerate(self._spec.classes)}

    @property
    def dropped_per_epoch(self) -> int:
        """Samples no rank sees in one epoch (0 in eval mode; of a mix, past its shortest source's epoch)."""
        rank, world_size = self._progress.ranks()
        return self._spec.dropped(self.epoch, self.cursor.legs, rank, world_size)

    # ---- the epoch: views of its progress -------------------------------------------------------

    @property
    def cursor(self) -> EpochCursor:
        """Where the epoch is (the one record, shared with the workers)."""
        return self._progress.cursor

    @property
    def epoch(self) -> int:
        """The epoch the next pass reads (or the one being read)."""
        return self._progress.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass read epoch ``epoch`` from its start; the same as :meth:`ShardLoader.set_epoch`.

        Setting the epoch the next pass reads anyway keeps where it starts: a state just loaded
        (``load_state_dict`` then ``set_epoch`` with the saved epoch, as a loop calling it every
        epoch does) still resumes mid-epoch.
        """
        self._progress.set_epoch(epoch)

    @property
    def rank(self) -> int:
        """The rank of this process, as settled when the current pass started (or now, if none has)."""
        return self._progress.ranks()[0]

    @property
    def world_size(self) -> int:
        """The number of ranks, as settled when the current pass started (or now, if none has)."""
        return self._progress.ranks()[1]

    def settle_ranks(self) -> tuple[int, int]:
        """Settle rank and world size now (:func:`.state.ranks.settle_ranks`), recorded for the workers."""
        return self._progress.settle_ranks()

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch, for any number of DataLoader workers.

        Batches, not samples, on purpose: this dataset yields whole batches (``DataLoader(...,
        batch_size=None)``), and a DataLoader's ``len()`` over an ``IterableDataset`` is
        ``len(dataset)``, so ``len(loader)`` is right in every trainer. :attr:`num_samples` counts
        samples. After an elastic resume it counts the epoch's batches delivered before it too.
        """
        return self._progress.rank_batches()

    def leg_batches(self) -> int:
        """Batches this rank yields in the current leg of the epoch (the epoch, without a resume).

        Of a mix, the shortest source's.

        Raises:
            ConfigError: of a mix, a source has fewer samples a rank than its share of a batch (no
                batch at all).

        """
        return self._progress.leg_batches()

    def batches_in_leg(self, epoch: int, legs: tuple[Leg, ...], world_size: int) -> int:
        """The most batches a rank yields in ``epoch``'s leg after ``legs`` at ``world_size`` ranks.

        What a saved state's batch counts are checked against (:meth:`.state.checkpoint.ResumeState.decode`).
        """
        return self._spec.batches_in_leg(epoch, legs, world_size)

    def rank_samples(self) -> int:
        """Samples this rank's pass plans to deliver (what :attr:`max_lost` is a share of).

        Of a mix: its batches, all whole.
        """
        return self._progress.rank_samples()

    def resume_settings(self) -> dict[str, Any]:
        """The settings that fix the order of this dataset's epochs, but for the topology (the spec's)."""
        return self._spec.resume_settings()

    def check_lost(self, epoch: int, lost: int) -> None:
        """Raise :class:`ShardReadError` if this rank's pass of ``epoch`` lost more than ``max_lost`` allows.

        ``lost``: the samples the pass's plan held that damaged or unreadable shards did not give.
        :class:`~imgshards.loader.ShardLoader` calls it as it hands over a pass's last batch (or
        after the pass, if it ended short). A pass may lose :func:`allowed_lost` samples, a whole number.
        Each rank judges its own pass, with no collective
        operation: a rank that raises ends a ``torchrun`` or Lightning job (the launcher stops the
        other ranks), where a collective would leave them waiting on it if it never got there.
        """
        self._progress.check_lost(epoch, lost)

    def pass_counts(self) -> PassCounts:
        """The loss counters as a pass begins (:meth:`.state.progress.EpochProgress.pass_counts`)."""
        return self._progress.pass_counts()

    def account_pass(self, epoch: int, before: PassCounts) -> None:
        """Warn about what the pass of ``epoch`` lost since ``before``, then judge it (:meth:`check_lost`).

        :class:`~imgshards.loader.ShardLoader` calls it as a pass ends
        (:meth:`.state.progress.EpochProgress.account_pass`).
        """
        self._progress.account_pass(epoch, before)

    def state_dict(self) -> dict[str, Any]:
        """Where this process's pass is: the epoch and the batches it made (torchdata ``Stateful``).

        Called by ``torchdata.stateful_dataloader.StatefulDataLoader`` in each worker after each
        batch; :meth:`load_state_dict` in a new worker continues from there without decoding what
        it skips. With :func:`~imgshards.loader.make_loader`, save ``loader.state_dict()`` instead.
        """
        return self._progress.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make this process's next pass continue the pass ``state`` describes (torchdata ``Stateful``).

        Raises:
            ResumeError: ``state`` is not a dataset state, or comes from other settings, world size
                or worker count.

        """
        self._progress.load_state_dict(state)

    # ---- counters -------------------------------------------------------------------------------

    @property
    def corrupt_skipped(self) -> int:
        """Images skipped because they did not decode, over all passes so far (all workers)."""
        return self._progress.total(CORRUPT)

    @property
    def truncated_shards(self) -> int:
        """Reads of a shard that ended before its index said it would, over all passes so far."""
        return self._progress.total(TRUNCATED)

    @property
    def unreadable_shards(self) -> int:
        """Times a remote shard was skipped because it could not be read, over all passes so far."""
        return self._progress.total(UNREADABLE)

    @property
    def lost_samples(self) -> int:
        """Planned samples that damaged or unreadable shards did not give, over all passes so far.

        In train mode they were made up by repeating others; in eval mode they are missing.
        """
        return self._progress.total(LOST)

    @property
    def filtered_samples(self) -> int:
        """Samples the user's stages dropped, over all passes so far (all workers).

        In train mode the raw stages' drops were made up by repeating kept samples (a batch keeps
        its size); in eval mode they are missing from the pass, as are the image stages' drops.
        """
        return self._progress.total(FILTERED)

    def counters(self, worker: int) -> Counters:
        """The counters of process ``worker``, a handle its pass counts in."""
        return self._progress.counters(worker)

    # ---- batch buffers ----------------------------------------------------------------------------

    def release(self, token: int, storage: torch.UntypedStorage) -> None:
        """Hand a worker's batch buffer back to it (the main process no longer refers to that batch)."""
        self._progress.control.release(token, storage)

    def kept_buffer(self, token: int) -> torch.UntypedStorage | None:
        """The batch buffer ``token`` as this (main) process keeps it mapped, if it does."""
        return self._progress.control.kept_buffer(token)

    def forget_buffers(self) -> None:
        """Unmap the batch buffers kept for workers that exited (see :mod:`.state.buffers`)."""
        self._progress.control.forget_buffers()

    # ---- a pass -----------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch | RawBatch]:
        at = self.begin_pass()
        return self.worker_batches(at, pool=self._progress.pool())

    def begin_pass(self) -> PassPosition:
        """Where this process's pass starts (:meth:`.state.progress.EpochProgress.begin_pass`)."""
        return self._progress.begin_pass()

    def worker_batches(self, at: PassPosition, *, pool: BufferPool | None = None) -> Iterator[Any]:
        """The batches the worker of ``at`` makes in its pass, from batch ``at.first`` on.

        In a DataLoader worker ``pool`` holds its batch buffers in shared memory.
        """
        clock = NO_CLOCK if self.step_times is None else self.step_times.clock()
        counters = self.counters(at.worker)
        raw = self._spec.raw(at, counters, clock)
        batches = worker_pass(self._spec.image, raw, at, counters, pool=pool, clock=clock)
        return self._progress.recorded(batches, at)


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
        # Checked now for an early error, but settled as each pass starts (see .state.ranks).
        settle_ranks(rank, world_size)
        check_settings(
            mode=mode,
            on_error=on_error,
            batch_size=batch_size,
            seed=seed,
            drop_last=drop_last,
            max_lost=max_lost,
            shuffle_buffer=shuffle_buffer,
            shuffle_initial=shuffle_initial,
        )
        shards = open_source(
            source,
            storage_options=storage_options,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            prefetch=prefetch,
            timeout=timeout,
        )
        index = read_index(shards, split)
        image, offload, raw_stages = image_spec(
            transform,
            image_size=image_size,
            mode=mode,
            seed=seed,
            on_error=on_error,
            decode_on=decode_on,
            raw_stages=raw_stages,
            image_stages=image_stages,
        )
        part = split_part(
            shards,
            index,
            split=split,
            batch_size=batch_size,
            mode=mode,
            shuffle=(mode == "train") if shuffle is None else shuffle,
            shuffle_buffer=shuffle_buffer,
            shuffle_initial=shuffle_initial,
            drop_last=drop_last,
            seed=seed,
            on_error=on_error,
            raw_stages=raw_stages,
            views=not (raw_stages or image.image_stages),
        )
        spec = Spec(
            (part,),
            image,
            split=split,
            batch_size=batch_size,
            mode=mode,
            seed=seed,
            max_lost=max_lost,
            decode_on=offload,
            classes=tuple(index[1].classes),
        )
        super().__init__(spec, rank, world_size)

    # ---- what it reads: views of its one part -------------------------------------------------

    @property
    def source(self) -> ShardSource:
        """Where the shards are read from."""
        return self._spec.parts[0].source

    @property
    def root(self) -> Path | str:
        """The dataset's directory (a local path) or URL."""
        return self._spec.parts[0].root

    @property
    def manifest(self) -> Manifest:
        """The dataset's index."""
        return self._spec.parts[0].manifest

    @property
    def split_info(self) -> SplitInfo:
        """The split's shards, as the index lists them."""
        return self._spec.parts[0].split_info

    @property
    def layout(self) -> elastic.Layout:
        """What fixes a train epoch's order, besides the epoch, the ranks and the workers."""
        return self._spec.parts[0].layout

    @property
    def read_settings(self) -> ReadSettings:
        """What a pass reads, in which order, cut into which batches."""
        return self._spec.parts[0].read

    @property
    def shuffle(self) -> bool:
        """Whether shard order and samples are shuffled."""
        return self.layout.shuffle

    @property
    def shuffle_buffer(self) -> int:
        """Samples in each worker's shuffle buffer."""
        return self.layout.shuffle_buffer

    @property
    def shuffle_initial(self) -> int:
        """Samples in the buffer before the first is yielded."""
        return self.layout.shuffle_initial

    @property
    def drop_last(self) -> bool:
        """Whether each rank's partial last batch is dropped (train mode)."""
        return self.layout.drop_last

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


ShardDataset._arguments = frozenset(inspect.signature(ShardDataset).parameters)


# ---- how a dataset's spec is made (a MixedDataset makes its parts with these too) --------------


def check_settings(
    *,
    mode: str,
    on_error: str,
    batch_size: int,
    seed: int,
    drop_last: bool,
    max_lost: float,
    shuffle_buffer: int,
    shuffle_initial: int,
) -> None:
    """Raise :class:`ConfigError` for a setting out of range or not among the allowed values."""
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


def open_source(
    source: str | os.PathLike[str] | ShardSource,
    *,
    storage_options: Mapping[str, Any] | None,
    cache_dir: str | os.PathLike[str] | None,
    cache_limit: int | None,
    prefetch: int,
    timeout: float,
) -> ShardSource:
    """``source`` as a :class:`ShardSource` holding the remote options (or as given, if one already)."""
    if isinstance(source, ShardSource):
        if (
            storage_options is not None
            or cache_dir is not None
            or cache_limit is not None
            or timeout != DEFAULT_TIMEOUT
        ):
            raise ConfigError(
                "pass storage_options, cache_dir, cache_limit and timeout to the ShardSource, not beside it"
            )
        return source
    return ShardSource(
        _dataset_dir(source),
        storage_options=storage_options,
        cache_dir=cache_dir,
        cache_limit=cache_limit,
        prefetch=prefetch,
        timeout=timeout,
    )


Index = tuple[Path | str, Manifest, SplitInfo]


_SLACK = 1 << 16  # samples a split may claim past what its files hold, before the claim is refused


def read_index(source: ShardSource, split: str) -> Index:
    """The root, index and split ``split`` of ``source``, read once; its shards are checked to exist.

    The split's sample count sizes the pass's plan (batches per rank and worker), so it is checked
    against what its shards' files can hold first (a tar sample takes at least ``MIN_SAMPLE_BYTES``),
    where their sizes are known: a claim no file holds allocates nothing. Shards cut short are damage,
    read as far as they go, even when half of the split is gone; a claim of over twice what the files
    hold (and more than ``_SLACK`` samples, whose plan costs next to nothing) is not.

    Raises:
        ManifestError: no index at ``source``, a bad index, an unknown split, or a missing shard.
        ConfigError: the split claims far more samples than its shards' files can hold.

    """
    root: Path | str = source.root if source.remote else Path(source.root)
    manifest = read_manifest(root, storage_options=source.storage_options)
    split_info = manifest.split(split)
    found = source.check(split_info.shards, split)
    sizes = [size for size in found.values() if size is not None]
    if found and len(sizes) == len(found):
        room = sum(size // MIN_SAMPLE_BYTES for size in sizes)
        if split_info.samples > 2 * room + _SLACK:
            raise ConfigError(
                f"{redact_url(str(root))}/{INDEX_NAME}: splits.{split}.samples is {split_info.samples:,}, "
                f"over twice what its {len(sizes):,} shards can hold ({sum(sizes):,} bytes: at most "
                f"{room:,} samples): the index does not describe these shards; re-pack the dataset, or "
                "index its shards with `imgshards index`"
            )
    return root, manifest, split_info


def image_spec(
    transform: str | Transform | None,
    *,
    image_size: int,
    mode: str,
    seed: int,
    on_error: str,
    decode_on: DecodeOn | str | torch.device | None,
    raw_stages: Sequence[Stage] | None,
    image_stages: Sequence[Stage] | None,
) -> tuple[ImageSettings, DecodeOn | None, tuple[Stage, ...]]:
    """How images are made: the image settings, where they are decoded, and the checked raw stages."""
    if transform is None:
        transform = mode
    if isinstance(transform, str):
        transform = preset(transform, size=image_size)
    elif not callable(transform):
        raise ConfigError(f"transform must be one of {list(PRESETS)} or a callable, got {transform!r}")
    offload = DecodeOn.of(decode_on)
    raw = check_stages("raw_stages", raw_stages)
    image = check_stages("image_stages", image_stages)
    if image and offload is not None:
        raise ConfigError(
            "image_stages run in the workers on decoded images; with decode_on the training process "
            "decodes: transform its batches in the training loop instead"
        )
    if offload is None:
        # A torchvision transform written for ImageFolder (ToTensor...) gets PIL images, as there.
        transform = user_transform(transform)
    settings = ImageSettings(transform, seed, on_error, image_stages=image, offload=offload is not None)
    return settings, offload, raw


def split_part(
    source: ShardSource,
    index: Index,
    *,
    split: str,
    batch_size: int,
    mode: str,
    shuffle: bool,
    shuffle_buffer: int,
    shuffle_initial: int,
    drop_last: bool,
    seed: int,
    on_error: str,
    raw_stages: tuple[Stage, ...],
    views: bool,
    relabel: Any = None,
) -> Part:
    """One packed split as a part of a spec: what a pass reads of it, in which order and batches."""
    root, manifest, split_info = index
    shard_samples = tuple(s.samples for s in split_info.shards)
    layout = elastic.Layout(
        shard_samples, seed, batch_size, drop_last, shuffle, shuffle_buffer, shuffle_initial
    )
    read = ReadSettings(
        split_info,
        source,
        tuple(manifest.classes),
        layout,
        train=mode == "train",
        on_error=on_error,
        raw_stages=raw_stages,
        views=views,
        where=f"split {split!r} at {redact_url(str(root))}",
    )
    return Part(root, manifest, read, shards_digest(split_info.shards), relabel)


def _dataset_dir(source: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """``shards/index.json`` -> ``shards``: the shards are read beside their index (as the CLI takes it)."""
    if is_url(source):
        url = str(source)
        return url[: -len(INDEX_NAME) - 1] if url.endswith(f"/{INDEX_NAME}") else source
    path = local_path(source)
    return path.parent if path.suffix == ".json" and path.is_file() else source
