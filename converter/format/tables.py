"""A shard's tables in the index: where each sample starts, its class id, its key, its source.

``pack`` writes four tables beside each shard in ``index.json`` (``imgshards index`` writes them
for another tool's shards as it reads them), one entry per sample in stored order:

- ``"offsets"``: the 512-byte block where the sample's first tar header is (shards up to 2 TiB). A
  worker of the loader whose run starts inside a shard seeks there instead of stepping over the tar
  headers of the samples before it (about 15 us each); the map-style ``ImageFolder`` reads a sample
  from its start to the next one's with one ``pread``.
- ``"labels"``: the sample's class id, so ``ImageFolder.targets`` opens no shard.
- ``"keys"``: the CRC-32 of the sample's key (:func:`key_digest`), so a read by position can tell
  that what it found at that start is the sample the index names, not a neighbour.
- ``"sources"``: the sample's source path, relative to the packed tree (``cat/0001.jpg``; for
  another tool's shards, the image member's name): ``ImageFolder.samples``.

The first three are base64 of little-endian 32-bit unsigned integers; ``sources`` is base64 of the
zlib-compressed UTF-8 paths, each ended by a NUL (a path holds none). A table may be missing (an
index written before it, or by another tool): readers then read the shard instead. A shard of no
samples has empty tables, ``""``, which is not a missing one.

The tables are untrusted like the rest of the index: the ``*_problem`` functions check each before
any of it is used (one entry per sample; starts increasing and inside the shard, the first not
always 0: another tool's shard may hold a member before its first sample; class ids below the
class count; the sources' sizes bounded, compressed and not), and a read still checks the tar
headers it finds at a start.

Standard library only, as :mod:`.manifest`, which holds them.
"""

from __future__ import annotations

import base64
import binascii
import operator
import sys
import zlib
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

__all__ = [
    "BLOCK",
    "ENTRY_BYTES",
    "FIXED_TABLES",
    "MAX_SOURCE_BYTES",
    "TABLES",
    "TableFile",
    "decode_sources",
    "decode_table",
    "encode_sources",
    "encode_table",
    "key_digest",
    "keys_problem",
    "labels_problem",
    "max_sources_bytes",
    "offsets_problem",
    "sources_problem",
]

BLOCK = 512
MAX_SOURCE_BYTES = 4096  # a source path longer than PATH_MAX is no path this tree held
TABLES = ("offsets", "labels", "keys", "sources")  # a shard's tables, in the index's order
# Format 2 (.tablefiles) keeps the same tables in files, here for validate, which checks both
# formats' indexes: the fixed-width ones ("starts", format 1's "offsets") of ENTRY_BYTES an entry.
FIXED_TABLES = ("starts", "labels", "keys")
ENTRY_BYTES = 4
_ITEM = "I" if array("I").itemsize == 4 else "L"  # 32 bits: "I" on every platform CPython runs on


