"""A minimal, deterministic POSIX ustar writer for WebDataset shards.

Every member is a regular file with mode 0644, owner 0:0 with empty user and group names, and
mtime 0, so the same samples give byte-identical shards on any machine. The headers are exactly what
``tarfile`` writes for such members in ``USTAR_FORMAT`` (a test holds it to that), built from a
template because ``TarInfo.tobuf`` costs more than the copy of a small image.
"""

from __future__ import annotations

import hashlib
from typing import BinaryIO

__all__ = ["BLOCK", "RECORD", "TarWriter", "member_size"]

BLOCK = 512
RECORD = BLOCK * 20  # tar archives are padded to whole records, as GNU tar and tarfile do


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


def member_size(nbytes: int) -> int:
    """Bytes one member of ``nbytes`` takes in the archive: header plus padded data."""
    return BLOCK + -(-nbytes // BLOCK) * BLOCK


def _header(name: bytes, size: int) -> bytes:
    if len(name) > 100:
        raise ValueError(f"tar member name longer than 100 bytes: {name!r}")
    if size >= 8**11:
        raise ValueError(f"tar member {name!r} of {size} bytes is over ustar's 8 GiB limit")
    header = bytearray(_TEMPLATE)
    header[: len(name)] = name
    header[124:136] = b"%011o\x00" % size
    # The checksum is the byte sum with the checksum field itself read as eight spaces.
    header[148:156] = b"%06o\x00 " % (sum(header) + 8 * 32)
    return bytes(header)


class TarWriter:
    """Append members to a binary stream, keeping the running size and SHA-256 of what was written."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._sha = hashlib.sha256()
        self.size = 0

    def _write(self, data: bytes) -> None:
        self._stream.write(data)
        self._sha.update(data)
        self.size += len(data)

    def add(self, name: str, data: bytes) -> None:
        """Append a regular file member ``name`` holding ``data``."""
        self._write(_header(name.encode("ascii"), len(data)))
        self._write(data)
        if len(data) % BLOCK:
            self._write(_PADDING[: BLOCK - len(data) % BLOCK])

    def close(self) -> str:
        """Write the end-of-archive blocks and padding; return the archive's SHA-256 hex digest."""
        end = self.size + 2 * BLOCK
        self._write(bytes(2 * BLOCK + (-end) % RECORD))
        return self._sha.hexdigest()
