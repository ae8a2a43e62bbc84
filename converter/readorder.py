"""In which order ``pack`` reads the tree: in disk order through buckets, or straight in plan order.

``disk`` (the gather, see :mod:`.write`) makes a cold tree of small files sequential I/O, at the cost
of writing every byte twice. When the tree is already in the page cache (or on storage where random
reads cost little, ``--read-order plan``), reading each shard's files straight from the tree in plan
order is faster. ``auto`` decides per run from a probe: a fixed sample of the tree's files is read
with ``RWF_NOWAIT``, which the kernel answers only from the page cache, never from the disk, so the
probe neither waits on the disk nor warms the cache it measures. Output is byte-identical either way.
"""

from __future__ import annotations

import enum
import errno
import os

import numpy as np

from .scan import ScanResult

__all__ = ["ReadOrder", "cached_share", "choose_read_order"]

_PROBE_FILES = 256
_PROBE_BYTES = 1 << 20
_WARM_SHARE = 0.9


class ReadOrder(str, enum.Enum):
    """How ``pack`` reads the tree (``--read-order``)."""

    AUTO = "auto"
    DISK = "disk"
    PLAN = "plan"


def cached_share(scan: ScanResult, files: int = _PROBE_FILES) -> float | None:
    """Share of an evenly spaced sample of the tree's files wholly in the page cache.

    ``None`` where the probe cannot tell (no ``RWF_NOWAIT``: not Linux, or a file system without it).
    """
    nowait = getattr(os, "RWF_NOWAIT", None)
    if nowait is None or not hasattr(os, "preadv") or not len(scan):
        return None
    picks = np.unique(np.linspace(0, len(scan) - 1, num=min(files, len(scan))).astype(np.int64))
    buf = bytearray(_PROBE_BYTES)
    cached = 0
    for i in picks.tolist():
        want = min(int(scan.sizes[i]), _PROBE_BYTES)
        try:
            fd = os.open(os.path.join(scan.root, scan.paths[i]), os.O_RDONLY)
        except OSError:
            continue  # reported when it is read
        try:
            got = os.preadv(fd, [memoryview(buf)[:want]], 0, nowait) if want else 0
            cached += got == want
        except BlockingIOError:
            pass  # not (all) in the page cache
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                return None  # this file system cannot answer
        finally:
            os.close(fd)
    return cached / len(picks)


def choose_read_order(order: ReadOrder, scan: ScanResult) -> ReadOrder:
    """``order`` itself, or for ``auto``: ``plan`` when the tree is in the page cache, else ``disk``."""
    if order is not ReadOrder.AUTO:
        return order
    share = cached_share(scan)
    return ReadOrder.PLAN if share is not None and share >= _WARM_SHARE else ReadOrder.DISK
