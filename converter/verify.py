"""``verify``: re-hash and recount every shard of a packed dataset against its index."""

from __future__ import annotations

import hashlib
import os
import tarfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .manifest import Manifest, ShardInfo, read_manifest
from .pool import default_workers, start_pool

__all__ = ["ShardProblem", "VerifyReport", "hash_file", "verify"]

_CHUNK = 1 << 20


def hash_file(path: str) -> str:
    """SHA-256 hex digest of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class ShardProblem:
    """One mismatch between a shard and its index entry."""

    split: str
    shard: str
    problem: str

    def __str__(self) -> str:
        return f"{self.split}/{self.shard}: {self.problem}"


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of :func:`verify`."""

    shards: int
    samples: int
    problems: tuple[ShardProblem, ...]

    @property
    def ok(self) -> bool:
        """True when every shard matches the index."""
        return not self.problems


class _HashingReader:
    """A read-only stream that hashes what passes through it (tarfile reads shards sequentially)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self.sha = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self.sha.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass


def _check_shard(
    path: str, expected: ShardInfo, split: str, num_classes: int
) -> tuple[list[str], Counter[int]]:
    """Problems found in one shard, and the labels it holds."""
    labels: Counter[int] = Counter()
    keys: set[str] = set()
    problems: list[str] = []
    try:
        with open(path, "rb") as f:
            reader = _HashingReader(f)
            try:
                with tarfile.open(fileobj=reader, mode="r|") as tar:  # type: ignore[call-overload]
                    for member in tar:
                        key, _, ext = member.name.partition(".")
                        keys.add(key)
                        if ext == "cls":
                            data = tar.extractfile(member)
                            label = int(data.read()) if data else -1
                            if not 0 <= label < num_classes:
                                problems.append(
                                    f"sample {key} has label {label}, outside 0..{num_classes - 1}"
                                )
                            labels[label] += 1
            except (tarfile.TarError, ValueError) as e:
                problems.append(f"unreadable tar ({e})")
            reader.drain()
    except FileNotFoundError:
        return [f"missing (expected {expected.bytes} bytes)"], labels
    if reader.size != expected.bytes:
        problems.append(f"{reader.size} bytes, index says {expected.bytes}")
    if reader.sha.hexdigest() != expected.sha256:
        problems.append("SHA-256 differs from the index: the file changed or is damaged")
    if len(keys) != expected.samples or sum(labels.values()) != expected.samples:
        problems.append(f"{len(keys)} samples, index says {expected.samples}")
    return problems, labels


def verify(
    root: str | os.PathLike[str], *, splits: list[str] | None = None, workers: int | None = None
) -> VerifyReport:
    """Check every shard of ``root`` against ``index.json``: presence, size, SHA-256, samples, labels.

    Raises:
        ManifestError: the index is missing or unreadable (that is not a shard problem).

    """
    root = Path(root)
    manifest: Manifest = read_manifest(root)
    names = splits or sorted(manifest.splits)
    jobs = [(name, shard) for name in names for shard in manifest.split(name).shards]
    problems: list[ShardProblem] = []
    pool = start_pool(min(workers or default_workers(), max(1, len(jobs))))
    try:
        futures = [
            pool.submit(_check_shard, str(root / shard.name), shard, split, len(manifest.classes))
            for split, shard in jobs
        ]
        per_split: dict[str, Counter[int]] = {name: Counter() for name in names}
        for (split, shard), future in zip(jobs, futures, strict=True):
            found, labels = future.result()
            problems.extend(ShardProblem(split, shard.name, p) for p in found)
            per_split[split].update(labels)
    finally:
        pool.shutdown()
    for name in names:
        counts = tuple(per_split[name].get(i, 0) for i in range(len(manifest.classes)))
        if counts != manifest.split(name).class_counts and not any(p.split == name for p in problems):
            problems.append(ShardProblem(name, "*", "per-class counts differ from the index"))
    samples = sum(manifest.split(n).samples for n in names)
    return VerifyReport(shards=len(jobs), samples=samples, problems=tuple(problems))
