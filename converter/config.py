"""What ``pack`` is asked to do: :class:`PackConfig`, and the closed sets of its settings.

Read by every stage (scan, plan, write, the engines), so it imports none of them: the closed sets
of its settings are its own (:class:`Check`, :class:`ReadOrder`, :data:`ENGINES`), which those
stages import from here. What a run did and what a remote destination plugs in (``PackResult``,
``PackHooks``) are :mod:`.pack`'s, which hands them on.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .format.errors import shown
from .format.validate import split_name_error

__all__ = ["DEFAULT_SHARD_SIZE", "ENGINES", "MAX_SEED", "Check", "PackConfig", "ReadOrder"]

DEFAULT_SHARD_SIZE = 256 * 10**6
MAX_SEED = 2**63 - 1  # numpy's generators take any non-negative integer; an int64 fits every reader
# The engines ``pack`` runs on (PackConfig.engine, ``--engine``): engines.engine.make_engine makes each.
ENGINES = ("pool", "ray")


class Check(str, enum.Enum):
    """How thoroughly ``pack`` checks each input file (``--check``; the levels: :mod:`.scan.check`)."""

    NONE = "none"
    HEADER = "header"
    FULL = "full"


class ReadOrder(str, enum.Enum):
    """How ``pack`` reads the tree (``--read-order``; :mod:`.scan.readorder` decides ``auto``)."""

    AUTO = "auto"
    DISK = "disk"
    PLAN = "plan"


@dataclass(frozen=True, kw_only=True)
class PackConfig:
    """How to pack a tree. Fields other than how and where it runs (workers ... progress) shape the output.

    Attributes:
        split: Name of the split, the shards' prefix (``train-000000.tar``): lower-case letters,
            digits and underscores, at most 100 (:func:`~.format.validate.split_name_error`). With
            ``val_fraction``, the split of the rest of the tree.
        shard_size: Shards are closed before their members pass this many bytes (at least one
            sample each); the end of the tar adds up to ``tarwriter.END_AT_MOST`` bytes to the file.
        max_samples: Also close a shard once it holds this many samples (tarp's ``--maxcount``,
            ``webdataset.ShardWriter(maxcount=)``); ``None``: the size alone decides.
        seed: Seed of the global shuffle that mixes classes across shards, in 0..``MAX_SEED``.
        check: ``"header"`` (cheap, catches non-images, empty and truncated files), ``"full"``
            (decodes every image) or ``"none"``. See :mod:`imgshards.converter.scan.check`.
        max_pixels: Reject an image whose header declares more pixels (``width * height``) than
            this, before decoding it: a decompression bomb. ``None``: Pillow's
            ``Image.MAX_IMAGE_PIXELS``. Not applied with ``check="none"``.
        resize: Re-encode images as RGB JPEGs with the shorter side at most this many pixels
            (never upscaled); ``None`` stores the original bytes.
        quality: JPEG quality of re-encoded images.
        keep_formats: Store every image's own bytes under the extension of its format, instead of
            one format per split (see :mod:`imgshards.converter.format.formats`).
        val_fraction: Also write a held-out split ``val_split`` of about this share of each class
            (stratified, seeded by ``seed``; see :mod:`imgshards.converter.plan.splits`).
        val_split: Name of the held-out split.
        split_file: A JSON file mapping split names to the tree's paths in them; the splits packed
            are its keys (``split`` is then unused).
        workers: Worker processes writing shards; ``None`` for one per core.
        read_order: ``"disk"`` (gather the tree in inode order first), ``"plan"`` (read each shard's
            files straight from the tree) or ``"auto"`` (``plan`` when the tree is in the page cache).
        engine: Where the shards are written: ``"pool"`` (worker processes on this machine) or
            ``"ray"`` (Ray tasks across a cluster's machines; see
            :mod:`imgshards.converter.engines.rayengine`).
            The output is the same bytes either way, and a run of one can be resumed by the other.
        ray_address: The Ray cluster to join (``"auto"``, ``"HOST:6379"``, ``"ray://HOST:10001"``);
            ``None`` joins the one this process is connected to, or starts a local one.
        overwrite: Replace a split packed into ``dst`` with other arguments or from another tree.
        progress: Show progress bars on stderr.
        strict: Refuse a tree that looks like the wrong folder (class folders named like splits, or
            only folders at the top of every class folder: see :func:`~.scan.tree.tree_warnings`)
            instead of packing it with a warning in :attr:`PackResult.warnings`.
        allow_split_names: Pack a tree whose class folders are all named like splits (``train``,
            ``val``...) as classes. Refused otherwise: it is the folder above the trees of the
            splits far more often than a dataset of those classes (see :func:`~.scan.tree.split_tree_error`).

    """

    split: str = "train"
    shard_size: int = DEFAULT_SHARD_SIZE
    max_samples: int | None = None
    seed: int = 0
    check: Check | str = Check.HEADER
    max_pixels: int | None = None
    resize: int | None = None
    quality: int = 90
    keep_formats: bool = False
    val_fraction: float | None = None
    val_split: str = "val"
    split_file: str | os.PathLike[str] | None = None
    workers: int | None = None
    read_order: ReadOrder | str = ReadOrder.AUTO
    engine: str = "pool"
    ray_address: str | None = None
    overwrite: bool = False
    progress: bool = False
    strict: bool = False
    allow_split_names: bool = False

    def __post_init__(self) -> None:
        for name, value in (("split", self.split), ("val_split", self.val_split)):
            if (problem := split_name_error(value, name)) is not None:
                raise ValueError(problem)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be an integer in 0..{MAX_SEED}, got {shown(self.seed)}")
        if self.val_fraction is not None:
            if not 0 < self.val_fraction < 1:
                raise ValueError(f"val_fraction must be between 0 and 1 (exclusive), got {self.val_fraction}")
            if self.val_split == self.split:
                raise ValueError(f"val_split must differ from split, both are {self.split!r}")
            if self.split_file is not None:
                raise ValueError("give val_fraction or split_file, not both: a split file names every split")
        try:
            object.__setattr__(self, "read_order", ReadOrder(self.read_order))
        except ValueError:
            allowed = ", ".join(r.value for r in ReadOrder)
            raise ValueError(f"read_order must be one of {allowed}; got {self.read_order!r}") from None
        if self.shard_size < 1:
            raise ValueError(f"shard_size must be a positive number of bytes, got {self.shard_size}")
        try:
            object.__setattr__(self, "check", Check(self.check))
        except ValueError:
            allowed = ", ".join(c.value for c in Check)
            raise ValueError(f"check must be one of {allowed}; got {self.check!r}") from None
        if self.max_samples is not None and self.max_samples < 1:
            raise ValueError(f"max_samples must be a positive number of samples, got {self.max_samples}")
        if self.max_pixels is not None and self.max_pixels < 1:
            raise ValueError(f"max_pixels must be a positive number of pixels, got {self.max_pixels}")
        if self.resize is not None and self.resize < 1:
            raise ValueError(f"resize must be a positive number of pixels, got {self.resize}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be between 1 and 100, got {self.quality}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}; got {self.engine!r}")
        if self.ray_address is not None and self.engine != "ray":
            raise ValueError("ray_address applies to engine 'ray' only")

    def output_args(self, src: Path) -> dict[str, Any]:
        """The arguments that shape the output, as recorded in the index."""
        check = self.check.value if isinstance(self.check, Check) else self.check
        # Recorded only when set, so the packs made before these options still match their reruns.
        bound = {} if self.max_pixels is None else {"max_pixels": self.max_pixels}
        count = {} if self.max_samples is None else {"max_samples": self.max_samples}
        return {
            **bound,
            **count,
            "source": str(src),
            "seed": self.seed,
            "shard_size": self.shard_size,
            "check": check,
            "resize": self.resize,
            "quality": self.quality if self.resize is not None else None,
            "keep_formats": self.keep_formats,
            "val_fraction": self.val_fraction,
            "val_split": self.val_split if self.val_fraction is not None else None,
            "split_file": str(Path(self.split_file).resolve()) if self.split_file is not None else None,
        }
