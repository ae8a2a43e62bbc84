"""``verify``: re-hash and recount every shard of a packed dataset against its index.

Shards are read by the one tar reader ``index`` and the loader read through, and each sample is
judged as they judge it (:func:`~.format.tarsamples.checked_samples`): the count is of samples as the loader
reads them (members grouped by adjacent keys), and a key met again after other samples is a problem.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO

from ..engines.pool import start_pool, worker_count
from ..format.errors import ShardEndError, ShardFormatError
from ..format.locate import redact_url
from ..format.manifest import LabelSource, Manifest, ShardInfo, read_manifest
from ..format.tarsamples import checked_samples, shown
from ..format.tarstream import TarStream, stream_end
from ..format.validate import open_regular

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
_PROBLEMS_PER_SHARD = 5
_BATCHES_PER_WORKER = 8
_BATCH_BYTES = 64 << 20


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
    """A read-only stream that hashes what passes through it (the tar reader reads it sequentially)."""

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
    problems: list[str] = []
    samples = bad = 0
    try:
        with opener() as f:
            reader = HashingReader(f)
            end = stream_end(f)
            tar = TarStream(reader, end=expected.bytes if end is None else end, seekable=False)  # type: ignore[arg-type]
            try:
                for sample, value, problem in checked_samples(tar, labels_from.member, labels_from.key):
                    samples += 1
                    label = -1
                    if value is not None:
                        label, problem = _label(value, labels_from, class_to_idx, num_classes)
                    if problem is not None:
                        bad += 1
                        if bad <= _PROBLEMS_PER_SHARD:
                            problems.append(f"sample {shown(sample.key)} {problem}")
                    labels[label] += 1
            except ShardEndError as e:  # a size past the end: checked before anything is read or skipped
                problems.append(f"member {e.member!r} declares {e.declared} bytes, past the end")
            except ShardFormatError as e:
                problems.append(f"unreadable tar ({e})")
            reader.drain()
    except FileNotFoundError:
        return [_missing(expected)], labels
    except OSError as e:  # not a regular file, a symlink out of the dataset, unreadable
        return [f"unreadable ({redact_url(str(e.strerror or e))})"], labels
    if bad > _PROBLEMS_PER_SHARD:
        problems.append(f"{bad - _PROBLEMS_PER_SHARD} more sample(s) with problems")
    if reader.size != expected.bytes:
        problems.append(f"{reader.size} bytes, index says {expected.bytes}")
    if reader.sha.hexdigest() != expected.sha256:
        problems.append("SHA-256 differs from the index: the file changed or is damaged")
    if samples != expected.samples:
        problems.append(f"{samples} samples, index says {expected.samples}")
    return problems, labels


def _label(
    value: int | str, labels_from: LabelSource, class_to_idx: Mapping[str, int] | None, num_classes: int
) -> tuple[int, str | None]:
    """A sample's class id, and what is wrong with it (then the id is -1), if anything."""
    try:
        label = labels_from.class_id(value, class_to_idx or {})
    except ValueError as e:
        return -1, f"has {e}"
    if not 0 <= label < num_classes:
        return -1, f"has label {label}, outside 0..{num_classes - 1}"
    return label, None


def shard_jobs(manifest: Manifest, splits: list[str] | None) -> list[tuple[str, ShardInfo]]:
    """(split, shard) for every shard of ``splits`` (default all), splits in name order.

    A split named twice is verified once (as ``info`` shows it once): counted twice, its per-class
    counts would differ from the index's.
    """
    names = sorted(set(splits or manifest.splits))
    return [(name, shard) for name in names for shard in manifest.split(name).shards]


def build_report(
    manifest: Manifest,
    jobs: list[tuple[str, ShardInfo]],
    results: Iterable[tuple[list[str], Mapping[int, int]]],
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


def _missing(expected: ShardInfo) -> str:
    return f"missing (expected {expected.bytes} bytes)"


def _check_local_shards(
    root: Path, num_classes: int, class_to_idx: dict[str, int], batch: list[tuple[ShardInfo, LabelSource]]
) -> list[tuple[list[str], dict[int, int]]]:
    """:func:`check_shard_stream` on each shard of ``batch``; the labels as a dict, quick to send back."""

    def check(expected: ShardInfo, labels_from: LabelSource) -> tuple[list[str], dict[int, int]]:
        def opener() -> BinaryIO:
            return open_regular(root / expected.name, inside=root)

        problems, labels = check_shard_stream(opener, expected, num_classes, labels_from, class_to_idx)
        return problems, dict(labels)

    return [check(expected, labels_from) for expected, labels_from in batch]


def _batches(
    work: list[tuple[ShardInfo, LabelSource]], workers: int
) -> Iterator[list[tuple[ShardInfo, LabelSource]]]:
    """``work`` in order, cut into batches of a few shards for each worker to take one at a time.

    A batch ends at ``_BATCH_BYTES`` (large shards go one by one and spread evenly over the workers)
    or at 1/``_BATCHES_PER_WORKER`` of a worker's share (a million tiny or missing shards would cost
    more to hand out one by one than to check).
    """
    most = max(1, math.ceil(len(work) / (workers * _BATCHES_PER_WORKER)))
    batch: list[tuple[ShardInfo, LabelSource]] = []
    size = 0
    for item in work:
        batch.append(item)
        size += item[0].bytes
        if len(batch) >= most or size >= _BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _listed(root: Path) -> frozenset[str] | None:
    """The names in ``root``, read once: a shard not among them is missing, no worker needs to look."""
    try:
        return frozenset(os.listdir(root))
    except OSError:
        return None  # then each shard is looked for by the worker that checks it


def verify(
    root: str | os.PathLike[str], *, splits: list[str] | None = None, workers: int | None = None
) -> VerifyReport:
    """Check every shard of ``root`` against ``index.json``: presence, size, SHA-256, samples, labels.

    A shard absent from one listing of ``root`` is reported missing there; the others are read by
    worker processes, a batch of shards at a time.

    Raises:
        ManifestError: the index is missing or unreadable (that is not a shard problem).

    """
    root = Path(root)
    manifest: Manifest = read_manifest(root)
    jobs = shard_jobs(manifest, splits)
    listed = _listed(root)
    there = [listed is None or shard.name in listed for _, shard in jobs]
    labels = {split: manifest.split(split).labels for split in {split for split, _ in jobs}}
    work = [(shard, labels[split]) for (split, shard), found in zip(jobs, there, strict=True) if found]
    workers = worker_count(workers, len(work))
    pool = start_pool(workers)
    try:
        check = partial(_check_local_shards, root, len(manifest.classes), manifest.class_to_idx)
        futures = [pool.submit(check, batch) for batch in _batches(work, workers)]
        checked = (result for future in futures for result in future.result())
        results = (
            next(checked) if found else ([_missing(shard)], {})
            for (_, shard), found in zip(jobs, there, strict=True)
        )
        return build_report(manifest, jobs, results)
    finally:
        pool.shutdown(cancel_futures=True)
