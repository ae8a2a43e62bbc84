"""What ``pack`` says when it cannot finish for a reason outside the tree: a full disk, a dead worker.

Also a destination it may not write (read-only file system, permissions) and memory running out.
All leave the destination resumable (shards are renamed whole, records written after them, the
index last), so the message says so, in one line, instead of a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from ..format.errors import PackError

__all__ = ["explained"]

_MB = 10**6


@contextlib.contextmanager
def explained(dst: Path, splits: Sequence[str], planned: list[int]) -> Iterator[None]:
    """Turn ENOSPC, EROFS, EACCES, a dead worker and MemoryError into a one-line :class:`PackError`.

    ``planned`` holds the estimated bytes of the shards of each split planned so far (empty before).
    """
    split = ", ".join(map(repr, splits))
    try:
        yield
    except BrokenProcessPool as e:
        raise PackError(
            f"a worker process of `imgshards pack` died (killed, or out of memory) while packing split "
            f"{split} into {dst}; run the same command again: it resumes from the shards already written"
        ) from e
    except MemoryError as e:
        raise PackError(
            f"out of memory while packing split {split} into {dst}; run the same command again with "
            "fewer --workers: it resumes from the shards already written"
        ) from e
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise PackError(_no_space(dst, splits, planned, e)) from e
        if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):  # the tree's read errors are rejects
            where = f" ({e.filename})" if e.filename else ""
            raise PackError(
                f"cannot write to the destination {dst}{where}: {e.strerror}; make it writable, or "
                "choose another destination"
            ) from e
        raise


def _no_space(dst: Path, splits: Sequence[str], planned: list[int], e: OSError) -> str:
    written = sum(p.stat().st_size for split in splits for p in dst.glob(f"{split}-*.tar"))
    split = ", ".join(map(repr, splits))
    needed = max(sum(planned) - written, 0) + 16 * _MB  # the shards to come, and a margin for state
    try:
        free = f"{shutil.disk_usage(dst).free / _MB:,.0f} MB free now"
    except OSError:
        free = "free space unknown"
    where = f" ({e.filename})" if e.filename else ""
    return (
        f"no space left on the device of {dst}{where}: split {split} needs about {needed / _MB:,.0f} MB "
        f"more ({free}); free some space, then run the same command again: it resumes from the shards "
        "already written"
    )
