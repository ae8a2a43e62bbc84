"""A split's per-sample tables as files (index format 2), and the one way a process reads them.

Format 1 held every shard's tables inside ``index.json`` (:mod:`.tables`: base64 text), so every
process parsed and decoded every sample's entries, and an index passed its size bound at about
12 M samples. Format 2 keeps ``index.json`` O(shards) and puts each table of a split in a file of its
own at the dataset's root, one entry a sample in the split's order (shard by shard, stored order):

=========  ==============================================  =====================================
table      entry                                           file
=========  ==============================================  =====================================
starts     the sample's first tar header, in 512-byte      ``<split>=starts.<digest>.u32``
           blocks from its shard's start (``<u4``)
labels     its class id (``<u4``)                          ``<split>=labels.<digest>.u32``
keys       its key's CRC-32 (``<u4``, :func:`.tables.key_digest`)  ``<split>=keys.<digest>.u32``
sources    its source path: one zlib stream a shard, of    ``<split>=sources.<digest>.zlib``
           the shard's UTF-8 paths each ended by a NUL
=========  ==============================================  =====================================

The ``=`` after the split keeps the name out of the split patterns of Hugging Face's
``load_dataset("webdataset", data_dir=DST)`` (``**/train[-._ 0-9]*``, ``**/*[-._ 0-9]val[-._ 0-9]*``...),
which would read a table as a shard of the split; only the shards match them.
``<digest>`` is the first 16 hex digits of the file's sha256, so a file's name is its content: a
re-pack writes new names, and a process still holding the old index finds its tables gone (or
still mapped, unchanged), never another dataset's entries. ``index.json`` names each file with its
byte size and sha256 (:class:`TableFile`), and each shard its sources stream's size
(``sources_bytes``). A split has each table for all its shards or not at all.

Reading (:class:`SplitTables`): a local file is checked against the size its entry claims and
mapped read-only, so the workers of every rank share one copy in the page cache and no process
parses or copies it; a URL's table is fetched by ranges, a shard's entries at a time. The entries
are untrusted: a shard's starts (strictly increasing, inside the shard) and labels (below the class
count) are checked with numpy the first time a process uses that shard, and a read by position
still checks the key and label it finds. The sha256 of every file is checked by ``imgshards
verify``, not on every open. An index of format 1 is read through the same class, its tables
decoded from the index a shard at a time.
"""

from __future__ import annotations

import mmap
import os
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from .errors import ManifestError, UnsafeFileError
from .tables import (
    BLOCK,
    ENTRY_BYTES,
    FIXED_TABLES,
    MAX_SOURCE_BYTES,
    TABLES,
    TableFile,
    decode_sources,
    decode_table,
    max_sources_bytes,
)
from .validate import open_regular

if TYPE_CHECKING:  # the index's, which names these files (and imports nothing of this module)
    from .manifest import SplitInfo

__all__ = [
    "ENTRY",
    "FIXED_TABLES",
    "SplitTables",
    "TableFile",
    "TableReader",
    "decode_sources_chunk",
    "encode_sources_chunk",
    "max_sources_bytes",
    "table_file_name",
]

ENTRY = np.dtype("<u4")  # every fixed-width table: 4-byte little-endian unsigned integers
_Kept = TypeVar("_Kept", np.ndarray, list[str])  # what a shard's cache holds: entries or source paths
assert ENTRY.itemsize == ENTRY_BYTES
_SUFFIX = {"starts": "u32", "labels": "u32", "keys": "u32", "sources": "zlib"}
# A table of format 1 (:mod:`.tables`) by its format-2 name: "offsets" there is "starts" here.
_V1_NAME = {"starts": "offsets", "labels": "labels", "keys": "keys", "sources": "sources"}
assert tuple(_V1_NAME.values()) == TABLES
_CACHED_SHARDS = 8  # a shard's decoded or fetched entries kept per table (format 1, URLs)

# What reads a range of a table file behind a URL: (file, start, stop) -> its bytes.
TableReader = Callable[["TableFile", int, int], bytes]


def table_file_name(split: str, table: str, sha256: str) -> str:
    """The file name of split ``split``'s table ``table`` whose content hashes to ``sha256``."""
    return f"{split}={table}.{sha256[:16]}.{_SUFFIX[table]}"


