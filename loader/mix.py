"""``MixedDataset``: several packed datasets in one loader, in set proportions, batch by batch.

Every batch of ``batch_size`` samples holds ``b_i`` samples of source ``i``: the batch size split in
proportion to the weights (largest remainders, at least one sample of every source). Each source is
a part of the mix's spec (:class:`~.pipeline.spec.Part`), read with batch size ``b_i`` and
partitioned over ranks and workers as a :class:`~imgshards.loader.ShardDataset` is; a pass zips
their raw batches (batch ``k`` of every source makes batch ``k`` of the mix), shuffles each within
the batch, then decodes, transforms and stacks it once (:func:`.pipeline.passes.raw_batches`).

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
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from imgshards.converter.format.locate import redact_url

from .dataset import PassDataset
from .errors import ConfigError
from .image.presets import Transform
from .pipeline.batches import Stage
from .pipeline.offload import DecodeOn
from .pipeline.settings import DEFAULT_MAX_LOST, Mode, OnError, Settings
from .pipeline.spec import make_spec
from .remote import ShardSource
from .remote.ranges import DEFAULT_TIMEOUT
from .state.ranks import settle_ranks

__all__ = ["MixedDataset"]

Source = str | os.PathLike[str] | ShardSource


class MixedDataset(PassDataset):
    """Batches mixing several packed datasets (same split name) in proportion to ``weights``.

    Args:
        sources: Directories, URLs or :class:`~imgshards.loader.ShardSource` of packed (or indexed)
            datasets.
        weights: Share of each source in every batch; default: in proportion to their samples.
        split: The split read from every source.
        batch_size: Samples per batch, all sources together.
        seed: Seed of every random choice (each source draws from its own stream of it).
        drop_last: Always: every source drops its partial last batch (``True``, the only value
            a mix takes).
        The other settings: as for :class:`~imgshards.loader.ShardDataset`, with the same names and
            defaults (docs/loading.md's table); ``mode`` is ``"train"`` only.

    Raises:
        ConfigError: fewer than two sources, eval mode, ``drop_last=False``, a weight that is not a
            finite positive number (or weights whose sum overflows a float), or a weight too small
            for the batch size; when a pass starts, a source with fewer samples a rank than its
            share of a batch.

    """

    def __init__(
        self,
        sources: Sequence[Source],
        *,
        weights: Sequence[float] | None = None,
        split: str = "train",
        batch_size: int = 64,
        mode: Mode = "train",
        transform: str | Transform | None = None,
        image_size: int = 224,
        shuffle: bool | None = None,
        shuffle_buffer: int = 2000,
        shuffle_initial: int = 100,
        drop_last: bool = True,
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
        settings = Settings.of(locals())
        # Checked now for an early error, but settled as each pass starts (see .state.ranks).
        settle_ranks(rank, world_size)
        if isinstance(sources, (str, os.PathLike)) or len(sources) < 2:
            raise ConfigError("a MixedDataset takes two sources or more; for one, use ShardDataset")
        if mode != "train":
            raise ConfigError("a mix is for training (mode='train'): evaluate each dataset on its own")
        if drop_last is not True:
            raise ConfigError(
                "a mix drops each source's partial last batch, so that every batch keeps the weights' "
                "proportions: leave drop_last out"
            )
        if weights is not None:
            _check_weights(weights)
        spec = make_spec(sources, settings, weights=weights)
        super().__init__(spec, rank, world_size)

    @property
    def weights(self) -> tuple[float, ...]:
        """The share of each source in a batch, as given (default: their samples)."""
        return self.spec.weights

    @property
    def shares(self) -> list[int]:
        """Samples of each source in every batch: ``batch_size`` split by the weights."""
        return self.spec.shares

    def __repr__(self) -> str:
        spec = self.spec
        roots = ", ".join(repr(redact_url(str(r))) for r in spec.roots())
        return (
            f"{type(self).__name__}([{roots}], weights={list(spec.weights)}, shares={spec.shares}, "
            f"batch_size={spec.batch_size}, rank={self.rank}/{self.world_size})"
        )


def _check_weights(weights: Sequence[float]) -> None:
    """Refuse, in one line, a weight that is not a finite positive number, or weights whose sum overflows.

    The batch is split by ``weight / sum(weights)``: an infinite weight made it NaN (an
    ``AssertionError`` at the first batch), and ``[1e308, 1e308]`` an infinite sum (a batch of 2 for
    ``batch_size=8``).
    """
    values: list[float] = []
    for i, weight in enumerate(weights):
        try:
            value = float(weight)
        except (TypeError, ValueError):
            value = math.nan
        if isinstance(weight, bool) or not math.isfinite(value) or value <= 0:
            raise ConfigError(
                f"weight {i} of the mix is {weight!r}: weights must be finite positive numbers, one a "
                "source (only their ratios count: [3, 1] puts 3 samples of source 0 for 1 of source 1)"
            )
        values.append(value)
    if not math.isfinite(sum(values)):
        raise ConfigError(
            f"the mix's weights {list(weights)} add up past the largest float: scale them down "
            "(only their ratios count: [1, 1] mixes as [1e308, 1e308] would)"
        )


MixedDataset._arguments = frozenset(inspect.signature(MixedDataset).parameters)
