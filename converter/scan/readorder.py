"""In which order ``pack`` reads the tree: in disk order through buckets, or straight in plan order.

``disk`` (the gather, see :mod:`.write.shard`) makes a cold tree of small files sequential I/O, at the cost
of writing every byte twice. When the tree is already in the page cache (or on storage where random
reads cost little, ``--read-order plan``), reading each shard's files straight from the tree in plan
order is faster. ``auto`` decides per run from a probe: ``mincore`` on a fixed, evenly spaced sample
of the tree's files, mapped but never read, so the probe neither waits on the disk nor warms the
cache it measures (a read with ``RWF_NOWAIT`` would: the kernel starts read-ahead on a miss). Output
is byte-identical either way.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import sys
from typing import Any

import numpy as np

from ..config import ReadOrder
from .tree import ScanResult

__all__ = ["ReadOrder", "cached_share", "choose_read_order"]  # ReadOrder: the setting, the config's

_PROBE_FILES = 256
_PROBE_BYTES = 1 << 20
_WARM_SHARE = 0.9


def _libc() -> Any:
    """The C library's mmap, mincore and munmap through ctypes; ``None`` where there are none (not Linux)."""
    if sys.platform != "linux":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def _resident(libc: Any, path: str, size: int) -> bool:
    """Whether the first ``size`` bytes of ``path`` are all in the page cache (mapped, never read)."""
    if size == 0:
        return True
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return False
        try:
            pages = -(-size // mmap.PAGESIZE)
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return False
            return all(v & 1 for v in vec)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def cached_share(scan: ScanResult, files: int = _PROBE_FILES) -> float | None:
    """Share of an evenly spaced sample of the tree's files wholly in the page cache.

    ``None`` where the probe cannot tell (not Linux).
    """
    libc = _libc()
    if libc is None or not len(scan):
        return None
    picks = np.unique(np.linspace(0, len(scan) - 1, num=min(files, len(scan))).astype(np.int64))
    cached = 0
    for i in picks.tolist():
        with contextlib.suppress(OSError):  # an unreadable file is reported when it is read
            cached += _resident(
                libc, os.path.join(scan.root, scan.paths[i]), min(int(scan.sizes[i]), _PROBE_BYTES)
            )
    return cached / len(picks)


def choose_read_order(order: ReadOrder, scan: ScanResult) -> ReadOrder:
    """``order`` itself, or for ``auto``: ``plan`` when the tree is in the page cache, else ``disk``."""
    if order is not ReadOrder.AUTO:
        return order
    share = cached_share(scan)
    return ReadOrder.PLAN if share is not None and share >= _WARM_SHARE else ReadOrder.DISK
