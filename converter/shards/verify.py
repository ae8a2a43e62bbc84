"""``verify``: re-hash and recount every shard of a packed dataset against its index, and its tables.

Shards are read by the one tar reader ``index`` and the loader read through, and each sample is
judged as they judge it (:func:`~.format.tarsamples.checked_samples`): the count is of samples as the loader
reads them (members grouped by adjacent keys), and a key met again after other samples is a problem.

The split's tables (:mod:`..format.tablefiles`) are checked too. Format 2: each table file first,
present, of the size and SHA-256 its index says (a missing or damaged one is reported under its
name, with what rebuilds it); then, for the tables whose file is whole, each shard's entries against
what the shard holds: every sample's start, key digest and class id as read from the shard, and
its sources stream decoded. Format 1 (tables inside the index, whose shape ``read_manifest``
checks): the same entries against the same shards.
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

import numpy as np

from ..engines.pool import start_pool, worker_count, worker_state
from ..format.errors import ManifestError, ShardEndError, ShardFormatError
from ..format.locate import redact_url
from ..format.manifest import LabelSource, Manifest, ShardInfo, TableFile, read_manifest
from ..format.tablefiles import FIXED_TABLES, SplitTables
from ..format.tables import BLOCK, key_digest
from ..format.tarsamples import checked_samples, shown
from ..format.tarstream import TarStream, stream_end
from ..format.validate import open_regular

__all__ = [
    "Entries",
    "HashingReader",
    "ShardProblem",
    "VerifyReport",
    "build_report",
    "check_shard_stream",
    "check_table_stream",
    "hash_file",
    "shard_entries",
    "shard_jobs",
    "table_jobs",
    "table_problem",
    "usable_tables",
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
    """The outcome of :func:`verify`: ``shards`` and ``tables`` (format 2's files) checked."""

    shards: int
    samples: int
    problems: tuple[ShardProblem, ...]
    tables: int = 0

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


@dataclass(frozen=True)
class Entries:
    """What a split's tables say of one shard's samples: starts (in bytes), key digests, class ids.

    None: a table the split has not, or whose file is not whole (reported once, as the file's).
    """

    starts: np.ndarray | None = None
    keys: np.ndarray | None = None
    labels: np.ndarray | None = None


def check_shard_stream(
    opener: Callable[[], AbstractContextManager[BinaryIO]],
    expected: ShardInfo,
    num_classes: int,
    labels_from: LabelSource | None = None,
    class_to_idx: Mapping[str, int] | None = None,
    entries: Entries | None = None,
) -> tuple[list[str], Counter[int]]:
    """Problems found in one shard read once from ``opener()``, and the labels it holds.

    ``opener`` opens the shard for reading (a local file, an fsspec file); a shard it cannot find
    (``FileNotFoundError``) is reported missing. ``labels_from`` says which member holds a sample's
    label (its split's; default ``.cls``), ``class_to_idx`` maps a class name to its id (for labels
    that are names). ``entries``: what the index's tables say of the shard's samples, compared
    with what it holds (where the shard holds as many samples as its index says).
    """
    labels_from = labels_from or LabelSource()
    labels: Counter[int] = Counter()
    problems: list[str] = []
    samples = bad = 0
    seen: dict[str, list[int]] = {"starts": [], "keys": [], "labels": []}
    keys: list[str] = []
    compare = entries is not None and (
        entries.starts is not None or entries.keys is not None or entries.labels is not None
    )
    whole = True
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
                    if compare:
                        seen["starts"].append(sample.start)
                        seen["keys"].append(key_digest(sample.key))
                        seen["labels"].append(label)
                        keys.append(sample.key)
            except ShardEndError as e:  # a size past the end: checked before anything is read or skipped
                problems.append(f"member {e.member!r} declares {e.declared} bytes, past the end")
                whole = False
            except ShardFormatError as e:
                problems.append(f"unreadable tar ({e})")
                whole = False
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
    elif compare and whole:
        assert entries is not None
        problems.extend(_entry_problems(entries, seen, keys))
    return problems, labels


def _entry_problems(entries: Entries, seen: Mapping[str, list[int]], keys: list[str]) -> list[str]:
    """Where the tables' entries differ from the samples the shard holds (as many of each)."""
    problems = []
    for table, said in (("starts", entries.starts), ("keys", entries.keys), ("labels", entries.labels)):
        if said is None:
            continue
        found = np.asarray(seen[table], dtype=np.int64)
        differ = found != said.astype(np.int64)
        if table == "labels":
            differ &= found >= 0  # a sample without a usable label is a problem of its own already
        wrong = np.flatnonzero(differ)
        if len(wrong):
            i = int(wrong[0])
            what = {"starts": "starts at byte", "keys": "has the key digest", "labels": "has class id"}[table]
            problems.append(
                f"{len(wrong)} sample(s) differ from the index's {table} table (first: sample "
                f"{shown(keys[i])} {what} {int(found[i])}, the table says {int(said[i])})"
            )
    return problems


def table_jobs(manifest: Manifest, splits: list[str]) -> list[tuple[str, TableFile]]:
    """(split, table file) for every table file of ``splits`` (format 2; format 1 has none)."""
    return [(name, entry) for name in splits for entry in manifest.split(name).tables.values()]


def check_table_stream(opener: Callable[[], AbstractContextManager[BinaryIO]], entry: TableFile) -> list[str]:
    """Problems of one table file read once from ``opener()``: missing, unreadable, its size, its SHA-256."""
    try:
        with opener() as f:
            reader = HashingReader(f)
            reader.drain()
    except FileNotFoundError:
        return [f"missing (expected {entry.bytes} bytes)"]
    except OSError as e:  # not a regular file, a symlink out of the dataset, unreadable
        return [f"unreadable ({redact_url(str(e.strerror or e))})"]
    if reader.size != entry.bytes:
        return [f"{reader.size} bytes, index says {entry.bytes}"]
    if reader.sha.hexdigest() != entry.sha256:
        return ["SHA-256 differs from the index: the file changed or is damaged"]
    return []


def table_problem(manifest: Manifest, split: str, entry: TableFile, problem: str) -> ShardProblem:
    """A table file's problem as the report holds it, with what writes the file again."""
    if manifest.split(split).pack_args.get("made_by"):  # `imgshards index` wrote the split
        again = f"run `imgshards index` for split {split!r} again (it reads its shards and writes them)"
    else:
        again = (
            f"run the `imgshards pack` that wrote split {split!r} again (it resumes, and writes its "
            "tables from its records)"
        )
    return ShardProblem(split, entry.name, f"{problem}: a table file of the index; {again}")


def usable_tables(tables: SplitTables, bad: Iterable[str]) -> frozenset[str]:
    """The tables of a split whose entries can be compared: those it has, but for files found ``bad``."""
    names = {entry.name: table for table, entry in tables.split.tables.items()}
    skipped = {names[name] for name in bad if name in names}
    return frozenset(t for t in (*FIXED_TABLES, "sources") if tables.has(t) and t not in skipped)


def shard_entries(tables: SplitTables, s: int, usable: frozenset[str]) -> tuple[Entries, list[str]]:
    """Shard ``s``'s entries of the ``usable`` tables, and what is wrong with them on their own.

    The sources stream is decoded (its paths cannot be compared with the shard: they name the
    packed tree's files); a table that cannot be read for this shard is a problem, not an entry.
    """
    found: dict[str, np.ndarray] = {}
    problems = []
    for table in (*FIXED_TABLES, "sources"):
        if table not in usable:
            continue
        try:
            if table == "sources":
                tables.sources(s)
            else:
                found[table] = tables.entries(table, s)
        except ManifestError as e:
            problems.append(_table_told(e))
    if "starts" in found:
        found["starts"] = found["starts"].astype(np.int64) * BLOCK
    return Entries(**found), problems


def _table_told(e: ManifestError) -> str:
    """A table's error (:class:`~..format.tablefiles.SplitTables`) as a problem of a shard: what is wrong."""
    text = str(e)
    _, _, what = text.partition(" is not what its index says: ")
    return f"its tables: {(what or text).split('; run `imgshards verify')[0]}"


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
    tables: tuple[int, list[ShardProblem]] = (0, []),
) -> VerifyReport:
    """The report over ``jobs`` (split, shard) from their :func:`check_shard_stream` results, in order.

    ``tables``: the table files checked and their problems (:func:`table_problem`), listed first.
    Adds a split-wide problem when the labels found add up to other per-class counts than the index's
    (only where no shard of the split already has a problem, which would explain it).
    """
    names = sorted({split for split, _ in jobs})
    problems: list[ShardProblem] = list(tables[1])
    per_split: dict[str, Counter[int]] = {name: Counter() for name in names}
    for (split, shard), (found, labels) in zip(jobs, results, strict=True):
        problems.extend(ShardProblem(split, shard.name, p) for p in found)
        per_split[split].update(labels)
    for name in names:
        counts = tuple(per_split[name].get(i, 0) for i in range(len(manifest.classes)))
        if counts != manifest.split(name).class_counts and not any(p.split == name for p in problems):
            problems.append(ShardProblem(name, "*", "per-class counts differ from the index"))
    samples = sum(manifest.split(n).samples for n in names)
    return VerifyReport(shards=len(jobs), samples=samples, problems=tuple(problems), tables=tables[0])


