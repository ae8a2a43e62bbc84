"""The sizes of a split's images, as stored: how many were seen, the median and the 95th percentile.

``pack`` reads every image's size from its header anyway (:mod:`..scan.check`); each shard's record counts
the sizes it stored (``"4032x3024": 812``: photo folders hold a few sizes, ImageNet's shards a few
hundred), and the split's records fold into one :class:`SizeStats`, kept in the index's split info
(``"image_sizes"``) so that ``imgshards info`` shows it too. The percentiles rank images by pixel
count and name the size of the image at that rank: ``4032x3024`` is a size some image has, where
per-axis medians of a folder of portrait and landscape photos would make up ``3024x3024``.

Standard library only: the index (:mod:`.manifest`) holds it, and the loader reads the index.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SizeStats", "size_key", "size_stats"]


def size_key(width: int, height: int) -> str:
    """The key a shard record counts an image under: ``"4032x3024"``."""
    return f"{width}x{height}"


def _parse_key(key: str) -> tuple[int, int]:
    width, _, height = key.partition("x")
    return int(width), int(height)


@dataclass(frozen=True)
class SizeStats:
    """A split's image sizes: ``images`` with a known size, the median and the 95th percentile.

    Attributes:
        images: Images whose size was read (all of them, unless ``--check none`` read no header).
        median: ``(width, height)`` of the image at the middle rank by pixel count.
        p95: ``(width, height)`` of the image at the 95th percentile rank by pixel count.

    """

    images: int
    median: tuple[int, int]
    p95: tuple[int, int]

    @property
    def median_shorter(self) -> int:
        """The shorter side of the median image, in pixels."""
        return min(self.median)

    @property
    def median_megapixels(self) -> float:
        """The median image's pixels, in millions."""
        return self.median[0] * self.median[1] / 1e6

    def describe(self) -> str:
        """``median 4032x3024, 95th percentile 4032x3024 (60 images)``."""
        return (
            f"median {size_key(*self.median)}, 95th percentile {size_key(*self.p95)} "
            f"({self.images:,} image{'s' if self.images != 1 else ''})"
        )

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form written into the index."""
        return {"images": self.images, "median": list(self.median), "p95": list(self.p95)}

    @classmethod
    def from_json(cls, data: Any) -> SizeStats | None:
        """Build from a split's ``image_sizes`` (checked by :mod:`.validate`); ``None`` if absent."""
        if data is None:
            return None
        median, p95 = data["median"], data["p95"]
        return cls(int(data["images"]), (int(median[0]), int(median[1])), (int(p95[0]), int(p95[1])))


def size_stats(counts: Iterable[Mapping[str, int]]) -> SizeStats | None:
    """Fold shard records' size counts into the split's :class:`SizeStats`; ``None`` when none is known."""
    total: Counter[tuple[int, int]] = Counter()
    for shard in counts:
        for key, n in shard.items():
            total[_parse_key(key)] += n
    images = sum(total.values())
    if not images:
        return None
    ranked = sorted(total.items(), key=lambda item: (item[0][0] * item[0][1], item[0]))

    def at(rank: int) -> tuple[int, int]:
        seen = 0
        for size, n in ranked:
            seen += n
            if seen > rank:
                return size
        return ranked[-1][0]

    # The nearest-rank percentiles: the lower median, and the image 95% of them are no larger than.
    return SizeStats(images, at((images - 1) // 2), at(math.ceil(0.95 * images) - 1))
