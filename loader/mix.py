"""``MixedDataset``: several packed datasets in one loader, in set proportions, batch by batch.

Every batch of ``batch_size`` samples holds ``b_i`` samples of source ``i``: the batch size split in
proportion to the weights (largest remainders, at least one sample of every source). Each source is
a :class:`~imgshards.loader.ShardDataset` of its own with batch size ``b_i``, partitioned over ranks
and workers like any other; a pass zips their raw batches (batch ``k`` of every source makes batch
``k`` of the mix), shuffles each within the batch, then decodes, transforms and stacks it once.

What holds, for ``W`` ranks:

- **Proportions**: exactly ``b_i / batch_size`` of every batch comes from source ``i``, the last
  batch included, so of every epoch (stratified, not drawn at random: no sampling error at all).
  Every batch is whole: each source reads with ``drop_last``, so its partial last batch (fewer than
  ``b_i`` samples a rank, a different run of them each epoch) is left out rather than zipped with
  the others' whole ones.
- **Equal batches per rank**: an epoch is ``min_i len(source_i)`` batches on every rank, a source
  with more samples than its share leaving different ones out each epoch (its order is reshuffled).
- **Exact resume**: ``k`` batches delivered are ``k`` batches of every source, each of which
  resumes at its batch ``k`` (elastic resume onto another topology included).

Labels: sources with the same class list share it; otherwise the classes are merged by name, as
``ImageFolder`` names them: :attr:`MixedDataset.classes` is the sorted union of the sources' class
names, and each source's labels are mapped onto it, so a class that two sources hold ("dog" in both)
is one label, whichever source a sample comes from.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from imgshards.converter.locate import redact_url
from imgshards.converter.manifest import read_manifest
from imgshards.converter.remotefs import DEFAULT_TIMEOUT

from .dataset import DEFAULT_MAX_LOST, PassDataset, ShardDataset
from .epoch import elastic
from .epoch.position import PassPosition
from .epoch.seeds import mix_rng
from .errors import ConfigError
from .pipeline.batches import LABEL, Batches
from .pipeline.offload import DecodeOn
from .pipeline.passes import raw_pass
from .pipeline.steps import NoClock, StepClock
from .remote import ShardSource
from .state.cursor import Counters

__all__ = ["MixedDataset", "split_batch"]

Source = str | os.PathLike[str] | ShardSource


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


class MixedDataset(PassDataset):
    """Batches mixing several packed datasets (same split name) in proportion to ``weights``.

    Args:
        sources: Directories, URLs or :class:`~imgshards.loader.ShardSource` of packed (or indexed)
            datasets.
        weights: Share of each source in every batch; default: in proportion to their samples.
        batch_size: Samples per batch, all sources together.
        split: The split read from every source.
        seed: Seed of every random choice (each source draws from its own stream of it).
        **options: As for :class:`~imgshards.loader.ShardDataset` (``transform``, ``raw_stages``,
            ``decode_on``, ``rank``...); train mode only, and every source drops its partial last
            batch (``drop_last`` is implied).

    Raises:
        ConfigError: fewer than two sources, eval mode, ``drop_last=False``, or a weight too small
            for the batch size; when a pass starts, a source with fewer samples a rank than its
            share of a batch.

    """

    def __init__(
        self,
        sources: Sequence[Source],
        *,
        weights: Sequence[float] | None = None,
        batch_size: int = 64,
        split: str = "train",
        seed: int = 0,
        **options: Any,
    ) -> None:
        super().__init__(options.get("rank"), options.get("world_size"))
        if isinstance(sources, (str, os.PathLike)) or len(sources) < 2:
            raise ConfigError("a MixedDataset takes two sources or more; for one, use ShardDataset")
        if options.get("mode", "train") != "train":
            raise ConfigError("a mix is for training (mode='train'): evaluate each dataset on its own")
        if options.setdefault("drop_last", True) is not True:
            raise ConfigError(
                "a mix drops each source's partial last batch, so that every batch keeps the weights' "
                "proportions: leave drop_last out"
            )
        sizes = [_samples(s, split, options.get("storage_options"), options.get("timeout")) for s in sources]
        self.weights = tuple(float(w) for w in (weights or sizes))
        if len(self.weights) != len(sources):
            raise ConfigError(f"{len(self.weights)} weights for {len(sources)} sources")
        self.shares = split_batch(batch_size, self.weights)
        # Each part reads its source with its own batch size and seed, on the mix's epoch: it runs the
        # raw half of the mix's pass. The mix runs the rest, once, on the zipped batches.
        self.parts = [
            ShardDataset(s, split=split, batch_size=b, seed=seed + i, **options)
            for i, (s, b) in enumerate(zip(sources, self.shares, strict=True))
        ]
        self.split, self.batch_size, self.seed, self.mode = split, batch_size, seed, "train"
        # The mix's own options (each part checked them as it was made).
        self.max_lost = float(options.get("max_lost", DEFAULT_MAX_LOST))
        self.decode_on = DecodeOn.of(options.get("decode_on"))
        # The parts were given the same options: their images' settings are the mix's, with its seed.
        self.image_settings = replace(self.parts[0].image_settings, seed=seed)
        self.num_samples = sum(p.num_samples for p in self.parts)
        self.shards_digest = "+".join(p.shards_digest for p in self.parts)
        # One label a class name: the sorted union of the parts' classes, and each part's labels
        # mapped onto it (None where a part's list is the mix's: its labels stay as they are).
        same = all(p.manifest.classes == self.parts[0].manifest.classes for p in self.parts)
        self._classes = self.parts[0].classes if same else sorted({c for p in self.parts for c in p.classes})
        ids = {name: i for i, name in enumerate(self._classes)}
        self._relabel: list[np.ndarray | None] = [
            None if p.classes == self._classes else np.array([ids[c] for c in p.classes], dtype=np.int64)
            for p in self.parts
        ]

    @property
    def classes(self) -> list[str]:
        """Class names; a label is a position here (see the module docstring for differing sources)."""
        return list(self._classes)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label, as ``ImageFolder.class_to_idx`` (a name several sources hold is one label)."""
        return {name: i for i, name in enumerate(self._classes)}

    @property
    def dropped_per_epoch(self) -> int:
        """Samples of the sources no rank sees in one epoch (past the shortest source's epoch)."""
        return self.num_samples - len(self) * self.world_size * self.batch_size

    def _roots(self) -> list[Path | str]:
        return [p.root for p in self.parts]

    def _sources(self) -> list[ShardSource]:
        return [p.source for p in self.parts]

    def rank_samples(self) -> int:
        """Samples this rank's pass plans to deliver: its batches, all whole (train mode)."""
        return len(self) * self.batch_size

    def leg_batches(self) -> int:
        """Batches this rank yields in the current leg of the epoch: the shortest source's.

        Raises:
            ConfigError: a source has fewer samples a rank than its share of a batch (no batch at all).

        """
        world_size = self._pass_ranks()[1]
        legs = self.cursor.legs
        batches = [
            elastic.rank_batches(p.layout, epoch=self.epoch, legs=legs, world_size=world_size)
            for p in self.parts
        ]
        if not legs and not min(batches):
            empty = batches.index(0)
            part = self.parts[empty]
            raise ConfigError(
                f"source {empty} ({redact_url(str(part.root))}) has {part.num_samples // world_size} "
                f"sample(s) a rank, fewer than its {part.batch_size} a batch: an epoch would be empty; lower "
                "its weight or the batch size"
            )
        return min(batches)

    def batches_in_leg(self, epoch: int, legs: tuple[elastic.Leg, ...], world_size: int) -> int:
        """The batches every rank yields in ``epoch``'s leg after ``legs``: the shortest source's."""
        return min(
            elastic.rank_batches(p.layout, epoch=epoch, legs=legs, world_size=world_size) for p in self.parts
        )

    def resume_settings(self) -> dict[str, Any]:
        """The parts' order settings (the same in every part), the mix's data, batch and weights."""
        return {
            **self.parts[0].resume_settings(),
            "shards": self.shards_digest,
            "samples": self.num_samples,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "weights": list(self.weights),
            "shares": list(self.shares),
        }

    def _raw(self, at: PassPosition, counters: Counters, clock: StepClock | NoClock) -> Batches:
        """Batch ``k`` of every source, as one batch: labels mapped onto the mix's, shuffled within it."""
        streams = [raw_pass(p.read_settings, at, counters, clock=clock) for p in self.parts]
        for batches in zip(*streams, strict=False):  # the shortest source ends the epoch
            k = batches[0][0]
            samples = [
                s if relabel is None else {**s, LABEL: int(relabel[s[LABEL]])}
                for (_, part), relabel in zip(batches, self._relabel, strict=True)
                for s in part
            ]
            rng = mix_rng(self.seed, at.epoch, at.rank, at.worker, k)
            yield k, [samples[i] for i in rng.permutation(len(samples))]
        for stream in streams:
            stream.close()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        roots = ", ".join(repr(redact_url(str(p.root))) for p in self.parts)
        return (
            f"{type(self).__name__}([{roots}], weights={list(self.weights)}, shares={self.shares}, "
            f"batch_size={self.batch_size}, rank={self.rank}/{self.world_size})"
        )


def _samples(source: Source, split: str, storage_options: Any, timeout: float | None) -> int:
    if isinstance(source, ShardSource):  # its options hold its timeouts
        return read_manifest(source.root, storage_options=source.storage_options).split(split).samples
    # The index of a URL is read with the timeouts its ShardDataset will read the shards with.
    source = ShardSource(source, storage_options=storage_options, timeout=timeout or DEFAULT_TIMEOUT)
    return read_manifest(source.root, storage_options=source.storage_options).split(split).samples
