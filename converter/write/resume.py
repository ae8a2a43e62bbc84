"""Resume checks content: a file already packed whose bytes changed since is found, and its shard redone.

The tree's fingerprint (:meth:`~.scan.tree.ScanResult.fingerprint`) covers paths, labels and sizes; a file
rewritten in place at the same size passes it. So each shard's record also keeps a digest of the
bytes of its files as they were gathered (:func:`content_digest`, BLAKE2b of each file in plan
order), and a resumed run reads the files of every finished shard again (:func:`changed_shards`, in
the pack's worker processes, in inode order) and redoes the shards whose digest differs. A record
without a digest (written by an older imgshards) counts as changed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..scan.sourcefiles import read_file

if TYPE_CHECKING:
    from ..plan.shards import Plan
    from ..scan.tree import PathTable, ScanResult

__all__ = [
    "ContentTask",
    "changed_shards",
    "combined_digest",
    "content_digest",
    "file_digest",
    "reread_digest",
]

_DIGEST_SIZE = 16


class _Recorded(Protocol):  # a ShardRecord (imported by .write, which imports this module)
    @property
    def content(self) -> str: ...


def file_digest(data: bytes | OSError) -> bytes:
    """Digest of one file's bytes, or of the error it could not be read with."""
    if isinstance(data, OSError):
        data = f"unreadable {data.errno}".encode()
    return hashlib.blake2b(data, digest_size=_DIGEST_SIZE).digest()


def content_digest(files: Iterable[bytes | OSError]) -> str:
    """Digest of a shard's files, in plan order, as kept in its record."""
    return combined_digest(file_digest(data) for data in files)


def combined_digest(digests: Iterable[bytes]) -> str:
    """The record's digest from the :func:`file_digest` of each of a shard's files, in plan order."""
    h = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    for d in digests:
        h.update(d)
    return h.hexdigest()


@dataclass(frozen=True)
class ContentTask:
    """The files of one finished shard, in plan order, to read again."""

    index: int
    src: str
    paths: PathTable
    inodes: np.ndarray
    sizes: np.ndarray


def reread_digest(task: ContentTask) -> tuple[int, str]:
    """:func:`content_digest` of the task's files as they are now (read in inode order)."""
    digests = [b""] * len(task.paths)
    for i in np.argsort(task.inodes, kind="stable").tolist():  # read as the writer reads, bounded
        digests[i] = file_digest(read_file(os.path.join(task.src, task.paths[i]), int(task.sizes[i])))
    return task.index, combined_digest(digests)


def changed_shards(
    pool: Executor, scan: ScanResult, plan: Plan, records: Mapping[int, _Recorded]
) -> list[int]:
    """The finished shards (``records``) whose files no longer hold the bytes they were packed from."""
    tasks = [
        ContentTask(
            i,
            str(scan.root),
            scan.paths.take(plan.shard(i)),
            scan.inodes[plan.shard(i)],
            scan.sizes[plan.shard(i)],
        )
        for i, record in sorted(records.items())
        if record.content
    ]
    now = dict(pool.map(reread_digest, tasks))
    return [i for i, record in sorted(records.items()) if now.get(i) != record.content]
