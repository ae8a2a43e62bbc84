"""A minimal, deterministic POSIX ustar writer for WebDataset shards.

Every member is a regular file with mode 0644, owner 0:0 with empty user and group names, and
mtime 0, so the same samples give byte-identical shards on any machine. The headers are exactly what
``tarfile`` writes for such members in ``USTAR_FORMAT`` (a test holds it to that), built from a
template because ``TarInfo.tobuf`` costs more than the copy of a small image.
"""

from __future__ import annotations

import hashlib
from typing import BinaryIO

__all__ = ["BLOCK", "END_AT_MOST", "RECORD", "TarWriter", "member_size"]

BLOCK = 512
RECORD = BLOCK * 20  # tar archives are padded to whole records, as GNU tar and tarfile do
# The most the end of an archive adds past its members (which end on a block): two zero blocks,
# then padding to a whole record. A shard's size cap counts its members; its file may be this larger.
END_AT_MOST = 2 * BLOCK + RECORD - BLOCK


def _template() -> bytearray:
    header = bytearray(BLOCK)
    header[100:108] = b"0000644\x00"  # mode
    header[108:116] = b"0000000\x00"  # uid
    header[116:124] = b"0000000\x00"  # gid
    header[136:148] = b"00000000000\x00"  # mtime
    header[156:157] = b"0"  # typeflag: regular file
    header[257:265] = b"ustar\x0000"  # magic and version
    # uname, gname, devmajor, devminor and prefix stay NUL, as tarfile leaves them for regular files
    return header


_TEMPLATE = bytes(_template())
_PADDING = bytes(BLOCK)
# Only the name, size and checksum vary between members: the checksum is the template's byte sum
# (with the checksum field counted as eight spaces) plus that of the name and the size digits.
_BASE_SUM = sum(_TEMPLATE) + 8 * ord(" ")
_HEAD, _MIDDLE, _TAIL = _TEMPLATE[100:124], _TEMPLATE[136:148], _TEMPLATE[156:]


def member_size(nbytes: int) -> int:
    """Bytes one member of ``nbytes`` takes in the archive: header plus padded data."""
    return BLOCK + -(-nbytes // BLOCK) * BLOCK


def _header(name: bytes, size: int) -> bytes:
    if len(name) > 100:
        raise ValueError(f"tar member name longer than 100 bytes: {name!r}")
    if size >= 8**11:
        raise ValueError(f"tar member {name!r} of {size} bytes is over ustar's 8 GiB limit")
    size_field = b"%011o" % size
    checksum = _BASE_SUM + sum(name) + sum(size_field)
    return b"".join(
        (name, bytes(100 - len(name)), _HEAD, size_field, b"\0", _MIDDLE, b"%06o\0 " % checksum, _TAIL)
    )


class TarWriter:
    """Append members to a binary stream, keeping the running size and SHA-256 of what was written.

    Members are gathered into ~1 MiB writes: one write and one hash update per small image would
    cost more than the image (and hand the GIL back and forth with the reading threads).
    """

    _FLUSH_AT = 1 << 20

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._sha = hashlib.sha256()
        self._parts: list[bytes] = []
        self._pending = 0
        self.size = 0

    def _write(self, data: bytes) -> None:
        self._parts.append(data)
        self._pending += len(data)
        self.size += len(data)
        if self._pending >= self._FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Write out the gathered members."""
        data = b"".join(self._parts)
        self._stream.write(data)
        self._sha.update(data)
        self._parts.clear()
        self._pending = 0

    def add(self, name: str, data: bytes) -> None:
        """Append a regular file member ``name`` holding ``data``."""
        self.add_many([(name, data)])

    def add_many(self, members: list[tuple[str, bytes]]) -> None:
        """Append several members (the members of one sample)."""
        parts, added = self._parts, 0
        for name, data in members:
            size = len(data)
            pad = -size % BLOCK
            parts += (_header(name.encode("ascii"), size), data, _PADDING[:pad])
            added += BLOCK + size + pad
        self.size += added
        self._pending += added
        if self._pending >= self._FLUSH_AT:
            self.flush()

    def close(self) -> str:
        """Write the end-of-archive blocks and padding; return the archive's SHA-256 hex digest."""
        end = self.size + 2 * BLOCK
        self._write(bytes(2 * BLOCK + (-end) % RECORD))
        self.flush()
        return self._sha.hexdigest()
