"""Write a dataset's index at a URL: its table files, ``_info.json``, then ``index.json``, as a pack ends.

The upload (:mod:`..remote.upload`), which runs a whole pack, ends with :func:`put_index`; ``index``
and ``index --upgrade`` (:mod:`..shards`) write the index of shards already at a URL with this alone.
The table files (index format 2, :mod:`..format.tablefiles`) are written into a local directory
first (:func:`~.tablefiles.as_format2`) and uploaded from there before the index that names them,
so a reader never follows the index to a table that is not whole; the table files the new index no
longer names are removed once it is up. There is no lock at a URL: write one split into it at a
time. Here, in write/, beside the local index's one writer (:func:`~.destination.update_index`):
the shards stage (``index``, ``upgrade``) writes through it.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..format.errors import DestinationError
from ..format.manifest import INDEX_NAME, TIMM_INFO_NAME, Manifest
from ..format.remotefs import DEFAULT_TIMEOUT, Remote, with_timeouts
from .tablefiles import TABLE_FILE, index_to_write

__all__ = ["put_index", "write_index_url"]


def write_index_url(
    url: str, manifest: Manifest, *, storage_options: Mapping[str, Any] | None = None
) -> Manifest:
    """Write ``manifest`` at ``url`` as :func:`put_index` does, its format-1 tables first made files.

    The table files are written into a temporary local directory (a few bytes a sample), uploaded,
    then removed. Returns the index as written (format 2).

    Raises:
        SourceError: the index would be refused by its readers (too large): nothing was written.
        DestinationError: a write kept failing.

    """
    remote = Remote(url, with_timeouts(url, storage_options, DEFAULT_TIMEOUT))
    with tempfile.TemporaryDirectory(prefix="imgshards-tables-") as tmp:
        written = index_to_write(Path(tmp), manifest, f"the index of {remote.shown}")
        del manifest  # its format-1 tables, if any: no longer needed
        put_index(remote, written, Path(tmp))
    return written


def put_index(remote: Remote, manifest: Manifest, tables: Path) -> None:
    """Upload the index ``manifest`` (format 2) to ``remote``, each file whole or not at all.

    In this order: each table file it names that the URL lacks (or holds at another size), from the
    local directory ``tables``; ``_info.json``; ``index.json``; then the removal of the table files
    at the URL that it no longer names.

    Raises:
        DestinationError: a write kept failing, or a table file is neither at the URL nor in ``tables``.

    """
    there = remote.sizes()
    named = set()
    for split in manifest.splits.values():
        for entry in split.tables.values():
            named.add(entry.name)
            if there.get(entry.name) == entry.bytes:  # named by its content: the same file
                continue
            local = tables / entry.name
            if not local.is_file():
                raise DestinationError(
                    f"table file {entry.name} of split {split.name!r} is neither at {remote.shown} nor in "
                    f"{tables}; run the same command again"
                )
            remote.put_file(local, entry.name)
    remote.put_bytes(TIMM_INFO_NAME, (json.dumps(manifest.timm_info(), indent=1) + "\n").encode())
    remote.put_bytes(INDEX_NAME, manifest.dumps().encode())
    remote.remove(sorted(n for n in remote.sizes() if TABLE_FILE.fullmatch(n) and n not in named))
    # That listing is of a moment: a file system that caches listings (s3fs) would later open a file
    # changed since with the size and ETag it lists (s3fs: FileExpired), in this process.
    remote.fs.invalidate_cache(remote.root)