def _missing(expected: ShardInfo) -> str:
    return f"missing (expected {expected.bytes} bytes)"


# A shard's work in a worker: its entry, its split's labels, and (split, position, usable tables).
_Work = tuple[ShardInfo, LabelSource, tuple[str, int, frozenset[str]]]


def _check_local_shards(
    root: Path, num_classes: int, class_to_idx: dict[str, int], batch: list[_Work]
) -> list[tuple[list[str], dict[int, int]]]:
    """:func:`check_shard_stream` on each shard of ``batch``; the labels as a dict, quick to send back.

    Each worker maps its splits' tables (handed over at its start, :func:`verify`) on first use.
    """
    tables: dict[str, SplitTables] = worker_state()["tables"]

    def check(
        expected: ShardInfo, labels_from: LabelSource, at: tuple[str, int, frozenset[str]]
    ) -> tuple[list[str], dict[int, int]]:
        def opener() -> BinaryIO:
            return open_regular(root / expected.name, inside=root)

        split, s, usable = at
        entries, told = shard_entries(tables[split], s, usable)
        problems, labels = check_shard_stream(
            opener, expected, num_classes, labels_from, class_to_idx, entries
        )
        return told + problems, dict(labels)

    return [check(*work) for work in batch]


def _check_local_table(root: Path, entry: TableFile) -> list[str]:
    return check_table_stream(lambda: open_regular(root / entry.name, inside=root), entry)


