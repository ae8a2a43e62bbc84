"""Read the source tree's files: each bounded by the size the scan saw, the kernel reading ahead.

A file is read whole, in one system call when it is as the scan saw it. It is never read past its
scanned size plus a margin: a file that grew since the scan is read up to the bound and rejected
past it (one growing without end, a log, cannot exhaust memory), one too large to hold in memory or
in a tar member is rejected, and a FIFO swapped in for a file reads as empty instead of blocking
(``O_NONBLOCK``). Why a file was not read travels as an ``OSError`` (through the gather's buckets,
see :mod:`.write.shard`); :func:`reason_of` names its reject reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from .reasons import Reason

__all__ = ["read_ahead", "read_bound", "read_file", "reason_of"]

# A gather task reads its files a window at a time; while a window is being bucketed, the kernel is
# already reading the next one (posix_fadvise WILLNEED), many requests at once that the block layer
# merges where files lie side by side: I/O overlaps the work with no reading threads, whose fight for
# the GIL cost more than reading a small file.
_WINDOW_FILES = 1 << 14
_WINDOW_BYTES = 64 << 20
# Reasons to give up on a file that are not the system's errors: negative errno values, so that they
# travel through the buckets like the others.
_GREW, _TOO_LARGE = -2, -3
_REASONS = {_GREW: Reason.GREW, _TOO_LARGE: Reason.TOO_LARGE}
_MAX_MEMBER = 8**11 - 1  # ustar's size field: 11 octal digits


def reason_of(error: OSError) -> Reason:
    """The reject reason of a file that :func:`read_file` could not read."""
    return _REASONS.get(error.errno or 0, Reason.UNREADABLE)


def read_bound(size: int) -> int:
    """The most bytes read from a file the scan saw at ``size``: a margin for one rewritten since."""
    return min(size + size // 4 + (1 << 20), _MAX_MEMBER)


def read_file(path: str, size: int) -> bytes | OSError:
    """Read a whole file whose size the scan saw; the bytes, or why not (see the module docstring)."""
    if size > _MAX_MEMBER:
        return OSError(_TOO_LARGE, f"{size:,} bytes: over a tar member's limit of {_MAX_MEMBER:,}")
    bound = read_bound(size)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            chunks = [os.read(fd, size + 1)]
            total = len(chunks[0])
            # Shrunk, grew, or cut short (a read returns at most 2 GiB): read on, up to the bound.
            while total != size and chunks[-1] and total <= bound:
                chunks.append(os.read(fd, min(bound + 1 - total, 64 << 20)))
                total += len(chunks[-1])
        finally:
            os.close(fd)
    except OSError as e:
        return e
    except MemoryError:
        return OSError(_TOO_LARGE, f"{size:,} bytes: too large to read into memory")
    if total > bound:
        return OSError(_GREW, f"grew past {bound:,} bytes while being packed ({size:,} at the scan)")
    return b"".join(chunks) if len(chunks) > 1 else chunks[0]


def _windows(sizes: list[int]) -> Iterator[range]:
    """Consecutive ranges of at most ``_WINDOW_FILES`` files and about ``_WINDOW_BYTES`` bytes."""
    start = total = 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= _WINDOW_FILES or total + size > _WINDOW_BYTES):
            yield range(start, i)
            start, total = i, 0
        total += size
    if start < len(sizes):
        yield range(start, len(sizes))


def _prefetch(paths: list[str], indices: Iterable[int]) -> None:
    """Ask the kernel to start reading these files into the page cache; returns at once."""
    if not hasattr(os, "posix_fadvise"):
        return
    for i in indices:
        try:
            fd = os.open(paths[i], os.O_RDONLY)
        except OSError:
            continue  # reported when it is read
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)


def read_ahead(paths: list[str], sizes: list[int]) -> Iterator[bytes | OSError]:
    """Yield each file's bytes in order, the kernel reading one window ahead."""
    windows = list(_windows(sizes))
    if windows:
        _prefetch(paths, windows[0])
    for k, window in enumerate(windows):
        if k + 1 < len(windows):
            _prefetch(paths, windows[k + 1])
        for i in window:
            yield read_file(paths[i], sizes[i])
