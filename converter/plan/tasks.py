"""What the driver decides before any shard is written: the splits, each one's plan, each shard's task.

Pure functions of the scan and the :class:`~.config.PackConfig`: the same tree and arguments give the
same splits, plans and tasks on any machine and under any engine (:mod:`.engines.engine`), which is what
makes a run's output byte-identical whoever writes its shards, and resumable by either engine.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..config import Check, PackConfig
from ..format.errors import SourceError, SplitFileError
from ..scan.tree import PathTable, ScanResult
from .shards import Plan, make_plan, shard_name
from .splits import Part, split_by_file, split_stratified, whole

__all__ = ["ShardTask", "plan_part", "shard_task", "split_names", "split_parts"]


@dataclass(frozen=True)
class ShardTask:
    """Everything a worker needs to write one shard, from its buckets or (``src`` set) from the tree.

    ``image_format`` is the split's one image format (``"jpg"``, ``"png"``); ``None`` keeps each
    image's own.
    """

    index: int
    name: str
    dst: str
    buckets: tuple[str, ...]
    paths: PathTable
    labels: np.ndarray
    keys: np.ndarray
    classes: tuple[str, ...]
    key_width: int
    check: Check
    resize: int | None
    quality: int
    image_format: str | None = None
    src: str | None = None
    sizes: np.ndarray | None = None
    max_pixels: int | None = None


def split_names(config: PackConfig, listed: dict[str, list[str]] | None) -> tuple[str, ...]:
    """The names of the splits to pack: the split file's, or the split and the held-out one."""
    if listed is not None:
        return tuple(listed)
    if config.val_fraction is not None:
        return (config.split, config.val_split)
    return (config.split,)


def split_parts(scan: ScanResult, config: PackConfig, listed: dict[str, list[str]] | None) -> list[Part]:
    """The parts of the tree to pack, each a split; refuses an empty one.

    ``listed`` is the split file's content (:func:`~.plan.splits.read_split_file`), if ``config`` names one.
    """
    if listed is not None:
        parts = split_by_file(scan, listed, str(config.split_file))
        empty = [p.name for p in parts if not len(p.scan)]
        if empty:
            raise SplitFileError(
                f"split file {config.split_file} lists no image for split(s) {', '.join(empty)}"
            )
        return parts
    if config.val_fraction is None:
        return whole(config.split, scan)
    parts = split_stratified(scan, (config.split, config.val_split), config.val_fraction, config.seed)
    if not len(parts[1].scan):
        raise SourceError(
            f"--val-fraction {config.val_fraction} leaves split {config.val_split!r} empty: every class of "
            f"{scan.root} has a single image (a class needs two to give one to each split)"
        )
    return parts


def plan_part(part: Part, tree_size: int, config: PackConfig) -> Plan:
    """The part's plan; its keys are positions in the whole tree, and its fingerprint covers them."""
    plan = make_plan(
        part.scan, seed=config.seed, shard_size=config.shard_size, max_samples=config.max_samples
    )
    if part.whole:
        return plan
    h = hashlib.sha256(plan.fingerprint.encode())
    h.update(part.positions.astype("<i8").tobytes())
    return replace(plan, key_width=max(6, len(str(max(tree_size - 1, 0)))), fingerprint=h.hexdigest())


def shard_task(
    part: Part,
    plan: Plan,
    i: int,
    dst: Path,
    config: PackConfig,
    image_format: str | None,
    buckets: list[str] | None = None,
) -> ShardTask:
    """The task of writing shard ``i`` of ``part`` into ``dst``.

    The shard is written from its ``buckets`` if they were gathered, else straight from the tree.
    ``image_format`` is the split's one format (``None`` keeps each image's own).
    """
    scan, idx = part.scan, plan.shard(i)
    return ShardTask(
        index=i,
        name=shard_name(part.name, i),
        dst=str(dst),
        buckets=tuple(sorted(buckets or ())),
        paths=scan.paths.take(idx),
        labels=scan.labels[idx],
        keys=part.positions[idx],
        classes=scan.classes,
        key_width=plan.key_width,
        check=Check(config.check),
        resize=config.resize,
        quality=config.quality,
        image_format=image_format,
        src=str(scan.root) if buckets is None else None,
        sizes=scan.sizes[idx] if buckets is None else None,
        max_pixels=config.max_pixels,
    )
