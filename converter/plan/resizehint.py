"""What ``--resize`` would save on a split of large photos: one line, measured on a few of its images.

A phone's 12 MP photo costs the loader tens of milliseconds an image, though a training view of it
ends as 224x224 pixels; stored at ``--resize 512`` it costs a millisecond or two. ``pack`` does not
guess that ratio: when a split packed without ``--resize`` has a median image whose shorter side is
at least :data:`MUCH_LARGER` times :data:`SUGGESTED_RESIZE`, it takes :data:`SAMPLED` of its images,
spread over the split, makes of each what ``--resize 512`` would store (``store``: the writer's own
re-encode, :func:`~.write.shard.stored_image`, handed in by :mod:`.pack`), and times what the
loader's ``train`` preset at 224 does to both.

The model of the loader, with Pillow alone (the converter imports no torch and no loader): a view
is drawn as ``RandomResizedCrop(224)`` draws it; a JPEG whose shorter side is at least twice 224 is
decoded at the largest DCT scale (1/2, 1/4, 1/8) that leaves the view at least 224 pixels in both
axes (1/2 only from :data:`HALF_FROM_PIXELS` pixels), and the view resized from that with Pillow's
bilinear resize, exactly as the loader's scaled path does (``imgshards.loader.image.scaled``); any
other image is decoded whole by Pillow, whose decode
alone costs about what the loader's libjpeg-turbo decode and tensor resize of the view cost
together (1.1 ms against 1.0 + 0.3 ms on a 512x683 JPEG here). Each image is timed on this
thread's CPU clock, one thread, with the same views for both forms of it, and keeps the least of
:data:`REPEATS` runs (a busy machine only adds time); the estimate is the ratio of the sums, so an
epoch's worth. On the camera profile of ``make_imagefolder.py`` it is within 15% of the ratio a
``ShardDataset`` measures (``tests/converter/plan/test_resizehint.py`` checks 30% on its own photos).
"""

from __future__ import annotations

import io
import math
import os
import random
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from PIL import Image

from ..config import Check
from ..format.imageformats import JPEG
from ..format.imagesizes import SizeStats, size_key
from ..scan.check import Inspection
from ..scan.sourcefiles import read_file
from ..scan.tree import Reject, ScanResult

# The loader decodes at 1/2 only images of this many pixels or more (loader/image/scaled.py, where
# it is measured); the converter does not import the loader, so the figure is repeated here and
# tests/converter/plan/test_resizehint.py holds the two equal.
HALF_FROM_PIXELS = 1 << 20

__all__ = [
    "MUCH_LARGER",
    "REPEATS",
    "SAMPLED",
    "SUGGESTED_RESIZE",
    "TRAIN_SIZE",
    "ResizeHint",
    "StoredImage",
    "resize_hint",
]

SUGGESTED_RESIZE = 512  # the --resize the line suggests: room for RandomResizedCrop(224) and eval's 256
TRAIN_SIZE = 224  # the train preset's output, the view the estimate times
MUCH_LARGER = 2  # a hint only where the median shorter side is at least this times SUGGESTED_RESIZE
SAMPLED = 16
REPEATS = 1
T = TypeVar("T")
R = TypeVar("R")

# What a shard stores for a source file (rel, data, check=, max_pixels=, resize=, quality=,
# image_format=): the bytes, their verdict and conversions, or why it is rejected. The writer's
# (write/ is a later stage than plan/, so pack hands it in).
StoredImage = Callable[..., Reject | tuple[bytes, Inspection, tuple[str, ...]]]


@dataclass(frozen=True)
class ResizeHint:
    """What ``--resize`` would save on a split, measured.

    Attributes:
        resize: The ``--resize`` suggested.
        speedup: The loader's time an image as packed over its time at ``--resize``.
        sampled: How many of the split's images were timed.
        median: The split's median image size (``(width, height)``).

    """

    resize: int
    speedup: float
    sampled: int
    median: tuple[int, int]

    def line(self) -> str:
        """The line ``pack`` prints: the median size, and what ``--resize`` would store and save."""
        megapixels = self.median[0] * self.median[1] / 1e6
        return (
            f"median {size_key(*self.median)} (~{megapixels:.0f} MP) for {TRAIN_SIZE} px training views: "
            f"--resize {self.resize} would store <= {self.resize} px and load ~{self.speedup:.0f}x faster "
            f"(timed on {self.sampled} of these images)"
        )

    def to_json(self) -> dict[str, Any]:
        """What ``pack --json`` shows of it."""
        return {"resize": self.resize, "speedup": round(self.speedup, 2), "sampled": self.sampled}


