"""A split's tables written as files (index format 2, :mod:`..format.tablefiles`), shard by shard.

Every writer of an index (``pack``, ``imgshards index``, their remote forms, ``imgshards index
--upgrade``) holds each shard's tables as its record or a format-1 index has them (base64 text,
:mod:`..format.tables`). :func:`write_tables` streams them into one file a table, a shard at a
time (never the split's tables whole in memory), each through a temporary name, fsynced, then
renamed to its content's name; :func:`stale_tables` lists the table files an index no longer
names, which the writer removes once its index is in place. The same shards give the same bytes
and names: packs stay byte-identical.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from ..format.errors import ManifestError, SourceError
from ..format.manifest import Manifest, ShardInfo, SplitInfo
from ..format.tablefiles import FIXED_TABLES, TableFile, table_file_name
from ..format.tables import decode_table
from .safefs import create, remove, rename

__all__ = ["TABLE_FILE", "as_format2", "remove_stale_tables", "stale_tables", "write_tables"]

# The name of any split's table file (what stale_tables looks for): <split>=<table>.<16 hex>.<suffix>
# (format.tablefiles.table_file_name), the split as an index may name it (format.validate).
TABLE_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*=(starts|labels|keys|sources)\.[0-9a-f]{16}\.(u32|zlib)")
_V1_NAME = {"starts": "offsets", "labels": "labels", "keys": "keys", "sources": "sources"}
_WRITE_BUFFER = 1 << 20


def write_tables(root: Path, split: SplitInfo, *, safe_root: Path | None = None) -> SplitInfo:
    """``split`` with the tables its shards hold (format 1's form) written as files in ``root``.

    A table is written when every shard of the split has it, and left out otherwise (readers then
    read the shards). Returns the split as format 2 has it: its shards without inline tables (each
    with its ``sources_bytes`` where there is a sources table), its ``tables`` naming the files.
    ``safe_root``: the destination whose directories are walked without following a link
    (:mod:`.safefs`); None trusts ``root``.

    Raises:
        ValueError: a shard's table is not base64 of what it must be (a writer's own tables are).

    """
    if split.tables:  # already format 2
        return split
    shards = split.shards
    tables: dict[str, TableFile] = {}
    sizes: list[int] | None = None
    for table in (*FIXED_TABLES, "sources"):
        if not shards or any(s.table(_V1_NAME[table]) is None for s in shards):
            continue
        if table == "sources":
            tables[table], sizes = _write(root, split.name, table, shards, _sources_chunk, safe_root)
        else:
            tables[table], _ = _write(root, split.name, table, shards, _fixed(table), safe_root)
    return replace(
        split,
        shards=tuple(
            replace(s.without_tables(), sources_bytes=None if sizes is None else sizes[i])
            for i, s in enumerate(shards)
        ),
        tables=tables,
    )


def as_format2(root: Path, manifest: Manifest, *, safe_root: Path | None = None) -> Manifest:
    """``manifest`` as format 2 writes it: each split's format-1 tables written as files in ``root``.

    What every writer of an index calls on what it is about to write: its own split (a pack's
    records, the shards ``imgshards index`` read) and the other splits it keeps from the index
    already there, which a format-1 index holds inline (never read from a shard). A split already
    in format 2 is kept as it is. Each split is turned as :func:`write_tables` turns it, a shard at
    a time; the manifest returned holds no format-1 table.
    """
    splits = {name: write_tables(root, split, safe_root=safe_root) for name, split in manifest.splits.items()}
    return Manifest(manifest.classes, splits)


def index_to_write(root: Path, manifest: Manifest, where: str, *, safe_root: Path | None = None) -> Manifest:
    """:func:`as_format2` of ``manifest``, checked as its readers will read it: what a writer commits.

    ``where`` names the index in the error. Every writer of an index (local, at a URL) calls it
    last, so an index too large or malformed for ``info``, ``verify`` and the loader is never
    committed after hours of packing.

    Raises:
        SourceError: a reader would refuse the index; nothing was written to it.

    """
    written = as_format2(root, manifest, safe_root=safe_root)
    try:
        written.check_readable(where)
    except ManifestError as e:
        raise SourceError(
            str(e).removesuffix("; re-pack the dataset") + "; nothing was written to the index"
        ) from None
    return written


def stale_tables(root: Path, manifest: Manifest) -> list[Path]:
    """The table files in ``root`` that ``manifest`` (the index now in place) does not name."""
    named = {name for split in manifest.splits.values() for name in split.table_names}
    return sorted(p for p in root.iterdir() if TABLE_FILE.fullmatch(p.name) and p.name not in named)


def remove_stale_tables(root: Path, manifest: Manifest) -> None:
    """Remove what :func:`stale_tables` lists (never through a link)."""
    for path in stale_tables(root, manifest):
        remove(path, root=root)


def _fixed(table: str) -> Callable[[ShardInfo], bytes]:
    """A shard's entries of fixed-width table ``table``, little-endian, from format 1's base64."""

    def chunk(shard: ShardInfo) -> bytes:
        entries = decode_table(shard.table(_V1_NAME[table]) or "")  # native order
        if len(entries) != shard.samples:
            raise ValueError(
                f"shard {shard.name}: {len(entries)} {table} entries for {shard.samples} samples"
            )
        if sys.byteorder == "big":
            entries.byteswap()
        return entries.tobytes()

    return chunk


def _sources_chunk(shard: ShardInfo) -> bytes:
    """The shard's sources stream: format 1 held the same zlib stream, in base64."""
    return base64.b64decode((shard.table("sources") or "").encode("ascii"), validate=True)


def _write(
    root: Path,
    split: str,
    table: str,
    shards: Sequence[ShardInfo],
    chunk: Callable[[ShardInfo], bytes],
    safe_root: Path | None,
) -> tuple[TableFile, list[int]]:
    """Table ``table`` of ``split``, a chunk a shard, written to its content's name; and each chunk's size."""
    tmp = root / f".{split}.{table}.partial"
    digest = hashlib.sha256()
    sizes: list[int] = []
    try:
        with create(tmp, root=safe_root, buffering=_WRITE_BUFFER) as f:
            for shard in shards:
                data = chunk(shard)
                f.write(data)
                digest.update(data)
                sizes.append(len(data))
            f.flush()
            os.fsync(f.fileno())
        sha = digest.hexdigest()
        name = table_file_name(split, table, sha)
        rename(tmp, name, root=safe_root)
    except BaseException:
        remove(tmp, root=safe_root or root)
        raise
    return TableFile(name, sum(sizes), sha), sizes