def encode_sources_chunk(paths: Sequence[str]) -> bytes:
    """A shard's sources stream: its paths, UTF-8 (a name's odd bytes as read), each ended by a NUL."""
    raw = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
    return zlib.compress(raw, 6)


def decode_sources_chunk(data: bytes, samples: int) -> list[str]:
    """The ``samples`` paths of a shard's sources stream, inflating no more than they may hold.

    Raises:
        ValueError: not a zlib stream of ``samples`` NUL-ended paths of at most MAX_SOURCE_BYTES.

    """
    if not data and not samples:
        return []
    try:
        inflate = zlib.decompressobj()
        raw = inflate.decompress(data, samples * (MAX_SOURCE_BYTES + 1) + 1)
    except zlib.error as e:
        raise ValueError(f"not zlib data: {e}") from None
    if inflate.unconsumed_tail or not inflate.eof or inflate.unused_data:
        raise ValueError(f"more than {samples} paths of at most {MAX_SOURCE_BYTES} bytes, or cut short")
    return _paths(raw, samples)


def _paths(raw: bytes, samples: int) -> list[str]:
    if raw and not raw.endswith(b"\0"):
        raise ValueError("paths not each ended by a NUL")
    paths = raw.decode("utf-8", "surrogateescape").split("\0")[:-1]
    if len(paths) != samples:
        raise ValueError(f"one path per sample ({samples}), not {len(paths)}")
    if paths and (min(map(len, paths)) == 0 or max(map(len, paths)) > MAX_SOURCE_BYTES):
        raise ValueError(f"a path empty or over {MAX_SOURCE_BYTES} characters")
    return paths


