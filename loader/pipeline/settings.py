"""The settings of a dataset over packed shards: each declared once, with its type, default and doc.

:class:`Settings` is what a user gives a :class:`~imgshards.loader.ShardDataset` (or a
:class:`~imgshards.loader.MixedDataset`) besides its source, as given, frozen; ``ds.settings`` reads
it back. The dataset's signature spells the same names out, so that a reader (and an IDE) sees them;
``tests/loader/test_settings.py`` holds the signature, this class and the docs (the dataset's
docstring, docs/loading.md's table) to the same names and defaults. :func:`~.spec.make_spec` makes
the frozen spec a pass reads from them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

import torch

from imgshards.converter.format.locate import redact_url

from ..errors import ConfigError, check_choice
from ..image.presets import Transform
from ..remote.ranges import DEFAULT_TIMEOUT
from .batches import Stage
from .offload import DecodeOn

__all__ = ["DEFAULT_MAX_LOST", "MODES", "ON_ERROR", "Mode", "OnError", "Settings"]

Mode = Literal["train", "eval"]
OnError = Literal["skip", "raise"]
MODES: tuple[str, ...] = get_args(Mode)
ON_ERROR: tuple[str, ...] = get_args(OnError)
DEFAULT_MAX_LOST = 0.01  # a pass may lose 1% of a rank's samples to damaged shards, warned about


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every setting of a dataset, as given (``None``: the default that follows from the others).

    Make a dataset like another with :func:`dataclasses.replace`:
    ``ShardDataset(ds.root, **vars(dataclasses.replace(ds.settings, batch_size=128)))``.
    :class:`~imgshards.loader.ShardDataset`'s docstring says more of each.

    Attributes:
        split: Which split to read.
        batch_size: Samples per batch.
        mode: "train" (equal batches on every rank, shuffled) or "eval" (every sample once).
        transform: A preset name or a callable making a fixed-size image tensor; None: the mode's preset.
        image_size: Output size of a preset transform.
        shuffle: Shuffle shard order and samples; None: in train mode only.
        shuffle_buffer: Samples in each worker's shuffle buffer (<= 1: no buffer).
        shuffle_initial: Samples in the buffer before the first is yielded.
        drop_last: Train mode only: drop each rank's partial last batch.
        seed: Seed of every random choice; the same on every rank.
        rank: This process's rank where no process group or launcher says it; None: 0.
        world_size: The number of ranks, as for rank; None: 1.
        on_error: "skip" (drop, count and warn) or "raise", for an image or a remote shard that fails.
        max_lost: The share of a rank's samples a pass may lose to damaged or unreadable shards.
        storage_options: Options of the URL's fsspec file system (endpoint, credentials...).
        cache_dir: Local directory caching remote shards.
        cache_limit: Most bytes the cache directory holds (required with cache_dir).
        prefetch: Shards each worker downloads into the cache ahead of its reading.
        timeout: Seconds a remote request may wait on the server before the try fails.
        decode_on: "cuda", "cpu" or a DecodeOn: decode and augment in the training process.
        raw_stages: User stages run on raw samples in the workers.
        image_stages: User stages run on decoded, transformed samples in the workers.

    """

    split: str = "train"
    batch_size: int = 64
    mode: Mode = "train"
    transform: str | Transform | None = None
    image_size: int = 224
    shuffle: bool | None = None
    shuffle_buffer: int = 2000
    shuffle_initial: int = 100
    drop_last: bool = False
    seed: int = 0
    rank: int | None = None
    world_size: int | None = None
    on_error: OnError = "skip"
    max_lost: float = DEFAULT_MAX_LOST
    storage_options: Mapping[str, Any] | None = None
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | None = None
    prefetch: int = 2
    timeout: float = DEFAULT_TIMEOUT
    decode_on: DecodeOn | str | torch.device | None = None
    raw_stages: Sequence[Stage] | None = None
    image_stages: Sequence[Stage] | None = None

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> Settings:
        """The settings among a dataset's ``arguments`` (its ``locals()`` as its ``__init__`` starts).

        The datasets spell every setting out in their signatures, for a reader and a type checker;
        this takes them from there by name, so that no list of the names is written a third time.
        """
        return cls(**{f.name: arguments[f.name] for f in fields(cls)})

    def __repr__(self) -> str:
        # Nothing secret in a log line: storage options may hold credentials, a URL a password.
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "storage_options" and value is not None:
                text = "{...}"
            elif isinstance(value, str):
                text = repr(redact_url(value))
            else:
                text = repr(value)
            shown.append(f"{f.name}={text}")
        return f"{type(self).__name__}({', '.join(shown)})"

    def check(self) -> None:
        """Raise :class:`ConfigError` for a setting out of range or not among the allowed values.

        The image settings (transform, decode_on, stages) are checked as the spec makes them, the
        remote ones as the source opens, the ranks as each pass starts (:mod:`..state.ranks`).
        """
        check_choice("mode", self.mode, MODES)
        check_choice("on_error", self.on_error, ON_ERROR)
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed}")
        if self.drop_last and self.mode == "eval":
            raise ConfigError("drop_last applies to mode='train' only: eval yields every sample exactly once")
        if not 0 <= self.max_lost <= 1:
            raise ConfigError(
                f"max_lost is a share of the samples, from 0 (none) to 1 (all), got {self.max_lost}"
            )
        if self.shuffle_buffer < 0 or self.shuffle_initial < 0:
            raise ConfigError(
                "shuffle_buffer and shuffle_initial must be >= 0, got "
                f"{self.shuffle_buffer}, {self.shuffle_initial}"
            )