def resize_hint(
    scan: ScanResult,
    stats: SizeStats | None,
    *,
    store: StoredImage,
    resize: int | None,
    image_format: str | None,
    max_pixels: int | None = None,
    executor: Executor | None = None,
) -> ResizeHint | None:
    """Measure what ``--resize`` would save on the split ``scan``; ``None`` where it would not say much.

    ``None``: the split was packed with ``resize``, its sizes are unknown, or its median image is
    not :data:`MUCH_LARGER` times the suggested size (nor is it measured then: it costs nothing).
    ``image_format`` is the split's one format (``None``: each image's own), as the shards store it.
    ``store`` makes what a shard stores of an image, as the writer does. ``executor`` makes the sampled
    images' two forms (default: this thread); they are timed here.
    """
    if resize is not None or stats is None or stats.median_shorter < MUCH_LARGER * SUGGESTED_RESIZE:
        return None
    picked = _spread(len(scan), SAMPLED)
    files = [(str(scan.root), scan.paths[at], int(scan.sizes[at]), image_format, max_pixels) for at in picked]
    # Re-encoding a 12 MP photo costs more than timing it: on the pack's workers, in parallel.
    pairs = [pair for pair in (executor or _Serial()).map(partial(_forms, store), files) if pair is not None]
    if not pairs:
        return None
    as_packed = resized = 0.0
    for i, (packed, small) in enumerate(pairs):
        as_packed += min(_load_time(packed, random.Random(i)) for _ in range(REPEATS))
        resized += min(_load_time(small, random.Random(i)) for _ in range(REPEATS))
    return ResizeHint(SUGGESTED_RESIZE, as_packed / resized if resized else 1.0, len(pairs), stats.median)


def _forms(
    store: StoredImage, file: tuple[str, str, int, str | None, int | None]
) -> tuple[bytes, bytes] | None:
    """What a shard stores for a file, as packed and at the suggested ``--resize``; ``None``: rejected."""
    root, rel, size, image_format, max_pixels = file
    data = read_file(os.path.join(root, rel), size)
    if isinstance(data, OSError):
        return None
    forms = [
        store(
            rel,
            data,
            check=Check.HEADER,
            max_pixels=max_pixels,
            resize=resize,
            quality=90,  # --quality's default
            image_format=image_format,
        )
        for resize in (None, SUGGESTED_RESIZE)
    ]
    if not isinstance(forms[0], tuple) or not isinstance(forms[1], tuple):
        return None  # the shards do not hold it either
    return forms[0][0], forms[1][0]


class _Serial:
    """``map`` in this thread: the executor of a call that gives none."""

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        return map(fn, items)


def _spread(n: int, count: int) -> list[int]:
    """``count`` positions evenly over ``0..n-1`` (all of them when fewer): every class, in scan order."""
    return sorted({i * n // count for i in range(count)}) if n > count else list(range(n))


def _train_view(width: int, height: int, rng: random.Random) -> tuple[float, float, int, int]:
    """``(top, left, height, width)`` of a view as ``RandomResizedCrop(scale=(0.08, 1))`` draws one."""
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    return 0, 0, height, width


def _load_time(data: bytes, rng: random.Random) -> float:
    """CPU seconds of this thread for the loader's ``train`` view of ``data`` (see the module docstring)."""
    started = time.thread_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Image.open(io.BytesIO(data)) as im:
            width, height = im.size
            top, left, h, w = _train_view(width, height, rng)
            scale = next(
                (s for s in (8, 4, 2) if h >= TRAIN_SIZE * s and w >= TRAIN_SIZE * s),
                1,
            )
            if scale == 2 and width * height < HALF_FROM_PIXELS:
                scale = 1  # the loader decodes a small image whole rather than at 1/2
            if im.format != JPEG.pillow or min(width, height) < 2 * TRAIN_SIZE or scale == 1:
                im.load()  # whole: the loader's decode, then its tensor resize of the view
            else:
                im.draft("RGB", (width // scale, height // scale))
                image = im.convert("RGB") if im.mode != "RGB" else im
                image.load()
                f = image.width / width
                box = (left * f, top * f, (left + w) * f, (top + h) * f)
                image.resize((TRAIN_SIZE, TRAIN_SIZE), Image.Resampling.BILINEAR, box=box)
    return time.thread_time() - started