class SplitTables:
    """A split's tables, read as one process needs them (see the module docstring).

    Args:
        split: The split, as its index says (format 1 or 2).
        num_classes: The index's class count (labels are checked below it).
        root: The dataset's local directory (format 2 files are mapped from there), or None.
        fetch: How a table behind a URL is read (format 2, ``root`` None).
        where: The dataset, as error messages name it.

    Every method raises :class:`~.errors.ManifestError` for a table that is not what its index
    says (a size, an entry), naming the file and what to do; a table the split has not is None
    where a method may return one. Picklable: a DataLoader worker maps the files again on first use.

    """

    def __init__(
        self,
        split: SplitInfo,
        num_classes: int,
        *,
        root: str | os.PathLike[str] | None = None,
        fetch: TableReader | None = None,
        where: str = "",
    ) -> None:
        self.split, self.num_classes = split, num_classes
        self.root = None if root is None else Path(root)
        self.fetch, self.where = fetch, where or str(root)
        counts = np.fromiter((s.samples for s in split.shards), dtype=np.int64, count=len(split.shards))
        self.first = np.zeros(len(counts) + 1, dtype=np.int64)  # shard s holds [first[s], first[s+1])
        np.cumsum(counts, out=self.first[1:])
        self._sources_at: np.ndarray | None = None
        if "sources" in split.tables:  # format 2: where each shard's sources stream starts
            sizes = [s.sources_bytes or 0 for s in split.shards]
            self._sources_at = np.zeros(len(sizes) + 1, dtype=np.int64)
            np.cumsum(sizes, out=self._sources_at[1:])
        self._reset()

    def _reset(self) -> None:
        self._maps: dict[str, np.ndarray | mmap.mmap] = {}
        self._cache: dict[str, OrderedDict[int, np.ndarray | list[str]]] = {}
        self._checked: dict[str, bytearray] = {}
        self._has: dict[str, bool] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_maps", "_cache", "_checked", "_has", "_lock"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    # ---- what a reader asks -----------------------------------------------------------------------

    @property
    def samples(self) -> int:
        """The split's sample count."""
        return int(self.first[-1])

    @property
    def version(self) -> int:
        """The index format the tables come from: 2 (files), 1 (inside the index)."""
        return 2 if self.split.tables else 1

    def has(self, table: str) -> bool:
        """Whether the split has table ``table`` (for every shard)."""
        if self.split.tables:
            return table in self.split.tables
        known = self._has.get(table)  # format 1: asked for every shard read, so looked at once
        if known is None:
            known = self._has[table] = all(s.table(_V1_NAME[table]) is not None for s in self.split.shards)
        return known

    def shard_of(self, i: int) -> int:
        """The shard that holds sample ``i`` of the split."""
        return int(np.searchsorted(self.first, i, side="right")) - 1

    def starts(self, s: int) -> np.ndarray:
        """Shard ``s``'s sample starts, in bytes (int64), checked: increasing, inside the shard."""
        blocks = self._entries("starts", s)
        if not self._seen("starts", s):
            shard = self.split.shards[s]
            if len(blocks) and (
                # Compared entry by entry: np.diff of unsigned entries wraps (5 - 7 is 2**32 - 2).
                int(blocks[-1]) >= shard.bytes // BLOCK or bool((blocks[1:] <= blocks[:-1]).any())
            ):
                raise self.bad("starts", f"shard {shard.name}'s starts are not increasing inside the shard")
            self._checked["starts"][s] = 1
        return blocks.astype(np.int64) * BLOCK

    def entries(self, table: str, s: int) -> np.ndarray:
        """Shard ``s``'s entries of fixed-width table ``table`` as stored, unchecked (starts in blocks).

        What ``imgshards verify`` compares with what the shard holds; a reader uses the checked
        methods (:meth:`starts`, :meth:`labels`, :meth:`keys`).
        """
        return self._entries(table, s)

    def keys(self, s: int) -> np.ndarray | None:
        """Shard ``s``'s key digests (CRC-32 of each key), or None without the table."""
        return self._entries("keys", s) if self.has("keys") else None

    def labels(self, s: int) -> np.ndarray | None:
        """Shard ``s``'s class ids, checked below the class count; None without the table."""
        if not self.has("labels"):
            return None
        ids = self._entries("labels", s)
        if not self._seen("labels", s):
            if len(ids) and int(ids.max()) >= self.num_classes:
                raise self.bad(
                    "labels",
                    f"a class id of shard {self.split.shards[s].name} is not below "
                    f"the index's {self.num_classes} classes",
                )
            self._checked["labels"][s] = 1
        return ids

    def all_labels(self) -> np.ndarray | None:
        """Every sample's class id, in the split's order (a view of the map where it is one); checked."""
        if not self.has("labels"):
            return None
        column = self._column("labels")
        if column is None:  # format 1, or a URL: shard by shard
            parts = []
            for s in range(len(self.split.shards)):
                ids = self.labels(s)
                assert ids is not None  # the split has the table
                parts.append(ids)
            return np.concatenate(parts) if parts else np.empty(0, ENTRY)
        if not all(self._checked_all("labels")):
            if len(column) and int(column.max()) >= self.num_classes:
                raise self.bad("labels", f"a class id is not below the index's {self.num_classes} classes")
            self._checked["labels"][:] = b"\1" * len(self.split.shards)
        return column

    def sources(self, s: int) -> list[str] | None:
        """Shard ``s``'s source paths, or None without the table."""
        if not self.has("sources"):
            return None
        cached = self._cached("sources", s)
        if isinstance(cached, list):
            return cached
        shard = self.split.shards[s]
        try:
            if self.split.tables:
                assert self._sources_at is not None
                lo, hi = int(self._sources_at[s]), int(self._sources_at[s + 1])
                paths = decode_sources_chunk(self._bytes("sources", lo, hi), shard.samples)
            else:
                paths = decode_sources(shard.table("sources") or "", shard.samples)
        except ValueError as e:
            raise self.bad("sources", f"shard {shard.name}'s paths are not what they must be ({e})") from None
        return self._keep("sources", s, paths)

    def close(self) -> None:
        """Let go of the maps (views already handed out keep theirs alive)."""
        self._reset()

    # ---- how the entries are got ------------------------------------------------------------------

    def _entries(self, table: str, s: int) -> np.ndarray:
        """Shard ``s``'s entries of fixed-width table ``table``, unchecked."""
        lo, hi = int(self.first[s]), int(self.first[s + 1])
        column = self._column(table)
        if column is not None:
            return column[lo:hi]
        cached = self._cached(table, s)
        if isinstance(cached, np.ndarray):
            return cached
        if self.split.tables:  # a URL: the shard's range of the file
            data = self._bytes(table, lo * ENTRY.itemsize, hi * ENTRY.itemsize)
            if len(data) != (hi - lo) * ENTRY.itemsize:
                raise self.bad(
                    table,
                    f"{len(data)} bytes where shard {self.split.shards[s].name} has "
                    f"{hi - lo} entries of {ENTRY.itemsize}",
                )
            entries = np.frombuffer(data, dtype=ENTRY)
        else:  # format 1: base64 in the index (its size was checked by read_manifest)
            text = self.split.shards[s].table(_V1_NAME[table])
            if text is None:
                raise self.bad(table, f"shard {self.split.shards[s].name} has no such table")
            entries = np.frombuffer(decode_table(text), dtype=np.uint32).astype(ENTRY, copy=False)
        return self._keep(table, s, entries)

    def _column(self, table: str) -> np.ndarray | None:
        """The whole of a local format-2 table, mapped; None for format 1 or a URL."""
        if not self.split.tables or self.root is None:
            return None
        column = self._maps.get(table)
        if column is None:
            with self._lock:
                column = self._maps.get(table)
                if column is None:
                    mapped = self._map(table)
                    column = np.frombuffer(mapped, dtype=ENTRY) if mapped is not None else np.empty(0, ENTRY)
                    self._maps[table] = column
        assert isinstance(column, np.ndarray)
        return column

    def _map(self, table: str) -> mmap.mmap | None:
        """Table ``table``'s file, checked against its entry's size and mapped read-only (None if empty)."""
        entry = self.split.tables[table]
        assert self.root is not None
        path = self.root / entry.name
        try:
            with open_regular(path, inside=self.root) as f:
                size = os.fstat(f.fileno()).st_size
                if size != entry.bytes:
                    raise self.bad(table, f"{path} is {size:,} bytes where the index says {entry.bytes:,}")
                return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else None
        except FileNotFoundError:
            raise ManifestError(
                f"{path} is missing: the dataset at {self.where} was re-packed or re-indexed after this "
                "index was read (its tables are named by their content), or a file was deleted; open the "
                f"dataset again, or run `imgshards verify {self.where}`"
            ) from None
        except UnsafeFileError as e:
            raise ManifestError(f"{e}; re-pack the dataset") from None
        except OSError as e:
            raise ManifestError(f"cannot read {path}: {e.strerror or e}") from e

    def _bytes(self, table: str, lo: int, hi: int) -> bytes:
        """Bytes ``[lo, hi)`` of table ``table``'s file (format 2): mapped, or fetched from the URL."""
        entry = self.split.tables[table]
        if not 0 <= lo <= hi <= entry.bytes:
            raise self.bad(table, f"bytes {lo}..{hi} of a file of {entry.bytes}")
        if lo == hi:
            return b""
        if self.root is not None:
            mapped = self._maps.get(table)
            if mapped is None:
                with self._lock:
                    mapped = self._maps.get(table) or self._map(table)
                    assert mapped is not None  # a file of more than hi > 0 bytes
                    self._maps[table] = mapped
            return bytes(mapped[lo:hi])
        if self.fetch is None:
            raise ManifestError(f"{self.where}: no way to read table {table} (neither a directory nor a URL)")
        return self.fetch(entry, lo, hi)

    def _cached(self, table: str, s: int) -> np.ndarray | list[str] | None:
        cache = self._cache.get(table)
        if cache is None or s not in cache:
            return None
        cache.move_to_end(s)
        return cache[s]

    def _keep(self, table: str, s: int, value: _Kept) -> _Kept:
        cache = self._cache.setdefault(table, OrderedDict())
        cache[s] = value
        while len(cache) > _CACHED_SHARDS:
            cache.popitem(last=False)
        return value

    def _seen(self, table: str, s: int) -> bool:
        return bool(self._checked_all(table)[s])

    def _checked_all(self, table: str) -> bytearray:
        checked = self._checked.get(table)
        if checked is None:
            checked = self._checked[table] = bytearray(len(self.split.shards))
        return checked

    def bad(self, table: str, what: str) -> ManifestError:
        """The error for table ``table`` found not to be what its index says (``what``)."""
        entry = self.split.tables.get(table) if self.split.tables else None
        name = entry.name if entry is not None else f"the {_V1_NAME[table]} tables in its index.json"
        return ManifestError(
            f"{self.where}: table {table} of split {self.split.name!r} ({name}) is not what its index says: "
            f"{what}; run `imgshards verify {self.where}`, and re-pack or re-index the dataset"
        )
