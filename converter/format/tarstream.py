r"""The one tar member parser: ``index``, ``verify`` and the loader read shards through it.

Not ``tarfile``: its stream mode reads in 10 KiB Python-level chunks and parses every header field in
Python, and what it accepts is not what a WebDataset reader should accept from an untrusted shard
(sparse members made regular, sizes unbounded, names cut at a NUL). :class:`TarStream` reads one
header with one ``read``, checks its checksum, hands out the member's data with one ``read``, and
steps over what the caller does not want with ``seek`` (or, on a stream that is hashed, by reading).

What it reads, and what it refuses (:class:`~.errors.ShardFormatError`, which ends the shard):

- ustar, GNU and pax headers: a pax ``path`` or ``size``, a GNU long name (``L``) or link (``K``),
  a ustar ``prefix`` (POSIX magic only: GNU headers keep times there);
- one cap on every extended header (pax ``x``/``g``, GNU ``L``/``K``): :data:`MAX_EXTENDED_HEADER`;
- sparse members (GNU ``S``, pax ``GNU.sparse.*``): refused, their data is not the file;
- Solaris extended headers (``X``), which some readers apply as pax headers and others skip: refused;
- a NUL inside a member name (it would rename the member for some readers and not others): refused;
- a size past the end of the shard, a bad checksum, a number field that is not a number: refused;
- a hard or symbolic link, device, FIFO or directory that declares data: refused.

Regular members (types ``0``, ``\\0``, ``7``) are yielded as ``(name, size)``; every other member
(directories, links, GNU volume headers...) is stepped over.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from .errors import ShardEndError, ShardFormatError

__all__ = ["BLOCK", "MAX_EXTENDED_HEADER", "TarStream", "stream_end"]

BLOCK = 512
MAX_EXTENDED_HEADER = 1 << 20  # the one cap on a pax header or GNU long name: a path and a few keywords
# Type flags, as the header's byte 156 (an int).
_REGULAR = frozenset(b"0\x007")
_EXTENDED = frozenset(b"xgLK")
_NO_DATA = frozenset(b"123456")  # links, devices, FIFOs, directories
_SPARSE = ord("S")
_SOLARIS = ord("X")
_ENDS = (0, 32)  # a number field's end: NUL or space
_OCTAL = b"01234567"
_SKIP_CHUNK = 1 << 20


class TarStream:
    """The regular members of one tar stream, in stored order.

    Iterate it for ``(name, size)`` of each regular member; :meth:`data` then reads that member's
    data. A member whose data is not read is stepped over when the next one is asked for.

    Args:
        f: The shard, opened for binary reading at its start (or at ``offset``).
        end: The shard's size, if known: every declared size is checked against it before it is
            used (nothing is allocated or skipped past the shard's real end).
        seekable: Step over unread data with ``seek``; else read it (a stream that hashes what it
            reads must see every byte).
        offset: Where ``f`` stands in the shard: a header's start, such as a sample's from the
            index's table of sample starts.

    """

    __slots__ = ("_f", "_left", "_read", "_seekable", "_size", "end", "ended", "member_start", "offset")

    def __init__(
        self, f: BinaryIO, *, end: int | None = None, seekable: bool = True, offset: int = 0
    ) -> None:
        self._f = f
        self._read = f.read
        self._seekable = seekable
        self.end = end
        self.offset = offset  # where the stream is in the shard (counted here, never asked of f)
        self.ended = False  # the end-of-archive block was read
        self.member_start = offset  # where the member yielded last starts: its first header (pax too)
        self._size = 0  # the current member's data bytes
        self._left = 0  # bytes of the current member (data and padding) not consumed yet

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return self._members()

    def data(self) -> bytes:
        """The current member's data, all of it, read once (the stream moves past its padding).

        What ``f.read`` returns: ``bytes`` from a file, a ``memoryview`` for a large member of the
        loader's mapped shards (``imgshards.loader.pipeline.runs.MappedShard``).
        """
        size = self._size
        if self._left != size + (-size % BLOCK):
            raise RuntimeError("a tar member's data is read twice")  # a caller's bug, not the shard's
        data = self._read(size)
        if len(data) != size:
            raise ShardFormatError(f"a tar member of {size} bytes is cut short")
        self.offset += size
        self._left -= size
        if self._left:
            self._step(self._left)
        return data

    def _step(self, n: int) -> None:
        """Move ``n`` bytes on (the rest of the current member)."""
        self._left = 0
        self.offset += n
        if self._seekable:
            self._f.seek(n, 1)
            return
        while n:
            chunk = self._read(min(n, _SKIP_CHUNK))
            if not chunk:
                raise ShardFormatError("a tar member is cut short")
            n -= len(chunk)

    def _members(self) -> Iterator[tuple[str, int]]:
        # The hot path of the loader: one read a header, slices compared in C, no call for the common
        # case (an octal size, a checksum as "%06o\0 ", a plain name), the general parse otherwise.
        read, end, adler32 = self._read, self.end, zlib.adler32
        name: str | None = None  # from a pax header or GNU long name, for the next member
        size_override: int | None = None
        start = self.offset
        while True:
            if self._left:
                self._step(self._left)
            if name is None and size_override is None:  # not inside a member's extended headers
                start = self.offset
            header = read(BLOCK)
            self.offset += BLOCK
            if len(header) < BLOCK:
                self.offset += len(header) - BLOCK
                if header:
                    raise ShardFormatError("a tar header is cut short")
                if name is not None or size_override is not None:
                    raise ShardFormatError("the shard ends after an extended tar header")
                return  # no end-of-archive blocks: a shard cut at a member boundary (counts tell)
            # The byte sum with the checksum field as spaces. Adler-32's low half, from a zero start,
            # is the byte sum mod 65521: exact for 256 bytes (at most 65,280), and 4x faster than sum().
            field = header[148:156]
            total = (
                (adler32(header[:256], 0) & 0xFFFF) + (adler32(header[256:], 0) & 0xFFFF) - sum(field) + 256
            )
            digits = field[:6]  # the common form first: "%06o\0 " (the general parse otherwise)
            try:  # 8 or 9 among the digits: a ValueError, then the general parse says what is wrong
                fast = field[6] in _ENDS and digits.isdigit() and int(digits, 8) == total
            except ValueError:
                fast = False
            if not fast and total != _number(field, "checksum"):
                if header.count(0) != BLOCK:
                    raise ShardFormatError("a tar header has a bad checksum")
                if name is not None or size_override is not None:
                    raise ShardFormatError("the shard ends after an extended tar header")
                self.ended = True
                return  # end of archive
            kind = header[156]
            digits = header[124:135]
            try:  # 11 digits and an end (12 digits are the general parse's)
                fast_size = header[135] in _ENDS and digits.isdigit()
                size = int(digits, 8) if fast_size else _number(header[124:136], "size")
            except ValueError:
                size = _number(header[124:136], "size")  # raises, naming the field
            if size_override is not None and kind not in _EXTENDED:
                size = size_override  # a pax size: for numbers past the header field's 8 GiB
            if end is not None and size > end - self.offset:
                what = name if name is not None else _text(header[:100].split(b"\0", 1)[0])
                raise ShardEndError(
                    f"member {what!r} declares {size} bytes, more than the shard has left "
                    f"({end - self.offset})",
                    member=what,
                    declared=size,
                )
            self._size, self._left = size, size + (-size % BLOCK)
            if kind in _EXTENDED:
                name, size_override = self._extended(kind, size, name, size_override)
                continue
            if name is None:
                raw = header[:100].rstrip(b"\0")
                if b"\0" in raw or (header[345] and header[257:263] == b"ustar\0"):
                    name = _header_name(header)  # a NUL inside (refused), or a ustar prefix
                else:
                    name = raw.decode("utf-8", "surrogateescape")
            if kind in _REGULAR:
                self.member_start = start
                yield name, size
            elif kind == _SPARSE:
                raise ShardFormatError(f"member {name!r} is a GNU sparse file: not read")
            elif kind == _SOLARIS:  # a pax header to tarfile, and to other readers nothing
                raise ShardFormatError("a Solaris extended header (type X): not read")
            elif size and kind in _NO_DATA:
                raise ShardFormatError(
                    f"member {name!r} is a link, device or directory declaring {size} bytes"
                )
            name, size_override = None, None

    def _extended(
        self, kind: int, size: int, name: str | None, size_override: int | None
    ) -> tuple[str | None, int | None]:
        """Read a pax header or GNU long name: what it says of the next member (name, size)."""
        if size > MAX_EXTENDED_HEADER:
            raise ShardFormatError(
                f"an extended tar header ({chr(kind)}) declares {size} bytes, more than the "
                f"{MAX_EXTENDED_HEADER} imgshards reads"
            )
        data = bytes(self.data())  # bytes even from a file that hands out views (the loader's mapped shards)
        if kind == ord("L"):
            return _text(_no_nul(data.rstrip(b"\0"), "a GNU long name")), size_override
        if kind == ord("x"):
            return _pax(data, name, size_override)
        if kind == ord("g"):
            _pax(data, None, None, global_header=True)
        return name, size_override  # K: a GNU long link name, of no use here


def _header_name(header: bytes) -> str:
    name = _no_nul(header[:100].rstrip(b"\0"), "a member name")
    if header[257:263] == b"ustar\0":  # POSIX ustar: a prefix (GNU headers hold times there)
        prefix = _no_nul(header[345:500].rstrip(b"\0"), "a member name's prefix")
        if prefix:
            return _text(prefix + b"/" + name)
    return _text(name)


def _no_nul(name: bytes, what: str) -> bytes:
    if b"\0" in name:
        raise ShardFormatError(f"{what} holds a NUL byte: {name[:60]!r}")
    return name


def _number(field: bytes, what: str) -> int:
    """A header's number field: octal digits (space or NUL ended), or GNU base-256."""
    if field[:1] == b"\x80":  # GNU base-256 for big numbers (0xff, negative, is no size)
        return int.from_bytes(field[1:], "big")
    digits = field.rstrip(b"\0 ").lstrip(b" ")
    if digits.translate(None, _OCTAL):
        raise ShardFormatError(f"a tar header's {what} is not a number: {field!r}")
    return int(digits, 8) if digits else 0


def _pax(
    data: bytes, path: str | None, size: int | None, *, global_header: bool = False
) -> tuple[str | None, int | None]:
    r"""Apply a pax header's records (``"%d %s=%s\\n"``, the length counting the whole record)."""
    at = 0
    while at < len(data):
        if data[at] == 0:  # NUL padding after the records
            break
        space = data.find(b" ", at, at + 21)
        length = data[at:space]
        if space < 0 or not length.isdigit() or int(length) <= space - at:
            raise ShardFormatError("a pax header record is malformed")
        record_end = at + int(length)
        if record_end > len(data) or data[record_end - 1 : record_end] != b"\n":
            raise ShardFormatError("a pax header record is malformed")
        keyword, equals, value = data[space + 1 : record_end - 1].partition(b"=")
        if not equals:
            raise ShardFormatError("a pax header record is malformed")
        if keyword.startswith(b"GNU.sparse."):
            raise ShardFormatError("a pax header makes a sparse file (GNU.sparse.*): not read")
        if keyword in (b"path", b"size") and global_header:
            raise ShardFormatError(f"a global pax header sets {keyword.decode()} for every member")
        if keyword == b"path":
            path = _text(_no_nul(value, "a pax path"))
        elif keyword == b"size":
            if not value.isdigit() or len(value) > 20:
                raise ShardFormatError(f"a pax size is not a number: {value[:30]!r}")
            size = int(value)
        at = record_end
    return path, size


def _text(name: bytes) -> str:
    """A member name as text; bytes that are not UTF-8 are kept as surrogates (as ``tarfile`` does)."""
    return name.decode("utf-8", "surrogateescape")


def stream_end(f: BinaryIO) -> int | None:
    """The size of the shard ``f`` reads, as its file system says (None if it cannot say)."""
    try:
        return os.fstat(f.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        size = getattr(f, "size", None)  # fsspec's files
        return size if isinstance(size, int) else None
