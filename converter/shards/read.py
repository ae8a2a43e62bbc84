"""Reading the shards ``index`` indexes: each once, hashed and counted, from a directory or a URL.

:func:`scan_shard` streams one shard through a hash and the one tar reader (only reading it),
groups its members into samples as webdataset and the loader group them, and collects each
sample's label value and what is wrong with it (no image, no label, a key repeated, an unreadable
tar). :class:`ShardStore` lists
a source's shards, scans them in parallel (worker processes locally, threads for a URL) and writes
the index beside them (its tables as files, index format 2).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from tqdm.auto import tqdm

from ..engines.pool import start_pool, worker_count
from ..format.errors import DestinationError, ManifestError, ShardFormatError, SourceError, UnsafeFileError
from ..format.locate import redact_url, shown_cause
from ..format.manifest import (
    IMAGE_EXTENSIONS,
    INDEX_NAME,
    TIMM_INFO_NAME,
    Manifest,
    ShardInfo,
    is_url,
    local_path,
    read_manifest,
)
from ..format.remotefs import Remote
from ..format.tables import BLOCK, MAX_SOURCE_BYTES, encode_sources, encode_table, key_digest
from ..format.tarsamples import checked_samples, shown
from ..format.tarstream import TarStream, stream_end
from ..format.validate import check_name, open_regular
from ..write.destination import update_index
from ..write.indexurl import write_index_url
from ..write.tablefiles import TABLE_FILE
from .verify import HashingReader

__all__ = ["ShardScan", "ShardStore", "Value", "scan_shard"]

Value = int | str  # a label as a shard holds it: a class id, or a class name
_PROBLEMS_PER_SHARD = 5
_READ_BLOCK = 8 << 20


@dataclass(frozen=True)
class ShardScan:
    """One shard as read: its index entry, the label values of its samples, and what is wrong in it.

    ``info`` has the shard's tables of starts, keys and sources (:mod:`.format.tables`), not yet its labels:
    ``labels`` holds each sample's label value, in stored order, for the ids the split gives them.
    ``problems`` holds the first few; ``bad`` counts them all.
    """

    info: ShardInfo
    values: Counter[Value]
    problems: tuple[str, ...]
    bad: int
    labels: tuple[Value, ...] = ()


# ---- reading one shard ------------------------------------------------------------------------


def scan_shard(
    opener: Callable[[], AbstractContextManager[BinaryIO]], name: str, label_field: str | None
) -> ShardScan:
    """Read the shard ``opener()`` opens once: hash, size, samples, label values and problems.

    Members are read by the one tar reader the loader and ``verify`` read through, and samples are
    judged by the same functions (:func:`~.format.tarsamples.checked_samples`).
    """
    values: Counter[Value] = Counter()
    labels: list[Value] = []
    starts: list[int] = []
    keys: list[int] = []
    sources: list[str] = []
    problems: list[str] = []
    bad, samples = 0, 0
    with opener() as f:
        reader = HashingReader(f)
        tar = TarStream(reader, end=stream_end(f), seekable=False)  # type: ignore[arg-type]
        try:
            for sample, value, problem in checked_samples(tar, "json" if label_field else "cls", label_field):
                samples += 1
                if value is not None:  # one image and one label: the sample is the image member's
                    values[value] += 1
                    labels.append(value)
                    starts.append(sample.start // BLOCK)
                    keys.append(key_digest(sample.key))
                    image = next(e for e in sample.exts if e in IMAGE_EXTENSIONS)
                    sources.append(_source_path(f"{sample.key}.{image}"))
                else:
                    bad += 1
                    if len(problems) < _PROBLEMS_PER_SHARD:
                        problems.append(f"sample {shown(sample.key)} {problem}")
        except ShardFormatError as e:
            bad += 1
            problems.append(f"is not a readable tar after {samples} samples ({e})")
        reader.drain()
    info = ShardInfo(name=name, samples=samples, bytes=reader.size, sha256=reader.sha.hexdigest())
    if not bad:  # a shard with a problem is refused whole: its tables would not be used
        info = replace(
            info, offsets=encode_table(starts), keys=encode_table(keys), sources=encode_sources(sources)
        )
    return ShardScan(info, values, tuple(problems), bad, tuple(labels))


# ---- where the shards are: a directory or a URL -------------------------------------------------


class ShardStore:
    """Lists, reads and writes at the source: a local directory, or an fsspec URL."""

    def __init__(self, src: str | os.PathLike[str], storage_options: Mapping[str, Any]) -> None:
        self.url = is_url(src)
        self.storage_options = dict(storage_options)
        if self.url:
            remote = Remote(str(src), self.storage_options)
            remote.check()  # as pack does: no credentials, no bucket, no endpoint is one line at once
            self.root: Path | str = remote.url
            self.fs, self.path = remote.fs, remote.root
        else:
            self.root = local_path(src)
            if not self.root.is_dir():
                raise SourceError(f"{self.root} is not a directory of WebDataset shards")

    def existing_index(self) -> Manifest | None:
        """The index already there, None if none; refuse to replace another tool's ``index.json``."""
        if self.url:
            exists = self.fs.exists(f"{self.path}/{INDEX_NAME}")
        else:
            exists = os.path.lexists(Path(self.root) / INDEX_NAME)
        if not exists:
            return None
        try:
            return read_manifest(self.root, storage_options=self.storage_options)
        except ManifestError as e:
            raise DestinationError(
                f"{redact_url(str(self.root))} already has an {INDEX_NAME} that imgshards cannot use "
                f"({e}); indexing would "
                "replace it: move it away first"
            ) from None

    def list_shards(self, pattern: str) -> list[str]:
        """Names of the regular files matching ``pattern`` directly under the root, sorted."""
        if self.url:
            found = self.fs.glob(f"{self.path}/{pattern}", detail=True)
            names = [str(p).rsplit("/", 1)[-1] for p, e in found.items() if e.get("type") != "directory"]
        else:
            names = [path.name for path in Path(self.root).glob(pattern)]
        names = sorted(
            n
            for n in names
            if not n.startswith(".") and n not in (INDEX_NAME, TIMM_INFO_NAME) and not TABLE_FILE.fullmatch(n)
        )
        if not names:
            raise SourceError(
                f"no shard in {redact_url(str(self.root))} matches {pattern!r}; pass the glob of its shards"
            )
        for name in names:  # what the index may name, as every reader of it checks
            try:
                check_name(name, "shard name", str(self.root))
            except ManifestError as e:
                raise SourceError(f"{e}: rename the shard, or leave it out of --shards") from None
        return names

    def scan(
        self, names: list[str], label_field: str | None, *, workers: int | None, progress: bool
    ) -> list[ShardScan]:
        """Read every shard once, in parallel; the scans in the order of ``names``.

        ``label_field``: labels are in this field of each ``.json`` (None: in ``.cls``).
        """
        # Capped as pack's and verify's -j are: at the shards there are and at what the machine allows.
        workers = worker_count(workers, len(names))
        if self.url:
            futures = self._scan_threads(names, label_field, max(workers, 4))
        else:
            pool = start_pool(workers)
            try:
                futures = [pool.submit(_scan_local, Path(self.root), n, label_field) for n in names]
                return _collect(futures, progress)
            finally:
                pool.shutdown(cancel_futures=True)
        return _collect(futures, progress)

    def _scan_threads(
        self, names: list[str], label_field: str | None, workers: int
    ) -> list[Future[ShardScan]]:
        def scan(name: str) -> ShardScan:
            path = f"{self.path}/{name}"
            return scan_shard(lambda: self.fs.open(path, "rb", block_size=_READ_BLOCK), name, label_field)

        pool = ThreadPoolExecutor(workers, thread_name_prefix="imgshards-index")
        futures = [pool.submit(scan, n) for n in names]
        pool.shutdown(wait=False)
        return futures

    def update(self, build: Callable[[Manifest | None], Manifest]) -> Manifest:
        """Write the index ``build`` makes of the one there now (None: none); return it as written.

        Locally under the index lock (:func:`~..write.destination.update_index`): ``build`` gets the
        index as it is once the lock is held, so a split another command wrote meanwhile is kept. At
        a URL, the index is read again just before the new one is written (there is no lock there).
        The split's tables are written as files, uploaded first at a URL; ``_info.json``, then
        ``index.json``, each whole or not at all.
        """
        if self.url:
            current = self.existing_index()
            return write_index_url(str(self.root), build(current), storage_options=self.storage_options)
        root = Path(self.root)
        try:
            manifest = update_index(root, build)
        except OSError as e:
            raise DestinationError(f"cannot write the index into {root}: {e.strerror or e}") from e
        assert manifest is not None  # build always gives one
        return manifest


def _scan_local(root: Path, name: str, label_field: str | None) -> ShardScan:
    # Only a regular file inside the root: not a FIFO, a device, or a symlink out of the dataset.
    return scan_shard(lambda: open_regular(root / name, inside=root), name, label_field)


def _collect(futures: Sequence[Future[ShardScan]], progress: bool) -> list[ShardScan]:
    with tqdm(total=len(futures), unit="shard", desc="index", disable=not progress) as bar:
        scans = []
        for future in futures:
            try:
                scans.append(future.result())
            except UnsafeFileError as e:
                raise SourceError(f"{e}; leave it out of --shards") from None
            except OSError as e:
                raise SourceError(f"cannot read a shard: {redact_url(str(e))}") from shown_cause(e)
            bar.update()
    return scans


def _source_path(name: str) -> str:
    """A member's name as the sources table holds it: cut to its last MAX_SOURCE_BYTES bytes if longer.

    A tar member's name may reach 1 MiB (a GNU long name); the table's paths are names to show, each
    at most a path's length (what bounds a reader's inflate), so a longer one keeps its end, the file.
    """
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= MAX_SOURCE_BYTES:
        return name
    return "..." + raw[-(MAX_SOURCE_BYTES - 3) :].decode("utf-8", "surrogateescape")