def _batches(work: list[_Work], workers: int) -> Iterator[list[_Work]]:
    """``work`` in order, cut into batches of a few shards for each worker to take one at a time.

    A batch ends at ``_BATCH_BYTES`` (large shards go one by one and spread evenly over the workers)
    or at 1/``_BATCHES_PER_WORKER`` of a worker's share (a million tiny or missing shards would cost
    more to hand out one by one than to check).
    """
    most = max(1, math.ceil(len(work) / (workers * _BATCHES_PER_WORKER)))
    batch: list[_Work] = []
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

    And the tables (see the module docstring): each table file's presence, size and SHA-256 first,
    then each shard's entries where it is read. A shard or table file absent from one listing of
    ``root`` is reported missing there; the others are read by worker processes, a batch of shards
    at a time.

    Raises:
        ManifestError: the index is missing or unreadable (that is not a shard problem).

    """
    root = Path(root)
    manifest: Manifest = read_manifest(root)
    jobs = shard_jobs(manifest, splits)
    names = sorted(set(splits or manifest.splits))
    num_classes = len(manifest.classes)
    tables = {name: SplitTables(manifest.split(name), num_classes, root=root) for name in names}
    listed = _listed(root)
    files = table_jobs(manifest, names)
    there = [listed is None or shard.name in listed for _, shard in jobs]
    workers = worker_count(workers, len(jobs) + len(files))
    pool = start_pool(workers, {"tables": tables})  # forked: the tables are not copied, and mapped there
    try:
        checked_files = [
            pool.submit(_check_local_table, root, entry) if listed is None or entry.name in listed else None
            for _, entry in files
        ]
        bad: list[ShardProblem] = []
        for (split, entry), future in zip(files, checked_files, strict=True):
            told = future.result() if future is not None else [f"missing (expected {entry.bytes} bytes)"]
            bad.extend(table_problem(manifest, split, entry, p) for p in told)
        usable = {
            name: usable_tables(tables[name], (p.shard for p in bad if p.split == name)) for name in names
        }
        positions = {name: 0 for name in names}
        work: list[_Work] = []
        for (split, shard), found in zip(jobs, there, strict=True):
            if found:
                at = (split, positions[split], usable[split])
                work.append((shard, manifest.split(split).labels, at))
            positions[split] += 1
        check = partial(_check_local_shards, root, num_classes, manifest.class_to_idx)
        futures = [pool.submit(check, batch) for batch in _batches(work, workers)]
        results_of = (result for future in futures for result in future.result())
        results = (
            next(results_of) if found else ([_missing(shard)], {})
            for (_, shard), found in zip(jobs, there, strict=True)
        )
        return build_report(manifest, jobs, results, (len(files), bad))
    finally:
        pool.shutdown(cancel_futures=True)
