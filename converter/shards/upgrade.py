"""``index --upgrade``: rewrite a format-1 index as format 2, reading and touching no shard.

Format 1 held every shard's tables inside ``index.json`` (base64); format 2 keeps them in files
named by their content beside the shards (:mod:`..format.tablefiles`). The upgrade writes each
split's tables as files from the index alone (:func:`~..write.tablefiles.as_format2`, a shard's
entries at a time), then the new index: locally under the index lock every writer takes
(:func:`~..write.destination.update_index`), at a URL uploaded as :func:`~..write.indexurl.write_index_url`
does (the table files first, ``index.json`` last). The tables are the bytes a pack of the same
shards writes. An index already of format 2 is left as it is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..format.errors import ManifestError
from ..format.locate import no_index
from ..format.manifest import FORMAT_VERSION, INDEX_NAME, Manifest, is_url, local_path, read_manifest
from ..format.remotefs import DEFAULT_TIMEOUT, Remote, with_timeouts
from ..write.destination import update_index
from ..write.indexurl import write_index_url

__all__ = ["UpgradeResult", "upgrade_index"]


@dataclass(frozen=True)
class UpgradeResult:
    """What :func:`upgrade_index` found and wrote.

    Attributes:
        root: The dataset (a directory, or its URL).
        version: The format of the index it found (``FORMAT_VERSION``: nothing was written).
        manifest: The index as it is now.

    """

    root: Path | str
    version: int
    manifest: Manifest

    @property
    def changed(self) -> bool:
        """Whether the index was rewritten."""
        return self.version != self.manifest.version

    @property
    def table_files(self) -> int:
        """The table files the index names now."""
        return sum(len(split.tables) for split in self.manifest.splits.values())

    @property
    def table_bytes(self) -> int:
        """Their size in all."""
        return sum(t.bytes for split in self.manifest.splits.values() for t in split.tables.values())


def upgrade_index(
    dst: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None
) -> UpgradeResult:
    """Rewrite the format-1 index of ``dst`` (a directory or URL) as format 2; the shards are untouched.

    Raises:
        ManifestError: there is no index, or it cannot be read.
        DestinationError: the index cannot be written (at a URL: a write kept failing).
        SourceError: the new index would be refused by its readers (too large).

    """
    if is_url(dst):
        url = str(dst)
        options = with_timeouts(url, storage_options, DEFAULT_TIMEOUT)
        Remote(url, options).check()  # no credentials, no bucket: one line at once
        found = read_manifest(url, storage_options=options)
        if found.version == FORMAT_VERSION:
            return UpgradeResult(url.rstrip("/"), found.version, found)
        written = write_index_url(url, found, storage_options=options)
        return UpgradeResult(url.rstrip("/"), found.version, written)
    root = local_path(dst)
    found = read_manifest(root)  # one line where there is no index, before any lock is made
    if found.version == FORMAT_VERSION:
        return UpgradeResult(root, found.version, found)
    del found  # read again under the lock
    versions: list[int] = []

    def upgraded(current: Manifest | None) -> Manifest | None:
        if current is None:
            raise ManifestError(no_index(root / INDEX_NAME))
        versions.append(current.version)
        return None if current.version == FORMAT_VERSION else current  # as_format2 writes its tables

    manifest = update_index(root, upgraded)
    assert manifest is not None
    return UpgradeResult(root, versions[-1], manifest)
