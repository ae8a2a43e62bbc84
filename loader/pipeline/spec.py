"""What a dataset reads, fixed when it is made: one packed split or several, and how images are made.

A :class:`Spec` is the frozen half of a dataset (the other, what changes as it is read, is
:class:`~..state.progress.EpochProgress`): its parts (:class:`Part`, one packed split each, with
the :class:`~.passes.ReadSettings` a pass reads it with), the :class:`~.passes.ImageSettings` its
batches are made with, and the settings a user gave. It answers what the epoch asks (batches in a
leg, samples a rank plans, the settings a resume checks) and gives a pass its raw batches
(:meth:`Spec.raw`). A :class:`~imgshards.loader.ShardDataset` is a spec of one part; a
:class:`~imgshards.loader.MixedDataset` one of several, zipped: batch ``k`` of every part makes
batch ``k`` of the mix, its labels mapped onto the mix's classes, shuffled within the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from imgshards.converter.format.locate import redact_url
from imgshards.converter.format.manifest import Manifest, SplitInfo

from ..epoch import elastic, partition
from ..epoch.position import Leg, PassPosition
from ..epoch.seeds import mix_rng
from ..errors import ConfigError
from ..remote import ShardSource
from ..state.cursor import Counters
from .batches import LABEL, Batches
from .offload import DecodeOn
from .passes import ImageSettings, ReadSettings, raw_pass
from .steps import NoClock, StepClock

__all__ = ["Part", "Spec"]


@dataclass(frozen=True, eq=False)
class Part:
    """One packed split a dataset reads, and how a pass reads it.

    ``relabel`` maps the part's labels onto the dataset's classes (``None``: its labels are the
    dataset's). Its share of a batch is its :attr:`layout`'s batch size.
    """

    root: Path | str
    manifest: Manifest
    read: ReadSettings
    shards_digest: str  # which data a resume state is of (state.checkpoint.shards_digest)
    relabel: np.ndarray | None = None

    @property
    def source(self) -> ShardSource:
        """Where the shards are read from."""
        return self.read.source

    @property
    def split_info(self) -> SplitInfo:
        """The split's shards, as its index lists them."""
        return self.read.split

    @property
    def layout(self) -> elastic.Layout:
        """What fixes the part's order: its shards' sizes, seed, batch share, shuffle and buffer."""
        return self.read.layout

    @property
    def num_samples(self) -> int:
        """Samples of the split."""
        return sum(self.read.layout.shard_samples)


@dataclass(frozen=True, eq=False)
class Spec:
    """What a dataset reads and how it makes batches of it: fixed when the dataset is made."""

    parts: tuple[Part, ...]
    image: ImageSettings
    split: str
    batch_size: int
    mode: str  # "train" or "eval"
    seed: int
    max_lost: float
    decode_on: DecodeOn | None
    classes: tuple[str, ...]
    weights: tuple[float, ...] = ()  # several parts: the share of each in a batch, as given

    @property
    def num_samples(self) -> int:
        """Samples of every part together."""
        return sum(p.num_samples for p in self.parts)

    @property
    def shards_digest(self) -> str:
        """Which data a resume state is of: the parts' digests."""
        return "+".join(p.shards_digest for p in self.parts)

    @property
    def shares(self) -> list[int]:
        """Samples of each part in a batch."""
        return [p.layout.batch_size for p in self.parts]

    def _kw(self) -> dict[str, Any]:
        # One part's partition (eval, and a train rank's samples): the batches of the whole spec.
        drop_last = self.parts[0].layout.drop_last
        return {"batch_size": self.batch_size, "train": self.mode == "train", "drop_last": drop_last}

    # ---- what the epoch asks ----------------------------------------------------------------------

    def leg_batches(self, epoch: int, legs: tuple[Leg, ...], rank: int, world_size: int) -> int:
        """Batches rank ``rank`` yields in ``epoch``'s leg after ``legs``: the shortest part's.

        Raises:
            ConfigError: of several parts, one has fewer samples a rank than its share of a batch.

        """
        if self.mode == "eval":
            return partition.rank_batches(self.num_samples, world_size=world_size, **self._kw())[rank]
        batches = [
            elastic.rank_batches(p.layout, epoch=epoch, legs=legs, world_size=world_size) for p in self.parts
        ]
        if len(self.parts) > 1 and not legs and not min(batches):
            empty = batches.index(0)
            part = self.parts[empty]
            raise ConfigError(
                f"source {empty} ({redact_url(str(part.root))}) has {part.num_samples // world_size} "
                f"sample(s) a rank, fewer than its {part.layout.batch_size} a batch: an epoch would be "
                "empty; lower its weight or the batch size"
            )
        return min(batches)

    def batches_in_leg(self, epoch: int, legs: tuple[Leg, ...], world_size: int) -> int:
        """The most batches a rank yields in ``epoch``'s leg after ``legs`` at ``world_size`` ranks."""
        if self.mode == "eval":  # eval has no legs: its ranks yield one batch apart at most
            return max(partition.rank_batches(self.num_samples, world_size=world_size, **self._kw()))
        return min(
            elastic.rank_batches(p.layout, epoch=epoch, legs=legs, world_size=world_size) for p in self.parts
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
        layout = self.parts[0].layout  # the order settings, the same in every part
        settings: dict[str, Any] = {
            "split": self.split,
            "shards": self.shards_digest,
            "samples": self.num_samples,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "mode": self.mode,
            "shuffle": layout.shuffle,
            "shuffle_buffer": layout.shuffle_buffer,
            "shuffle_initial": layout.shuffle_initial,
            "drop_last": layout.drop_last,
        }
        if len(self.parts) > 1:
            settings |= {"weights": list(self.weights), "shares": self.shares}
        return settings

    def roots(self) -> list[Path | str]:
        """Where the data is, for messages."""
        return [p.root for p in self.parts]

    def sources(self) -> list[ShardSource]:
        """What a pass reads from."""
        return [p.source for p in self.parts]

    def settle(self) -> None:
        """Settle the sources as a pass ends: its downloads reach the cache."""
        for source in self.sources():
            source.settle()

    # ---- a pass -----------------------------------------------------------------------------------

    def raw(self, at: PassPosition, counters: Counters, clock: StepClock | NoClock) -> Batches:
        """``(k, raw samples)`` of the pass of ``at``, the user's raw stages run; several parts zipped."""
        if len(self.parts) == 1:
            return raw_pass(self.parts[0].read, at, counters, clock=clock)
        return self._zipped(at, counters, clock)

    def _zipped(self, at: PassPosition, counters: Counters, clock: StepClock | NoClock) -> Batches:
        """Batch ``k`` of every part, as one batch: labels mapped onto the spec's, shuffled within it."""
        streams = [raw_pass(p.read, at, counters, clock=clock) for p in self.parts]
        for batches in zip(*streams, strict=False):  # the shortest part ends the epoch
            k = batches[0][0]
            samples = [
                s if part.relabel is None else {**s, LABEL: int(part.relabel[s[LABEL]])}
                for (_, raw), part in zip(batches, self.parts, strict=True)
                for s in raw
            ]
            rng = mix_rng(self.seed, at.epoch, at.rank, at.worker, k)
            yield k, [samples[i] for i in rng.permutation(len(samples))]
        for stream in streams:
            stream.close()  # type: ignore[attr-defined]
