"""Decide which sample goes to which shard: a seeded global shuffle, then shards closed by size or count.

The plan is a pure function of the scan (paths, labels, sizes in ImageFolder order) and the seed,
shard size and sample cap, so the same inputs give the same shards on any machine, whatever the worker count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..format.tarwriter import BLOCK

if TYPE_CHECKING:
    from ..scan.tree import ScanResult

__all__ = ["Plan", "make_plan", "shard_name"]

# The .cls and .json members of a sample: a header and one data block each (the JSON is far
# shorter than 512 bytes for any sane path).
_SAMPLE_OVERHEAD = 2 * (2 * BLOCK)


@dataclass(frozen=True)
class Plan:
    """The shards of a split: ``order[bounds[i]:bounds[i + 1]]`` are the samples of shard ``i``.

    Sample indices are positions in the scan (ImageFolder order); each sample's key is its index,
    zero-padded to ``key_width`` digits, so keys are unique, dot-free and stable for a given tree.
    """

    order: np.ndarray
    bounds: np.ndarray
    key_width: int
    fingerprint: str

    @property
    def num_shards(self) -> int:
        """Number of shards."""
        return len(self.bounds) - 1

    def shard(self, i: int) -> np.ndarray:
        """Sample indices of shard ``i``, in the order they are written."""
        return self.order[self.bounds[i] : self.bounds[i + 1]]


def estimated_sample_bytes(sizes: np.ndarray) -> np.ndarray:
    """Bytes each sample will take in a shard (exact for images stored as they are)."""
    return BLOCK + -(-sizes // BLOCK) * BLOCK + _SAMPLE_OVERHEAD  # as tarwriter.member_size


def make_plan(scan: ScanResult, *, seed: int, shard_size: int, max_samples: int | None = None) -> Plan:
    """Shuffle the samples with ``seed`` and cut them into shards of at most ``shard_size`` bytes.

    A shard holds at least one sample, so a single image larger than ``shard_size`` gets a shard of
    its own, and at most ``max_samples`` samples (``None``: no cap). The estimate is exact for
    images stored as they are; re-encoded ones come out smaller.
    """
    n = len(scan)
    order = np.random.default_rng(seed).permutation(n)
    ends = np.cumsum(estimated_sample_bytes(scan.sizes[order]))
    bounds = [0]
    while bounds[-1] < n:
        start = bounds[-1]
        base = ends[start - 1] if start else 0
        stop = int(np.searchsorted(ends, base + shard_size, side="right"))
        if max_samples is not None:
            stop = min(stop, start + max_samples)
        bounds.append(max(stop, start + 1))
    return Plan(
        order=order,
        bounds=np.asarray(bounds, dtype=np.int64),
        key_width=max(6, len(str(max(n - 1, 0)))),
        fingerprint=scan.fingerprint(),
    )


def shard_name(split: str, i: int) -> str:
    """The file name of shard ``i`` of ``split``."""
    return f"{split}-{i:06d}.tar"
