"""``ShardDataset``: an ``IterableDataset`` over a packed split that yields whole batches.

A dataset is two things, each a public attribute: :attr:`PassDataset.spec`, the frozen
:class:`~.pipeline.spec.Spec` of what it reads, made by the one :func:`~.pipeline.spec.make_spec`
from its :class:`~.pipeline.settings.Settings` (every setting, declared once, as given), and
:attr:`PassDataset.progress`, the :class:`~.state.progress.EpochProgress` of its epoch, shared with
the DataLoader workers (the cursor, the ranks, the counters, torchdata's state), which a
:class:`~.dataloader.ShardLoader` drives. A pass starts from where the epoch stands and runs
:mod:`.pipeline.passes` on the spec. Every setting reads back from ``ds.settings``; the ones a
training loop asks for (``batch_size``, ``split``, ``seed``, ``mode``, ``shuffle``...) are typed
properties too. Setting one after the dataset is made is an error, not a silent change, and so is
setting a name one slip from a setting (``ds.shufle = True``, ``ds.batchsize = 32``, ``ds.sed = 7``),
which would otherwise be a new attribute nothing reads. :class:`ShardDataset` reads one split: a
spec of one part; :class:`~.mix.MixedDataset` several.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.utils.data import IterableDataset

from imgshards.converter.format.locate import redact_url

from .epoch.position import PassPosition
from .errors import SettingFixedError
from .image.presets import Transform
from .pipeline.offload import DecodeOn, RawBatch
from .pipeline.passes import raw_batches, raw_samples, worker_pass
from .pipeline.settings import DEFAULT_MAX_LOST, Mode, OnError, Settings
from .pipeline.spec import Part, Spec, make_spec
from .pipeline.steps import NO_CLOCK, StepTimes
from .pipeline.tar import RawSample
from .remote import ShardSource
from .remote.ranges import DEFAULT_TIMEOUT
from .stages import Stage
from .state.buffers import Batch, BufferPool
from .state.cursor import CORRUPT, FILTERED, LOST, TRUNCATED, UNREADABLE
from .state.progress import EpochProgress
from .state.ranks import settle_ranks
from .workers import socket_safe_tempdir

__all__ = ["PassDataset", "ShardDataset"]

# Not settings: set by a profiler (imgshards.loader.profiling).
_SETTABLE = frozenset({"step_times"})
# How alike (difflib's ratio) a new attribute's name and a setting's must be for the name to be taken
# for a slip: "sed"/"seed" 0.86, "shufle"/"shuffle" 0.92, "batchsize"/"batch_size" 0.95; "note"/"mode" 0.5.
_SLIP = 0.8
_UNSET = object()


_SETTINGS = frozenset(f.name for f in dataclasses.fields(Settings))


class PassDataset(IterableDataset[Batch | RawBatch]):
    """An epoch of batches, shared with the DataLoader workers, and the pass each of them runs.

    Attributes:
        spec: What it reads and how (frozen): the settings and what follows from them.
        progress: Where its epoch is, shared with the workers; a ShardLoader drives it.

    """

    # The names of the maker's arguments: setting one afterwards is refused, naming the way to make a new one.
    _arguments: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # A subclass's own __init__ sets what attributes it likes (a name like a setting's included):
        # the check for a slip (_slip) starts once the outermost __init__ has returned.
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None:
            type.__setattr__(cls, "__init__", _building(init))

    def __init__(self, spec: Spec, rank: int | None, world_size: int | None) -> None:
        super().__init__()
        socket_safe_tempdir()  # before any DataLoader forks its workers: they inherit it
        object.__setattr__(self, "spec", spec)
        object.__setattr__(self, "progress", EpochProgress(spec, rank, world_size))
        # Off unless a profiler attaches one before the workers start (imgshards.loader.profiling):
        # then each worker times its steps and counts its batches in it.
        self.step_times: StepTimes | None = None

    spec: Spec
    progress: EpochProgress

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and name not in _SETTABLE:
            if self._is_setting(name):
                raise SettingFixedError(self._fixed(name, value))
            if (meant := self._slip(name)) is not None:
                raise SettingFixedError(
                    f"{type(self).__name__} has no setting {name!r} (did you mean {meant!r}?): "
                    f"{self._fixed(meant, value)}"
                )
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if not name.startswith("_") and name not in _SETTABLE and self._is_setting(name):
            raise SettingFixedError(self._fixed(name, None))
        super().__delattr__(name)

    @classmethod
    def _is_setting(cls, name: str) -> bool:
        return (
            name in cls._arguments
            or name in _SETTINGS
            or name in ("spec", "progress")
            or isinstance(inspect.getattr_static(cls, name, None), property)
        )

    def _slip(self, name: str) -> str | None:
        """The setting that ``name``, a new attribute of a made dataset, is one slip from; else ``None``.

        The rule that keeps subclasses and wrappers working: a name is taken for a slip only once the
        dataset is made (every ``__init__`` of its class has returned: a subclass sets what it likes
        there), only where the dataset has no attribute of that name yet (in its ``__dict__`` or on its
        class: a subclass declares one there to set it later), and only where difflib finds it as
        alike as ``_SLIP`` to a setting, a maker's argument or a read-only property. Any other new
        attribute is set, as on any object (``ds.note = ...``).
        """
        if self.__dict__.get("_building") or name in self.__dict__:
            return None
        cls = type(self)
        if inspect.getattr_static(cls, name, _UNSET) is not _UNSET:
            return None
        names = set(cls._arguments) | _SETTINGS
        names |= {n for n in dir(cls) if not n.startswith("_") and self._is_setting(n)}
        close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=_SLIP)
        return close[0] if close else None

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

    # ---- the settings, and what follows from them ------------------------------------------------

    @property
    def settings(self) -> Settings:
        """Every setting it was made with, as given (frozen): the one place each reads back."""
        return self.spec.settings

    @property
    def split(self) -> str:
        """The split it reads."""
        return self.spec.split

    @property
    def batch_size(self) -> int:
        """Samples per batch (of a mix: every source's share together)."""
        return self.spec.batch_size

    @property
    def mode(self) -> Mode:
        """``"train"`` or ``"eval"``."""
        return self.settings.mode

    @property
    def seed(self) -> int:
        """Seed of every random choice."""
        return self.spec.seed

    @property
    def shuffle(self) -> bool:
        """Whether it shuffles: ``settings.shuffle``, or train mode where that is None."""
        return self.spec.shuffle

    @property
    def drop_last(self) -> bool:
        """Whether each rank's partial last batch is dropped (always, for a mix)."""
        return self.settings.drop_last

    @property
    def transform(self) -> Transform:
        """The transform each image goes through: the preset ``settings.transform`` names, or the callable."""
        return self.spec.transform

    @property
    def decode_on(self) -> DecodeOn | None:
        """Where images are decoded and augmented: None in the workers, else the training process's device."""
        return self.spec.decode_on

    @property
    def num_samples(self) -> int:
        """Samples of the split (of a mix: of every source together)."""
        return self.spec.num_samples

    @property
    def classes(self) -> list[str]:
        """Class names, as ``torchvision.datasets.ImageFolder.classes``: a label is a position here.

        Of a mix, the sorted union of its sources' names: a name several sources hold is one label.
        """
        return list(self.spec.classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label, as ``ImageFolder.class_to_idx``."""
        return {name: i for i, name in enumerate(self.spec.classes)}

    @property
    def dropped_per_epoch(self) -> int:
        """Samples no rank sees in one epoch (0 in eval mode; of a mix, past its shortest source's epoch)."""
        rank, world_size = self.progress.ranks()
        return self.spec.dropped(self.epoch, self.progress.cursor.legs, rank, world_size)

    # ---- the epoch -------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next pass reads (or the one being read)."""
        return self.progress.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass read epoch ``epoch`` from its start; the same as :meth:`ShardLoader.set_epoch`.

        Setting the epoch the next pass reads anyway keeps where it starts: a state just loaded
        (``load_state_dict`` then ``set_epoch`` with the saved epoch, as a loop calling it every
        epoch does) still resumes mid-epoch.
        """
        self.progress.set_epoch(epoch)

    @property
    def rank(self) -> int:
        """The rank of this process, as settled when the current pass started (or now, if none has)."""
        return self.progress.ranks()[0]

    @property
    def world_size(self) -> int:
        """The number of ranks, as settled when the current pass started (or now, if none has)."""
        return self.progress.ranks()[1]

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch, for any number of DataLoader workers.

        Batches, not samples, on purpose: this dataset yields whole batches (``DataLoader(...,
        batch_size=None)``), and a DataLoader's ``len()`` over an ``IterableDataset`` is
        ``len(dataset)``, so ``len(loader)`` is right in every trainer. :attr:`num_samples` counts
        samples. After an elastic resume it counts the epoch's batches delivered before it too.
        """
        return self.progress.rank_batches()

    def state_dict(self) -> dict[str, Any]:
        """Where this process's pass is: the epoch and the batches it made (torchdata ``Stateful``).

        Called by ``torchdata.stateful_dataloader.StatefulDataLoader`` in each worker after each
        batch; :meth:`load_state_dict` in a new worker continues from there without decoding what
        it skips. With :func:`~imgshards.loader.make_loader`, save ``loader.state_dict()`` instead.
        """
        return self.progress.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make this process's next pass continue the pass ``state`` describes (torchdata ``Stateful``).

        Raises:
            ResumeError: ``state`` is not a dataset state, or comes from other settings, world size
                or worker count.

        """
        self.progress.load_state_dict(state)

    # ---- counters -------------------------------------------------------------------------------

    @property
    def corrupt_skipped(self) -> int:
        """Images skipped because they did not decode, over all passes so far (all workers)."""
        return self.progress.total(CORRUPT)

    @property
    def truncated_shards(self) -> int:
        """Reads of a shard that ended before its index said it would, over all passes so far."""
        return self.progress.total(TRUNCATED)

    @property
    def unreadable_shards(self) -> int:
        """Times a remote shard was skipped because it could not be read, over all passes so far."""
        return self.progress.total(UNREADABLE)

    @property
    def lost_samples(self) -> int:
        """Planned samples that damaged or unreadable shards did not give, over all passes so far.

        In train mode they were made up by repeating others; in eval mode they are missing.
        """
        return self.progress.total(LOST)

    @property
    def filtered_samples(self) -> int:
        """Samples the user's stages dropped, over all passes so far (all workers).

        In train mode the raw stages' drops were made up by repeating kept samples (a batch keeps
        its size); in eval mode they are missing from the pass, as are the image stages' drops.
        """
        return self.progress.total(FILTERED)

    # ---- a pass -----------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch | RawBatch]:
        at = self.progress.begin_pass()
        return self.worker_batches(at, pool=self.progress.pool())

    def worker_batches(self, at: PassPosition, *, pool: BufferPool | None = None) -> Iterator[Any]:
        """The batches the worker of ``at`` makes in its pass, from batch ``at.first`` on.

        In a DataLoader worker ``pool`` holds its batch buffers in shared memory.
        """
        clock = NO_CLOCK if self.step_times is None else self.step_times.clock()
        counters = self.progress.counters(at.worker)
        raw = raw_batches(self.spec, at, counters, clock)
        batches = worker_pass(self.spec, raw, at, counters, pool=pool, clock=clock)
        return self.progress.recorded(batches, at)


def _building(init: Callable[..., None]) -> Callable[..., None]:
    """``init``, counting in the dataset's ``_building`` that an ``__init__`` of it is running."""

    @functools.wraps(init)
    def __init__(self: PassDataset, *args: Any, **kwargs: Any) -> None:
        depth = self.__dict__.get("_building", 0)
        self.__dict__["_building"] = depth + 1
        try:
            init(self, *args, **kwargs)
        finally:
            if depth:
                self.__dict__["_building"] = depth
            else:
                del self.__dict__["_building"]

    return __init__


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
            :class:`ShardReadError` as its last batch is handed over
            (:meth:`.state.progress.EpochProgress.check_lost`). It may lose
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
        raw_stages: Callables run in the workers on each worker's raw samples, before decoding
            (filter, map, make samples of several: :mod:`imgshards.loader.stages`).
        image_stages: Callables run in the workers on the decoded, transformed samples, before the
            batch is stacked (not with ``decode_on``).

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
        settings = Settings.of(locals())
        spec = make_spec([source], settings)
        super().__init__(spec, rank, world_size)

    @property
    def part(self) -> Part:
        """The one split it reads: its root, index, shards and source."""
        return self.spec.parts[0]

    @property
    def root(self) -> Path | str:
        """The dataset's directory (a local path) or URL."""
        return self.part.root

    def raw_samples(self) -> Iterator[RawSample]:
        """The raw samples of a pass of this process starting now, every member (:func:`.stages.samples`)."""
        at = self.progress.begin_pass()
        return raw_samples(self.spec, self.part, at, self.progress.counters(at.worker))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({redact_url(str(self.root))!r}, split={self.spec.split!r}, "
            f"mode={self.spec.mode!r}, batch_size={self.spec.batch_size}, samples={self.spec.num_samples}, "
            f"rank={self.rank}/{self.world_size}, transform={self.spec.transform!r})"
        )


ShardDataset._arguments = frozenset(inspect.signature(ShardDataset).parameters)