@dataclass(frozen=True)
class TableFile:
    """One table file of a split (format 2, :mod:`.tablefiles`), as ``index.json`` names it.

    Its name at the dataset's root, size and sha256. Here, beside the tables' names, for
    :mod:`.manifest`, which reads it from the index, and :mod:`.tablefiles`, which reads the file.
    """

    name: str
    bytes: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form written into the index."""
        return {"file": self.name, "bytes": self.bytes, "sha256": self.sha256}


def encode_table(values: Sequence[int]) -> str:
    """The index form of a table of 32-bit entries: sample starts (in blocks), class ids, key digests."""
    table = array(_ITEM, values)
    if sys.byteorder == "big":
        table.byteswap()
    return base64.b64encode(table.tobytes()).decode("ascii")


def decode_table(text: str) -> array[int]:
    """The table of 32-bit entries that :func:`encode_table` wrote.

    Raises:
        ValueError: ``text`` is not base64 of whole 32-bit entries.

    """
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise ValueError(f"not base64: {e}") from None
    if len(raw) % 4:
        raise ValueError(f"{len(raw)} bytes, not whole 4-byte entries")
    table = array(_ITEM)
    table.frombytes(raw)
    if sys.byteorder == "big":
        table.byteswap()
    return table


def max_sources_bytes(samples: int) -> int:
    """The most a shard's sources stream of ``samples`` paths may be (zlib's worst case, bounded paths)."""
    raw = samples * (MAX_SOURCE_BYTES + 1)
    return raw + raw // 1000 + 64


def key_digest(key: str) -> int:
    """The ``"keys"`` entry of a sample key: the CRC-32 of its UTF-8 bytes (a name's odd bytes as read)."""
    return zlib.crc32(key.encode("utf-8", "surrogateescape"))


def encode_sources(paths: Iterable[str]) -> str:
    """The index form of a shard's source paths (see the module docstring)."""
    raw = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def decode_sources(text: str, samples: int) -> list[str]:
    """The ``samples`` source paths :func:`encode_sources` wrote, inflating no more than they may hold.

    Raises:
        ValueError: not base64 of zlib data, more than ``samples`` paths' worth of bytes, or another count.

    """
    if not text and not samples:  # a shard of no samples: its tables may be empty
        return []
    try:
        packed = base64.b64decode(text.encode("ascii"), validate=True)
        inflate = zlib.decompressobj()
        raw = inflate.decompress(packed, samples * (MAX_SOURCE_BYTES + 1) + 1)
    except (binascii.Error, UnicodeEncodeError, zlib.error) as e:
        raise ValueError(f"not base64 of zlib data: {e}") from None
    if inflate.unconsumed_tail or not inflate.eof:
        raise ValueError(f"more than {samples} paths of at most {MAX_SOURCE_BYTES} bytes, or cut short")
    if raw and not raw.endswith(b"\0"):
        raise ValueError("paths not each ended by a NUL")
    paths = raw.decode("utf-8", "surrogateescape").split("\0")[:-1]  # a NUL is no byte of a longer character
    if len(paths) != samples:
        raise ValueError(f"one path per sample ({samples}), not {len(paths)}")
    if paths and (min(map(len, paths)) == 0 or max(map(len, paths)) > MAX_SOURCE_BYTES):
        raise ValueError(f"a path empty or over {MAX_SOURCE_BYTES} characters")
    return paths


def _table(text: object, samples: int) -> tuple[array[int] | None, str | None]:
    """A 32-bit table of ``samples`` entries, or what is wrong with it."""
    if not isinstance(text, str):
        return None, "a base64 string"
    if len(text) > 8 * samples + 8:  # checked before decoding: base64 of 4 bytes a sample is ~5.3
        return None, f"base64 of {samples} 4-byte entries (one per sample)"
    try:
        table = decode_table(text)
    except ValueError as e:
        return None, f"base64 of 4-byte entries ({e})"
    if len(table) != samples:
        return None, f"one entry per sample ({samples}), not {len(table)}"
    return table, None


def offsets_problem(text: object, samples: int, size: int) -> str | None:
    """What is wrong with a shard's ``"offsets"`` for ``samples`` samples of ``size`` bytes; None: nothing."""
    table, problem = _table(text, samples)
    if table is None:
        return problem
    blocks = size // BLOCK
    # Strictly increasing (each entry below the next, compared in C), so the last is the largest.
    if samples and (table[-1] >= blocks or any(map(operator.ge, table, islice(table, 1, None)))):
        return f"strictly increasing block numbers below the shard's {blocks} blocks"
    return None


def labels_problem(text: object, samples: int, classes: int) -> str | None:
    """What is wrong with a shard's ``"labels"`` (``samples`` samples, ``classes`` classes); None: nothing."""
    table, problem = _table(text, samples)
    if table is None:
        return problem
    if samples and max(table) >= classes:
        return f"class ids below the index's {classes} classes"
    return None


def keys_problem(text: object, samples: int) -> str | None:
    """What is wrong with a shard's ``"keys"`` for ``samples`` samples; None: nothing."""
    return _table(text, samples)[1]


def sources_problem(text: object, samples: int) -> str | None:
    """What is wrong with a shard's ``"sources"``, as far as can be told without inflating it; None: nothing.

    :func:`decode_sources` checks the rest (the count, each path's size) where the paths are used.
    """
    if not isinstance(text, str):
        return "a base64 string"
    # zlib stores at worst ~1.0003x its input, and every path is at most MAX_SOURCE_BYTES.
    if len(text) > 4 * (samples * (MAX_SOURCE_BYTES + 1) // 2 + 64) // 3 + 8:
        return f"base64 of the zlib-compressed paths of {samples} samples"
    return None
