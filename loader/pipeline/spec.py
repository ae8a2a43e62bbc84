"""What a dataset reads, fixed when it is made: one packed split or several, and how images are made.

A :class:`Spec` is the frozen half of a dataset (the other, what changes as it is read, is
:class:`~..state.progress.EpochProgress`). It holds every setting a user gave, each once, and its
parts (:class:`Part`, one packed split each: where it is, its index, its seed and its share of a
batch). Everything else is computed from them when asked: a part's :attr:`Spec.layout` (what fixes
its order), the batches in a leg, the samples a rank plans, the settings a resume checks. A pass
reads it through :mod:`.passes`. Every dataset kind is made by
one builder, :func:`make_spec`: a :class:`~imgshards.loader.ShardDataset` is a spec of one part, a
:class:`~imgshards.loader.MixedDataset` one of several, zipped (batch ``k`` of every part makes
batch ``k`` of the mix, its labels mapped onto the mix's classes, shuffled within the batch).

``tests/loader/pipeline/test_spec.py`` lists every field of the spec and of its parts, and fails
when one setting is held in two places.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from imgshards.converter.format.locate import INDEX_NAME, is_url, local_path, redact_url
from imgshards.converter.format.manifest import Manifest, SplitInfo, read_manifest
from imgshards.converter.format.validate import MIN_SAMPLE_BYTES

from ..epoch import elastic, partition
from ..epoch.position import Leg
from ..errors import ConfigError
from ..image.pil_input import user_transform
from ..image.presets import PRESETS, Transform, preset
from ..remote import ShardSource
from ..remote.ranges import DEFAULT_TIMEOUT
from ..state.checkpoint import shards_digest
from .batches import Stage, check_stages
from .offload import DecodeOn
from .settings import Settings
from .splitreader import IndexStamp, SplitReader

__all__ = ["Part", "Spec", "make_spec", "split_batch"]


@dataclass(frozen=True, eq=False)
class Part:
    """One packed split a dataset reads: where it is, its index, its own seed and share of a batch.

    ``reader`` reads its samples (:class:`~.splitreader.SplitReader`, the one reader of every
    dataset): the split's tables (mapped from the dataset's files, or fetched by ranges from a URL:
    the pickle a worker gets holds their names, O(shards)) and the index's file as it was read, which
    every shard opened is checked against. ``seed`` is the seed of this part's order (a mix's part
    ``i`` draws from the mix's seed plus ``i``); ``share`` its samples in every batch (the batch
    size, for a dataset of one part). ``relabel`` maps the part's labels onto the dataset's classes
    (``None``: its labels are the dataset's).
    """

    root: Path | str
    manifest: Manifest
    split: SplitInfo
    source: ShardSource
    reader: SplitReader
    seed: int
    share: int
    relabel: np.ndarray | None = None

    @functools.cached_property
    def shard_samples(self) -> tuple[int, ...]:
        """Samples of each shard, as the index lists them."""
        return tuple(s.samples for s in self.split.shards)

    @property
    def num_samples(self) -> int:
        """Samples of the split."""
        return sum(self.shard_samples)

    @functools.cached_property
    def shards_digest(self) -> str:
        """Which data a resume state is of (:func:`~..state.checkpoint.shards_digest`)."""
        return shards_digest(self.split.shards)

    @property
    def classes(self) -> tuple[str, ...]:
        """The part's own class names, as its index lists them (its labels are positions here)."""
        return tuple(self.manifest.classes)

    @property
    def where(self) -> str:
        """The split and its root, for messages."""
        return f"split {self.split.name!r} at {redact_url(str(self.root))}"


@dataclass(frozen=True, eq=False)
class Spec:
    """What a dataset reads and how it makes batches of it: every setting, once, fixed when it is made.

    The seed and the batch size are the parts': the first part's seed is the dataset's, and the
    batch is every part's share together.
    """

    parts: tuple[Part, ...]
    settings: Settings  # as given: what follows from them (shuffle, transform...) is below
    shuffle: bool
    transform: Transform
    decode_on: DecodeOn | None
    raw_stages: tuple[Stage, ...] = ()
    image_stages: tuple[Stage, ...] = ()
    weights: tuple[float, ...] = ()  # several parts: the share of each in a batch, as given

    # ---- the settings as given -------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """``"train"`` or ``"eval"``."""
        return self.settings.mode

    @property
    def shuffle_buffer(self) -> int:
        """Samples in each worker's shuffle buffer."""
        return self.settings.shuffle_buffer

    @property
    def shuffle_initial(self) -> int:
        """Samples in the buffer before the first is yielded."""
        return self.settings.shuffle_initial

    @property
    def drop_last(self) -> bool:
        """Train mode only: drop each rank's partial last batch."""
        return self.settings.drop_last

    @property
    def on_error(self) -> str:
        """``"skip"`` or ``"raise"``."""
        return self.settings.on_error

    @property
    def max_lost(self) -> float:
        """The share of a rank's samples a pass may lose to damaged or unreadable shards."""
        return self.settings.max_lost

    # ---- the settings that follow from the parts ---------------------------------------------------

    @property
    def split(self) -> str:
        """The split read (of every part)."""
        return self.parts[0].split.name

    @property
    def seed(self) -> int:
        """Seed of every random choice (the first part's; a mix's others draw from it plus their place)."""
        return self.parts[0].seed

    @property
    def batch_size(self) -> int:
        """Samples per batch: every part's share together."""
        return sum(self.shares)

    @property
    def shares(self) -> list[int]:
        """Samples of each part in a batch."""
        return [p.share for p in self.parts]

    @functools.cached_property
    def classes(self) -> tuple[str, ...]:
        """Class names: a label is a position here.

        The parts' own list if they all hold the same one, else the sorted union of their names (a
        name several parts hold is one label; :attr:`Part.relabel` maps each part's labels onto it).
        """
        return merged_classes([p.classes for p in self.parts])

    @property
    def train(self) -> bool:
        """Train mode: equal batches on every rank, and what a damaged shard lost made up."""
        return self.mode == "train"

    @property
    def views(self) -> bool:
        """Images as views of a mapped shard: no user stage sees (and keeps) them."""
        return not (self.raw_stages or self.image_stages)

    @property
    def num_samples(self) -> int:
        """Samples of every part together."""
        return sum(p.num_samples for p in self.parts)

    @property
    def shards_digest(self) -> str:
        """Which data a resume state is of: the parts' digests."""
        return "+".join(p.shards_digest for p in self.parts)

    def layout(self, part: Part) -> elastic.Layout:
        """What fixes ``part``'s train order: its shards' sizes, its seed and share, the shuffle."""
        return elastic.Layout(
            part.shard_samples,
            part.seed,
            part.share,
            self.drop_last,
            self.shuffle,
            self.shuffle_buffer,
            self.shuffle_initial,
        )

    def _kw(self) -> dict[str, Any]:
        # One part's partition (eval, and a train rank's samples): the batches of the whole spec.
        return {"batch_size": self.batch_size, "train": self.train, "drop_last": self.drop_last}

    # ---- what the epoch asks ----------------------------------------------------------------------

    def leg_batches(self, epoch: int, legs: tuple[Leg, ...], rank: int, world_size: int) -> int:
        """Batches rank ``rank`` yields in ``epoch``'s leg after ``legs``: the shortest part's.

        Raises:
            ConfigError: of several parts, one has fewer samples a rank than its share of a batch.

        """
        if not self.train:
            return partition.rank_batches(self.num_samples, world_size=world_size, **self._kw())[rank]
        batches = [
            elastic.rank_batches(self.layout(p), epoch=epoch, legs=legs, world_size=world_size)
            for p in self.parts
        ]
        if len(self.parts) > 1 and not legs and not min(batches):
            empty = batches.index(0)
            part = self.parts[empty]
            raise ConfigError(
                f"source {empty} ({redact_url(str(part.root))}) has {part.num_samples // world_size} "
                f"sample(s) a rank, fewer than its {part.share} a batch: an epoch would be "
                "empty; lower its weight or the batch size"
            )
        return min(batches)

    def batches_in_leg(self, epoch: int, legs: tuple[Leg, ...], world_size: int) -> int:
        """The most batches a rank yields in ``epoch``'s leg after ``legs`` at ``world_size`` ranks."""
        if not self.train:  # eval has no legs: its ranks yield one batch apart at most
            return max(partition.rank_batches(self.num_samples, world_size=world_size, **self._kw()))
        return min(
            elastic.rank_batches(self.layout(p), epoch=epoch, legs=legs, world_size=world_size)
            for p in self.parts
        )

    def rank_samples(self, epoch: int, legs: tuple[Leg, ...], rank: int, world_size: int) -> int:
        """Samples rank ``rank``'s pass plans to deliver (what ``max_lost`` is a share of).

        Of several parts: the rank's batches in the epoch, all whole.
        """
        if len(self.parts) > 1:
            batches = sum(k for _, _, k in legs) + self.leg_batches(epoch, legs, rank, world_size)
            return batches * self.batch_size
        start, stop = partition.rank_sample_range(
            self.num_samples, rank=rank, world_size=world_size, **self._kw()
        )
        return stop - start

    def dropped(self, epoch: int, legs: tuple[Leg, ...], rank: int, world_size: int) -> int:
        """Samples no rank sees in one epoch (of several parts: past the shortest part's epoch)."""
        if len(self.parts) > 1:
            return self.num_samples - self.rank_samples(epoch, legs, rank, world_size) * world_size
        return partition.dropped_samples(self.num_samples, world_size=world_size, **self._kw())

    def resume_settings(self) -> dict[str, Any]:
        """The settings that fix the order of the epochs, but for the topology.

        ``split`` and ``shards`` (:func:`~..state.checkpoint.shards_digest`) tell the data itself: a
        state of another split or dataset of the same size would otherwise resume there, skipping
        samples it never delivered. Several parts add their weights and shares of a batch.
        """
        settings: dict[str, Any] = {
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
        if len(self.parts) > 1:
            settings |= {"weights": list(self.weights), "shares": self.shares}
        return settings

    def roots(self) -> list[Path | str]:
        """Where the data is, for messages."""
        return [p.root for p in self.parts]

    def settle(self) -> None:
        """Settle the sources as a pass ends: its downloads reach the cache."""
        for part in self.parts:
            part.source.settle()


# ---- the one builder -----------------------------------------------------------------------------


def make_spec(
    sources: Sequence[str | os.PathLike[str] | ShardSource],
    settings: Settings,
    *,
    weights: Sequence[float] | None = None,
) -> Spec:
    """The spec of a dataset reading ``settings.split`` of ``sources``: every dataset kind's, checked.

    One source is a dataset of one part, its share of a batch the batch size. Several are parts of
    a mix: ``batch_size`` split by ``weights`` (default: in proportion to their samples, each index
    read once), part ``i`` drawing its order from ``seed + i``, their classes merged by name.

    Raises:
        ConfigError: a setting out of range or not among the allowed values.
        ManifestError: no index at a source, a bad index, an unknown split, or a missing shard.

    """
    settings.check()
    transform, offload, raw, image = _image_settings(settings)
    opened = [open_source(s, settings) for s in sources]
    indexes = [read_index(s, settings.split) for s in opened]
    mixed = len(opened) > 1
    if mixed:
        weights = tuple(float(w) for w in (weights or [info.samples for _, _, info, _ in indexes]))
        if len(weights) != len(opened):
            raise ConfigError(f"{len(weights)} weights for {len(opened)} sources")
        shares = split_batch(settings.batch_size, weights)
    else:
        weights, shares = (), [settings.batch_size]
    # One label a class name: each part's labels mapped onto the spec's classes (None where a part's
    # list is the spec's: its labels stay as they are).
    names = [tuple(manifest.classes) for _, manifest, _, _ in indexes]
    classes = merged_classes(names)
    ids = {name: i for i, name in enumerate(classes)}
    parts = tuple(
        Part(
            root,
            manifest,
            info,
            source,
            SplitReader(info, manifest.classes, source, stamp=stamp),
            seed=settings.seed + i,
            share=share,
            relabel=None if own == classes else np.array([ids[c] for c in own], dtype=np.int64),
        )
        for i, (source, (root, manifest, info, stamp), share, own) in enumerate(
            zip(opened, indexes, shares, names, strict=True)
        )
    )
    return Spec(
        parts,
        settings,
        shuffle=(settings.mode == "train") if settings.shuffle is None else settings.shuffle,
        transform=transform,
        decode_on=offload,
        raw_stages=raw,
        image_stages=image,
        weights=weights,
    )


def merged_classes(names: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    """The classes of parts with class lists ``names``: the one list they share, or the sorted union."""
    return names[0] if all(n == names[0] for n in names) else tuple(sorted({c for n in names for c in n}))


def split_batch(batch_size: int, weights: Sequence[float]) -> list[int]:
    """Samples of each source in a batch: ``batch_size`` split by ``weights``, largest remainders first.

    Raises:
        ConfigError: a weight is not positive, or so small that its source gets no sample a batch.

    """
    if not weights or any(not w > 0 for w in weights):
        raise ConfigError(f"weights must be positive numbers, one a source; got {list(weights)}")
    share = np.asarray(weights, dtype=float) / float(sum(weights)) * batch_size
    counts = np.floor(share).astype(int)
    for i in np.argsort(-(share - counts), kind="stable")[: batch_size - int(counts.sum())]:
        counts[i] += 1
    if (counts == 0).any():
        low = int(np.flatnonzero(counts == 0)[0])
        raise ConfigError(
            f"weight {weights[low]} of source {low} is under one sample in a batch of {batch_size}; "
            "raise batch_size or that weight"
        )
    return [int(c) for c in counts]


def _image_settings(
    settings: Settings,
) -> tuple[Transform, DecodeOn | None, tuple[Stage, ...], tuple[Stage, ...]]:
    """How images are made: the transform, where they are decoded, and the checked stages."""
    transform = settings.mode if settings.transform is None else settings.transform
    if isinstance(transform, str):
        transform = preset(transform, size=settings.image_size)
    elif not callable(transform):
        raise ConfigError(f"transform must be one of {list(PRESETS)} or a callable, got {transform!r}")
    offload = DecodeOn.of(settings.decode_on)
    raw = check_stages("raw_stages", settings.raw_stages)
    image = check_stages("image_stages", settings.image_stages)
    if image and offload is not None:
        raise ConfigError(
            "image_stages run in the workers on decoded images; with decode_on the training process "
            "decodes: transform its batches in the training loop instead"
        )
    if offload is None:
        # A torchvision transform written for ImageFolder (ToTensor...) gets PIL images, as there.
        transform = user_transform(transform)
    return transform, offload, raw, image


def open_source(source: str | os.PathLike[str] | ShardSource, settings: Settings) -> ShardSource:
    """``source`` as a :class:`ShardSource` holding the remote settings (or as given, if one already)."""
    if isinstance(source, ShardSource):
        if (
            settings.storage_options is not None
            or settings.cache_dir is not None
            or settings.cache_limit is not None
            or settings.timeout != DEFAULT_TIMEOUT
        ):
            raise ConfigError(
                "pass storage_options, cache_dir, cache_limit and timeout to the ShardSource, not beside it"
            )
        return source
    return ShardSource(
        _dataset_dir(source),
        storage_options=settings.storage_options,
        cache_dir=settings.cache_dir,
        cache_limit=settings.cache_limit,
        prefetch=settings.prefetch,
        timeout=settings.timeout,
    )


Index = tuple[Path | str, Manifest, SplitInfo, IndexStamp | None]


_SLACK = 1 << 16  # samples a split may claim past what its files hold, before the claim is refused


def read_index(source: ShardSource, split: str) -> Index:
    """The root, index and split ``split`` of ``source``, read once; its shards are checked to exist.

    With the index's file as it was read (:class:`~.splitreader.IndexStamp`, None for a URL),
    taken before reading it: a shard is opened only while the index is still that file.

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
    stamp = None if source.remote else IndexStamp.of(root)
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
    return root, manifest, split_info, stamp


def _dataset_dir(source: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """``shards/index.json`` -> ``shards``: the shards are read beside their index (as the CLI takes it)."""
    if is_url(source):
        url = str(source)
        return url[: -len(INDEX_NAME) - 1] if url.endswith(f"/{INDEX_NAME}") else source
    path = local_path(source)
    return path.parent if path.suffix == ".json" and path.is_file() else source
