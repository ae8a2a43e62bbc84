"""What the bench asks of the operating system: process memory, and dropping files from the page cache.

Memory comes from Linux's ``/proc``: ``VmHWM`` (a process's peak resident set) and ``Pss`` from
``smaps_rollup`` (its resident pages, each shared page divided among the processes that map it).
DataLoader workers are forked from the main process, so they share its libraries and its copy of the
dataset object: the sum of their peaks counts those shared pages once per process and overstates what
the machine spends; the sum of their PSS does not. Elsewhere the main process's peak comes from
``resource.getrusage`` and the rest is unknown (``None``).

Eviction uses ``posix_fadvise(POSIX_FADV_DONTNEED)``, which needs no root: the kernel drops the
file's clean cached pages. Dirty pages (a file written moments ago) would stay, so each file is
``fdatasync``-ed first.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from collections.abc import Iterable
from pathlib import Path

from ..errors import ConfigError

__all__ = ["can_evict", "evict", "files_under", "pss", "reset_peak_rss", "vm_hwm"]


def reset_peak_rss() -> None:
    """Restart this process's peak-RSS count (``VmHWM``) from its current size, where Linux allows it."""
    # Not Linux, or not allowed: the peak then counts from the process's start.
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def vm_hwm(pid: int | None = None) -> int | None:
    """Peak resident bytes of process ``pid`` (default: this one), or ``None`` where unknown."""
    value = _proc_kb(f"/proc/{pid or 'self'}/status", "VmHWM:")
    if value is None and pid is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    return value


def pss(pid: int | None = None) -> int | None:
    """Proportional resident bytes of process ``pid`` (default: this one) now, or ``None`` where unknown."""
    return _proc_kb(f"/proc/{pid or 'self'}/smaps_rollup", "Pss:")


def _proc_kb(path: str, field: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def can_evict() -> bool:
    """Whether this platform can drop a file from the page cache (``os.posix_fadvise``)."""
    return hasattr(os, "posix_fadvise")


def evict(paths: Iterable[str | os.PathLike[str]]) -> tuple[int, int]:
    """Drop the files at ``paths`` from the page cache; return ``(files, bytes)`` advised.

    Raises:
        ConfigError: the platform has no ``posix_fadvise`` (Linux has).

    """
    if not can_evict():
        raise ConfigError("dropping files from the page cache needs os.posix_fadvise (Linux)")
    files = size = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # vanished or unreadable: nothing of it to evict
        try:
            # Dirty pages are not dropped: write them first. Some file systems refuse a sync on a
            # read-only descriptor; the clean pages still go.
            with contextlib.suppress(OSError):
                os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            files += 1
            size += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return files, size


def files_under(root: str | os.PathLike[str]) -> list[str]:
    """Every regular file under ``root``, following symlinked directories as ImageFolder does."""
    out: list[str] = []
    for dirpath, _, names in os.walk(root, followlinks=True):
        out.extend(os.path.join(dirpath, name) for name in names)
    return out
