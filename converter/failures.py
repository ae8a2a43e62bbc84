"""What ``pack`` says when it cannot finish for a reason outside the tree: a full disk, a dead worker.

Both leave the destination resumable (shards are renamed whole, records written after them, the
index last), so the message says so, in one line, instead of a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from .errors import PackError

__all__ = ["explained"]

_MB = 10**6


@contextlib.contextmanager
def explained(dst: Path, splits: Sequence[str], planned: list[int]) -> Iterator[None]:
    """Turn ENOSPC and a dead worker process into a one-line :class:`PackError`.

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
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        raise PackError(_no_space(dst, splits, planned, e)) from e


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
