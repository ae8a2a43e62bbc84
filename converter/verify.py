"""``verify``: re-hash and recount every shard of a packed dataset against its index."""

from __future__ import annotations

import hashlib
import os
import tarfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .manifest import LabelSource, Manifest, ShardInfo, read_manifest, split_member_name
from .pool import default_workers, start_pool
from .validate import open_regular

__all__ = [
    "HashingReader",
    "ShardProblem",
    "VerifyReport",
    "build_report",
    "check_shard_stream",
    "hash_file",
    "shard_jobs",
    "verify",
]

_CHUNK = 1 << 20
_LABEL_BYTES = 1 << 16


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


class HashingReader:
    """A read-only stream that hashes what passes through it (tarfile reads shards sequentially)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self.sha = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        """Read and hash up to ``n`` bytes."""
        data = self._f.read(n)
        self.sha.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        """Read (and hash) the rest of the stream."""
        while self.read(_CHUNK):
            pass


def check_shard_stream(
    opener: Callable[[], AbstractContextManager[BinaryIO]],
    expected: ShardInfo,
    num_classes: int,
    labels_from: LabelSource | None = None,
    class_to_idx: Mapping[str, int] | None = None,
) -> tuple[list[str], Counter[int]]:
    """Problems found in one shard read once from ``opener()``, and the labels it holds.

    ``opener`` opens the shard for reading (a local file, an fsspec file); a shard it cannot find
    (``FileNotFoundError``) is reported missing. ``labels_from`` says which member holds a sample's
    label (its split's; default ``.cls``), ``class_to_idx`` maps a class name to its id (for labels
    that are names).
    """
    labels_from = labels_from or LabelSource()
    labels: Counter[int] = Counter()
    keys: set[str] = set()
    problems: list[str] = []
    try:
        with opener() as f:
            reader = HashingReader(f)
            end = _real_size(f, expected)
            try:
                with tarfile.open(fileobj=reader, mode="r|") as tar:  # type: ignore[call-overload]
                    for member in tar:
                        if member.offset_data + member.size > end:  # else tarfile reads on for ever
                            problems.append(
                                f"member {member.name!r} declares {member.size} bytes, past the end"
                            )
                            break
                        parts = split_member_name(member.name) if member.isreg() else None
                        if parts is None:  # not part of a sample, as for the loader's reader
                            continue
                        key, ext = parts
                        keys.add(key)
                        if ext == labels_from.member:
                            data = tar.extractfile(member)
                            raw = data.read(_LABEL_BYTES) if data else b""
                            label, problem = _label(raw, labels_from, class_to_idx, num_classes)
                            if problem:
                                problems.append(f"sample {key} {problem}")
                            labels[label] += 1
            except (tarfile.TarError, ValueError) as e:
                problems.append(f"unreadable tar ({e})")
            reader.drain()
    except FileNotFoundError:
        return [f"missing (expected {expected.bytes} bytes)"], labels
    except OSError as e:  # not a regular file, a symlink out of the dataset, unreadable
        return [f"unreadable ({e.strerror or e})"], labels
    if reader.size != expected.bytes:
        problems.append(f"{reader.size} bytes, index says {expected.bytes}")
    if reader.sha.hexdigest() != expected.sha256:
        problems.append("SHA-256 differs from the index: the file changed or is damaged")
    if len(keys) != expected.samples or sum(labels.values()) != expected.samples:
        problems.append(f"{len(keys)} samples, index says {expected.samples}")
    return problems, labels


def _real_size(f: BinaryIO, expected: ShardInfo) -> int:
    """The shard's size as its file system says (the index's if it cannot say): where members must end."""
    try:
        return os.fstat(f.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        size = getattr(f, "size", None)  # fsspec's files
        return size if isinstance(size, int) else expected.bytes


def _label(
    data: bytes, labels_from: LabelSource, class_to_idx: Mapping[str, int] | None, num_classes: int
) -> tuple[int, str | None]:
    """A sample's label, and what is wrong with it (then the label is -1), if anything."""
    try:
        label = labels_from.parse(data, class_to_idx or {})
    except ValueError as e:
        return -1, f"has {e}"
    if not 0 <= label < num_classes:
        return -1, f"has label {label}, outside 0..{num_classes - 1}"
    return label, None


def shard_jobs(manifest: Manifest, splits: list[str] | None) -> list[tuple[str, ShardInfo]]:
    """(split, shard) for every shard of ``splits`` (default all), splits in name order."""
    names = splits or sorted(manifest.splits)
    return [(name, shard) for name in names for shard in manifest.split(name).shards]


def build_report(
    manifest: Manifest,
    jobs: list[tuple[str, ShardInfo]],
    results: Iterable[tuple[list[str], Counter[int]]],
) -> VerifyReport:
    """The report over ``jobs`` (split, shard) from their :func:`check_shard_stream` results, in order.

    Adds a split-wide problem when the labels found add up to other per-class counts than the index's
    (only where no shard of the split already has a problem, which would explain it).
    """
    names = sorted({split for split, _ in jobs})
    problems: list[ShardProblem] = []
    per_split: dict[str, Counter[int]] = {name: Counter() for name in names}
    for (split, shard), (found, labels) in zip(jobs, results, strict=True):
        problems.extend(ShardProblem(split, shard.name, p) for p in found)
        per_split[split].update(labels)
    for name in names:
        counts = tuple(per_split[name].get(i, 0) for i in range(len(manifest.classes)))
        if counts != manifest.split(name).class_counts and not any(p.split == name for p in problems):
            problems.append(ShardProblem(name, "*", "per-class counts differ from the index"))
    samples = sum(manifest.split(n).samples for n in names)
    return VerifyReport(shards=len(jobs), samples=samples, problems=tuple(problems))


def _check_local_shard(
    root: Path, expected: ShardInfo, num_classes: int, labels_from: LabelSource, class_to_idx: dict[str, int]
) -> tuple[list[str], Counter[int]]:
    def opener() -> BinaryIO:
        return open_regular(root / expected.name, inside=root)

    return check_shard_stream(opener, expected, num_classes, labels_from, class_to_idx)


def verify(
    root: str | os.PathLike[str], *, splits: list[str] | None = None, workers: int | None = None
) -> VerifyReport:
    """Check every shard of ``root`` against ``index.json``: presence, size, SHA-256, samples, labels.

    Raises:
        ManifestError: the index is missing or unreadable (that is not a shard problem).

    """
    root = Path(root)
    manifest: Manifest = read_manifest(root)
    jobs = shard_jobs(manifest, splits)
    pool = start_pool(min(workers or default_workers(), max(1, len(jobs))))
    try:
        classes, to_idx = len(manifest.classes), manifest.class_to_idx
        futures = [
            pool.submit(_check_local_shard, root, shard, classes, manifest.split(split).labels, to_idx)
            for split, shard in jobs
        ]
        return build_report(manifest, jobs, (future.result() for future in futures))
    finally:
        pool.shutdown()
