"""``MixedDataset``: several packed datasets in one loader, in set proportions, batch by batch.

Every batch of ``batch_size`` samples holds ``b_i`` samples of source ``i``: the batch size split in
proportion to the weights (largest remainders, at least one sample of every source). Each source is
a part of the mix's spec (:class:`~.pipeline.spec.Part`), read with batch size ``b_i`` and
partitioned over ranks and workers as a :class:`~imgshards.loader.ShardDataset` is; a pass zips
their raw batches (batch ``k`` of every source makes batch ``k`` of the mix), shuffles each within
the batch, then decodes, transforms and stacks it once (:meth:`.pipeline.spec.Spec.raw`).

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

import inspect
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from imgshards.converter.format.locate import redact_url

from .dataset import (
    PassDataset,
    ShardDataset,
    check_settings,
    image_spec,
    open_source,
    read_index,
    split_part,
)
from .errors import ConfigError
from .pipeline.spec import Spec
from .remote import ShardSource
from .state.ranks import settle_ranks

__all__ = ["MixedDataset", "split_batch"]

Source = str | os.PathLike[str] | ShardSource

# ShardDataset's options, with their defaults: what a mix's **options may hold.
_OPTIONS = {
    name: p.default
    for name, p in inspect.signature(ShardDataset).parameters.items()
    if name not in ("source", "split", "batch_size", "seed")
}


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
        for name in options:
            if name not in _OPTIONS:
                raise TypeError(f"MixedDataset.__init__() got an unexpected keyword argument {name!r}")
        # Checked now for an early error, but settled as each pass starts (see .state.ranks).
        settle_ranks(options.get("rank"), options.get("world_size"))
        if isinstance(sources, (str, os.PathLike)) or len(sources) < 2:
            raise ConfigError("a MixedDataset takes two sources or more; for one, use ShardDataset")
        if options.get("mode", "train") != "train":
            raise ConfigError("a mix is for training (mode='train'): evaluate each dataset on its own")
        if options.setdefault("drop_last", True) is not True:
            raise ConfigError(
                "a mix drops each source's partial last batch, so that every batch keeps the weights' "
                "proportions: leave drop_last out"
            )
        o = {**_OPTIONS, **options}
        # Each index read once: the sizes give the default weights, the parts are made of the same read.
        opened = [
            open_source(
                s,
                storage_options=o["storage_options"],
                cache_dir=o["cache_dir"],
                cache_limit=o["cache_limit"],
                prefetch=o["prefetch"],
                timeout=o["timeout"],
            )
            for s in sources
        ]
        indexes = [read_index(s, split) for s in opened]
        weights = tuple(float(w) for w in (weights or [info.samples for _, _, info in indexes]))
        if len(weights) != len(sources):
            raise ConfigError(f"{len(weights)} weights for {len(sources)} sources")
        shares = split_batch(batch_size, weights)
        for i, share in enumerate(shares):  # each part's settings, checked as a ShardDataset checks its own
            check_settings(
                mode=o["mode"],
                on_error=o["on_error"],
                batch_size=share,
                seed=seed + i,
                drop_last=True,
                max_lost=o["max_lost"],
                shuffle_buffer=o["shuffle_buffer"],
                shuffle_initial=o["shuffle_initial"],
            )
        # The images of every part are made alike, once the batch is zipped: with the mix's seed.
        image, offload, raw_stages = image_spec(
            o["transform"],
            image_size=o["image_size"],
            mode="train",
            seed=seed,
            on_error=o["on_error"],
            decode_on=o["decode_on"],
            raw_stages=o["raw_stages"],
            image_stages=o["image_stages"],
        )
        # One label a class name: the sorted union of the parts' classes, and each part's labels
        # mapped onto it (None where a part's list is the mix's: its labels stay as they are).
        names = [list(manifest.classes) for _, manifest, _ in indexes]
        classes = names[0] if all(n == names[0] for n in names) else sorted({c for n in names for c in n})
        ids = {name: i for i, name in enumerate(classes)}
        # Each part reads its source with its own batch size and seed, on the mix's epoch: it runs the
        # raw half of the mix's pass. The mix runs the rest, once, on the zipped batches.
        parts = tuple(
            split_part(
                source,
                index,
                split=split,
                batch_size=share,
                mode="train",
                shuffle=True if o["shuffle"] is None else o["shuffle"],
                shuffle_buffer=o["shuffle_buffer"],
                shuffle_initial=o["shuffle_initial"],
                drop_last=True,
                seed=seed + i,
                on_error=o["on_error"],
                raw_stages=raw_stages,
                views=not (raw_stages or image.image_stages),
                relabel=None if own == classes else np.array([ids[c] for c in own], dtype=np.int64),
            )
            for i, (source, index, share, own) in enumerate(zip(opened, indexes, shares, names, strict=True))
        )
        spec = Spec(
            parts,
            image,
            split=split,
            batch_size=batch_size,
            mode="train",
            seed=seed,
            max_lost=float(o["max_lost"]),
            decode_on=offload,
            classes=tuple(classes),
            weights=weights,
        )
        super().__init__(spec, options.get("rank"), options.get("world_size"))

    @property
    def weights(self) -> tuple[float, ...]:
        """The share of each source in every batch, as given (default: their samples)."""
        return self._spec.weights

    @property
    def shares(self) -> list[int]:
        """Samples of each source in a batch: ``batch_size`` split by :attr:`weights`."""
        return self._spec.shares

    def __repr__(self) -> str:
        roots = ", ".join(repr(redact_url(str(r))) for r in self._spec.roots())
        return (
            f"{type(self).__name__}([{roots}], weights={list(self.weights)}, shares={self.shares}, "
            f"batch_size={self.batch_size}, rank={self.rank}/{self.world_size})"
        )


MixedDataset._arguments = frozenset(inspect.signature(MixedDataset).parameters) - {"options"} | set(_OPTIONS)
