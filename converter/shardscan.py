"""Reading the shards ``index`` indexes: each once, hashed and counted, from a directory or a URL.

:func:`scan_shard` streams one shard through a hash and ``tarfile`` (only reading it), groups its
members into samples as webdataset and the loader group them, and collects each sample's label
value and what is wrong with it (no image, no label, an unreadable tar). :class:`ShardStore` lists
a source's shards, scans them in parallel (worker processes locally, threads for a URL) and writes
the index beside them.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tqdm.auto import tqdm

from .errors import DestinationError, ManifestError, SourceError, UnsafeFileError
from .manifest import (
    IMAGE_EXTENSIONS,
    INDEX_NAME,
    TIMM_INFO_NAME,
    Manifest,
    ShardInfo,
    is_url,
    local_path,
    read_manifest,
    split_member_name,
)
from .pool import default_workers, start_pool
from .remote import write_index_url
from .safefs import write_atomic
from .validate import check_name, open_regular
from .verify import HashingReader

__all__ = ["ShardScan", "ShardStore", "Value", "scan_shard"]

Value = int | str  # a label as a shard holds it: a class id, or a class name
_IMAGE_EXTS = frozenset(IMAGE_EXTENSIONS)
_LABEL_BYTES = 1 << 16  # a .cls or .json member larger than this holds no label
_PROBLEMS_PER_SHARD = 5
_READ_BLOCK = 8 << 20


@dataclass(frozen=True)
class ShardScan:
    """One shard as read: its index entry, the label values of its samples, and what is wrong in it.

    ``problems`` holds the first few; ``bad`` counts them all.
    """

    info: ShardInfo
    values: Counter[Value]
    problems: tuple[str, ...]
    bad: int


# ---- reading one shard ------------------------------------------------------------------------


def scan_shard(
    opener: Callable[[], AbstractContextManager[BinaryIO]], name: str, label_field: str | None
) -> ShardScan:
    """Read the shard ``opener()`` opens once: hash, size, samples, label values and problems."""
    values: Counter[Value] = Counter()
    problems: list[str] = []
    bad, samples = 0, 0
    key: str | None = None
    exts: list[str] = []
    label: bytes | None = None

    def finish() -> None:
        nonlocal samples, bad
        samples += 1
        problem = _sample_problem(exts, label, label_field, values)
        if problem:
            bad += 1
            if len(problems) < _PROBLEMS_PER_SHARD:
                problems.append(f"sample {key!r} {problem}")

    with opener() as f:
        reader = HashingReader(f)
        try:
            with tarfile.open(fileobj=reader, mode="r|") as tar:  # type: ignore[call-overload]
                for member in tar:
                    parts = split_member_name(member.name) if member.isreg() else None
                    if parts is None:  # not part of a sample (webdataset and the loader skip it too)
                        continue
                    if parts[0] != key:
                        if key is not None:
                            finish()
                        key, exts, label = parts[0], [], None
                    exts.append(parts[1])
                    if parts[1] == ("json" if label_field else "cls"):
                        data = tar.extractfile(member) if member.size <= _LABEL_BYTES else None
                        label = data.read() if data is not None else b""
            if key is not None:
                finish()
        except (tarfile.TarError, EOFError, ValueError) as e:
            bad += 1
            problems.append(f"is not a readable tar after {samples} samples ({type(e).__name__}: {e})")
        reader.drain()
    info = ShardInfo(name=name, samples=samples, bytes=reader.size, sha256=reader.sha.hexdigest())
    return ShardScan(info, values, tuple(problems), bad)


def _sample_problem(
    exts: list[str], label: bytes | None, label_field: str | None, values: Counter[Value]
) -> str | None:
    """What is wrong with one sample (None if nothing); adds its label value to ``values``."""
    images = [e for e in exts if e in _IMAGE_EXTS]
    if len(images) != 1:
        return (
            f"has members {sorted(exts)}: not one image among {', '.join(IMAGE_EXTENSIONS)} "
            "(the extensions imgshards reads)"
        )
    member = f".json field {label_field!r}" if label_field else ".cls"
    if label is None:
        return f"has no {'.json' if label_field else '.cls'} member for its label"
    try:
        if label_field is None:
            value: object = label.decode("utf-8").strip()
        else:
            doc = json.loads(label)
            if not isinstance(doc, dict) or label_field not in doc:
                fields = sorted(doc)[:8] if isinstance(doc, dict) else type(doc).__name__
                return f"has no field {label_field!r} in its .json (it holds {fields})"
            value = doc[label_field]
    except ValueError as e:  # JSON and UTF-8 errors both
        return f"has an unreadable label member ({e})"
    if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
        return f"has no label: {member} is {value!r} (a class id or name expected)"
    values[value] += 1
    return None


# ---- where the shards are: a directory or a URL -------------------------------------------------


class ShardStore:
    """Lists, reads and writes at the source: a local directory, or an fsspec URL."""

    def __init__(self, src: str | os.PathLike[str], storage_options: Mapping[str, Any]) -> None:
        self.url = is_url(src)
        self.storage_options = dict(storage_options)
        if self.url:
            from fsspec.core import url_to_fs  # only for URLs: the converter needs no fsspec otherwise

            self.root: Path | str = str(src).rstrip("/")
            try:
                self.fs, path = url_to_fs(self.root, **self.storage_options)
            except ImportError as e:
                raise SourceError(f"cannot read {src}: {e}") from e
            self.path = str(path).rstrip("/")
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
                f"{self.root} already has an {INDEX_NAME} that imgshards cannot use ({e}); indexing would "
                "replace it: move it away first"
            ) from None

    def list_shards(self, pattern: str) -> list[str]:
        """Names of the regular files matching ``pattern`` directly under the root, sorted."""
        if self.url:
            found = self.fs.glob(f"{self.path}/{pattern}", detail=True)
            names = [str(p).rsplit("/", 1)[-1] for p, e in found.items() if e.get("type") != "directory"]
        else:
            names = [path.name for path in Path(self.root).glob(pattern)]
        names = sorted(n for n in names if not n.startswith(".") and n not in (INDEX_NAME, TIMM_INFO_NAME))
        if not names:
            raise SourceError(f"no shard in {self.root} matches {pattern!r}; pass the glob of its shards")
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
        workers = min(workers or default_workers(), len(names))
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

    def write(self, manifest: Manifest) -> None:
        """``_info.json``, then ``index.json``, each written whole or not at all."""
        if self.url:
            write_index_url(str(self.root), manifest, storage_options=self.storage_options)
            return
        root = Path(self.root)
        try:
            write_atomic(root / TIMM_INFO_NAME, (json.dumps(manifest.timm_info(), indent=1) + "\n").encode())
            write_atomic(root / INDEX_NAME, manifest.dumps().encode())
        except OSError as e:
            raise DestinationError(f"cannot write the index into {root}: {e.strerror or e}") from e


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
                raise SourceError(f"cannot read a shard: {e}") from e
            bar.update()
    return scans
