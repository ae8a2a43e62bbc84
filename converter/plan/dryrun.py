"""What ``pack`` would write, without writing anything: each split's samples, shards and size.

``imgshards pack --dry-run`` asks it. It runs the checks of the source (:func:`~.scan.tree.check_source`),
the scan, the splits and the plans that :func:`~.pack.pack` runs (the same functions, :mod:`.plan.tasks`),
and stops before the destination is touched: nothing is created there, not even the directory. The
images are not opened, so its rejects are those the scan finds (wrong extensions, files outside a
class folder, broken links...); ``--check`` finds more while the shards are written. The sizes are
exact for images stored as they are (tar headers, padding and each shard's end counted); conversions
and ``--resize`` change them.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import PackConfig
from ..format.tarwriter import BLOCK, RECORD
from ..scan.tree import check_source, scan_tree
from .shards import estimated_sample_bytes
from .splits import read_split_file
from .tasks import plan_part, split_parts

__all__ = ["DryRun", "SplitPlan", "dry_run"]


@dataclass(frozen=True)
class SplitPlan:
    """One split as a pack would write it.

    Attributes:
        name: The split's name, its shards' prefix.
        samples: Images planned into its shards.
        shard_samples: Samples of each shard, in order.
        bytes: The shards' estimated total size (see the module's docstring).
        class_counts: Samples per class id.
        rejects_by_reason: Files of the tree this split reports, found by the scan, by reason.

    """

    name: str
    samples: int
    shard_samples: tuple[int, ...]
    bytes: int
    class_counts: tuple[int, ...]
    rejects_by_reason: dict[str, int]

    @property
    def shards(self) -> int:
        """Number of shards."""
        return len(self.shard_samples)

    @property
    def rejects_total(self) -> int:
        """Files of the tree the scan rejected, reported by this split."""
        return sum(self.rejects_by_reason.values())


@dataclass(frozen=True)
class DryRun:
    """What :func:`dry_run` found: the classes, each split's plan, and the warnings about the tree."""

    src: Path
    classes: tuple[str, ...]
    splits: tuple[SplitPlan, ...]
    warnings: tuple[str, ...] = ()


def dry_run(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], config: PackConfig | None = None
) -> DryRun:
    """Plan the pack of ``src`` into ``dst`` with ``config``, and write nothing.

    Raises:
        SourceError, SplitFileError, DestinationError: as :func:`~imgshards.converter.pack` would,
            before it writes (the destination's contents are not read).

    """
    config = config or PackConfig()
    warnings = check_source(src, dst, config)
    listed = read_split_file(config.split_file) if config.split_file is not None else None
    scan = scan_tree(Path(src))
    plans = []
    for part in split_parts(scan, config, listed):
        plan = plan_part(part, len(scan), config)
        ends = np.concatenate([[0], np.cumsum(estimated_sample_bytes(part.scan.sizes[plan.order]))])
        members = ends[plan.bounds[1:]] - ends[plan.bounds[:-1]]
        # Each shard's file: its members, two end blocks, padding to a whole record (as the tar writer).
        files = -(-(members + 2 * BLOCK) // RECORD) * RECORD
        counts = np.bincount(part.scan.labels, minlength=len(scan.classes))
        plans.append(
            SplitPlan(
                name=part.name,
                samples=len(part.scan),
                shard_samples=tuple(np.diff(plan.bounds).tolist()),
                bytes=int(files.sum()),
                class_counts=tuple(counts.tolist()),
                rejects_by_reason=dict(sorted(Counter(r.reason.value for r in part.rejects).items())),
            )
        )
    return DryRun(src=Path(src), classes=scan.classes, splits=tuple(plans), warnings=warnings)
