"""Read a run of samples from one WebDataset tar shard as raw (undecoded) bytes.

A thin ustar reader, not ``tarfile``: ``tarfile``'s stream mode (what webdataset's
``tar_file_iterator`` opens shards with) reads in 10 KiB Python-level chunks and parses every header
field in Python, ~0.3 ms a sample here, a fifth of what decoding and augmenting the image costs.
This reader does one ``read`` per header and one ``readinto`` per kept member, checks each header's
checksum, steps over skipped members with ``seek`` (a run that starts deep in a shard costs no
reading), and stops at the run's end without reading the rest of the shard.

Members are grouped into samples as webdataset does (``base_plus_ext``: the key is the name up to the
first dot of its last path part, the extension the rest, lower-cased); the tests hold its output to
webdataset's reading of the same shard. Besides the ustar headers the converter writes, it reads pax
(``x``, ``g``) and GNU long-name (``L``) headers, so shards from webdataset's or GNU tar's writers
load too.

A shard is untrusted input: every member's declared size is checked against the bytes left in the
shard before anything is allocated or skipped, names that are not UTF-8 are read as bytes
(``surrogateescape``, as ``tarfile`` does), and a label that is not an integer in ``0..classes-1``
makes its sample corrupt (``on_corrupt``), never a label passed on.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Generator, Iterator, Mapping
from io import BufferedReader
from pathlib import Path
from typing import Any, BinaryIO, cast

from imgshards.converter.errors import ImgshardsError
from imgshards.converter.manifest import IMAGE_EXTENSIONS, LabelSource

from .errors import CorruptImageError, ShardReadError

__all__ = ["RawSample", "ShardFormatError", "image_member", "read_run", "sample_shard"]

_BLOCK = 512
_READ_BUFFER = 1 << 20
_IMAGE_EXTS = frozenset(IMAGE_EXTENSIONS)
_REGULAR = (b"0", b"\0", b"7")
_MAX_EXTENDED_HEADER = 1 << 20  # a pax or GNU long-name header: a path, a few keywords


class RawSample(dict[str, Any]):
    """One sample as webdataset has it, plus its label: a dict that webdataset's stages take as is.

    Keys: ``__key__``, ``__url__`` (the shard), one entry per member read (``jpg``, ``cls``...,
    ``bytes``), and ``__label__``, the class id as the split's index says. The attributes name what
    the loader uses: :attr:`key`, :attr:`ext` (the image member's extension), :attr:`data` (its
    bytes), :attr:`label` and :attr:`shard` (the shard's file name).
    """

    __slots__ = ("ext",)

    def __init__(self, members: Mapping[str, bytes], *, key: str, url: str, label: int, ext: str) -> None:
        super().__init__(members)
        self["__key__"], self["__url__"], self["__label__"] = key, url, label
        self.ext = ext

    @property
    def key(self) -> str:
        """The sample's key (the member names up to their extension)."""
        return str(self["__key__"])

    @property
    def data(self) -> bytes:
        """The image member's bytes."""
        return bytes(self[self.ext])

    @property
    def label(self) -> int:
        """The class id."""
        return int(self["__label__"])

    @property
    def shard(self) -> str:
        """The file name of the shard the sample is in."""
        return str(self["__url__"]).rsplit("/", 1)[-1]


def image_member(sample: Mapping[str, Any]) -> str:
    """The extension of a sample dict's image member (``jpg``, ``png``...); ``""`` if it has none.

    For any sample dict, a :class:`RawSample` or one a user's stage built.
    """
    ext = getattr(sample, "ext", None)
    if isinstance(ext, str) and ext in sample:
        return ext
    return next((e for e in IMAGE_EXTENSIONS if e in sample), "")


def sample_shard(sample: Mapping[str, Any]) -> str:
    """The file name of the shard a sample dict came from (``"?"`` if it does not say)."""
    return str(sample.get("__url__", "?")).rsplit("/", 1)[-1]


class ShardFormatError(Exception):
    """The shard ends early or holds something that is not a tar header where one should be."""


def read_run(
    path: str | Path,
    start: int,
    stop: int,
    *,
    on_truncated: Callable[[str], None] | None = None,
    opener: Callable[[], BinaryIO] | None = None,
    num_classes: int | None = None,
    on_corrupt: Callable[[CorruptImageError], None] | None = None,
    labels: LabelSource | None = None,
    class_to_idx: Mapping[str, int] | None = None,
    keep_all: bool = False,
) -> Iterator[RawSample]:
    """Yield samples ``[start, stop)`` of the shard at ``path``, in stored order.

    ``opener`` opens the shard (a remote one, see :class:`~imgshards.loader.remote.ShardSource`);
    without it ``path`` is a local file. The shard is opened at the first sample asked for.
    ``labels`` says which member holds a sample's label (the split's, from the index; default
    ``.cls``); ``class_to_idx`` maps class names to ids for labels that are names. Every member is
    read but ``.json`` (when the label is elsewhere), or every member with ``keep_all``.

    A shard that ends early (truncated, cut mid-member, or damaged) yields what it has before the
    damage; ``on_truncated`` (or a ``RuntimeWarning``) is told once, naming the shard and the sample
    it stopped at.

    A sample without one image and a label, or whose label is not an integer in
    ``0..num_classes-1``, goes to ``on_corrupt`` (raised without it) and the run goes on. A read
    error of the file is a :class:`~imgshards.loader.errors.ShardReadError`.
    """
    url, path = str(path), Path(path)
    expected, got, problem = stop - start, 0, ""
    readable = [0]  # complete samples the shard was seen to hold, counted by _samples
    with opener() if opener is not None else open(path, "rb", buffering=_READ_BUFFER) as f:
        labeled = _Labels(labels or LabelSource(), class_to_idx, num_classes, keep_all=keep_all)
        samples = _samples(cast(BufferedReader, f), start, stop, url, labeled, readable)
        try:
            for sample in samples:
                got += 1
                if isinstance(sample, CorruptImageError):
                    if on_corrupt is None:
                        raise sample
                    on_corrupt(sample)
                else:
                    yield sample
        except ShardFormatError as e:
            problem = f"; {e}"
        except OSError as e:
            if isinstance(e, ImgshardsError):
                raise
            raise ShardReadError(f"cannot read shard {path}: {e}", shard=path.name) from e
        finally:
            samples.close()
    if got < expected:
        held = start + got if got else readable[0]
        message = (
            f"shard {path.name} holds only {held} readable sample(s){problem}: {expected - got} of the "
            f"{expected} samples [{start}, {stop}) read here are lost (truncated or rewritten since it "
            "was packed); the epoch goes on without them"
        )
        if on_truncated is not None:
            on_truncated(message)
        else:
            warnings.warn(message, RuntimeWarning, stacklevel=2)


def _samples(
    f: BufferedReader, start: int, stop: int, url: str, labels: _Labels, readable: list[int]
) -> Generator[RawSample | CorruptImageError, None, None]:
    """Group the members of samples ``[start, stop)`` (adjacent in the tar) into raw samples.

    A sample that is not usable comes out as the error saying why, in its place. ``readable[0]``
    follows how many complete samples the shard was seen to hold (for the message about a damaged
    shard).
    """
    index, key = -1, None
    parts: dict[str, bytes] = {}
    exts: set[str] = set()  # of the current sample's members, read or stepped over
    end = f.seek(0, os.SEEK_END)  # members are checked against the bytes the shard really has
    f.seek(0)
    headers = _headers(f, end)
    while True:
        try:
            name, size = next(headers)
        except StopIteration:
            break
        except ShardFormatError:
            # The sample before the damage counts as whole if it had a label and an image (its
            # members' sizes were all checked against the shard's real size).
            complete = labels.member in exts and not _IMAGE_EXTS.isdisjoint(exts)
            readable[0] = index + 1 if complete else max(index, 0)
            if complete and parts:
                yield _to_raw(key, parts, url, labels)
            raise
        slash = name.rfind("/") + 1
        dot = name.find(".", slash)
        if dot < 0:  # no extension: not part of a sample (webdataset skips these too)
            _skip(f, size)
            continue
        member_key, ext = name[:dot], name[dot + 1 :].lower()
        if member_key != key:
            readable[0] = index + 1
            if parts:
                yield _to_raw(key, parts, url, labels)
                parts = {}
            key, index = member_key, index + 1
            exts = set()
            if index >= stop:
                return
        exts.add(ext)
        if index < start or ext in labels.skipped:
            _skip(f, size)
            continue
        data = f.read(size)  # bytes, as webdataset's samples hold them; one read a member
        if len(data) != size:
            raise ShardFormatError(f"member {name} is cut short")
        _skip(f, size, size)
        parts[ext] = data
    if parts:
        sample = _to_raw(key, parts, url, labels)
        if isinstance(sample, CorruptImageError) and (
            labels.member not in parts or _IMAGE_EXTS.isdisjoint(parts)
        ):
            raise ShardFormatError(f"sample {key!r} is cut short")  # the shard ends inside it
        readable[0] = index + 1
        yield sample
    else:  # the last sample was stepped over with seeks, which do not tell whether its data was all there
        readable[0] = index + 1 if index >= stop else max(index, 0)


def _headers(f: BufferedReader, end: int) -> Iterator[tuple[str, int]]:
    """Yield ``(name, size)`` of each regular member, leaving ``f`` at its data.

    Every size is checked against ``end``, the shard's real size, before it is used.
    """
    long_name: str | None = None
    while True:
        header = f.read(_BLOCK)
        if len(header) < _BLOCK:
            if header:
                raise ShardFormatError("a tar header is cut short")
            return  # no end-of-archive blocks: a shard cut at a member boundary (the count tells)
        if header.count(0) == _BLOCK:
            return  # end of archive
        if _checksum(header) != _octal(header[148:156]):
            raise ShardFormatError("a tar header has a bad checksum")
        size = _octal(header[124:136])
        if size > end - f.tell():
            raise ShardFormatError(f"a tar member declares {size} bytes, more than the shard has left")
        kind = header[156:157]
        if kind in (b"x", b"g", b"L"):
            if size > _MAX_EXTENDED_HEADER:
                raise ShardFormatError(f"an extended tar header declares {size} bytes")
            data = f.read(size)
            if len(data) != size:
                raise ShardFormatError("an extended tar header is cut short")
            _skip(f, size, size)
            if kind == b"L":
                long_name = _text(data.rstrip(b"\0"))
            elif kind == b"x":
                long_name = _pax_path(data) or long_name
            continue
        if long_name is not None:
            name, long_name = long_name, None
        else:
            name = _text(header[:100].rstrip(b"\0"))
            prefix = header[345:500].rstrip(b"\0") if header[257:262] == b"ustar" else b""
            if prefix:
                name = _text(prefix) + "/" + name
        if kind in _REGULAR:
            yield name, size
        else:
            _skip(f, size)


def _skip(f: BufferedReader, size: int, done: int = 0) -> None:
    """Move past the rest of a member of ``size`` data bytes (``done`` of them read) and its padding."""
    f.seek(size - done + (-size % _BLOCK), 1)


def _octal(field: bytes) -> int:
    digits = field.rstrip(b"\0 ").lstrip(b" ")
    if digits[:1] == b"\x80":  # GNU base-256 for big numbers
        return int.from_bytes(digits[1:], "big")
    try:
        return int(digits, 8) if digits else 0
    except ValueError:
        raise ShardFormatError(f"a tar header field is not a number: {field!r}") from None


def _checksum(header: bytes) -> int:
    return sum(header[:148]) + 8 * 32 + sum(header[156:])


def _pax_path(data: bytes) -> str | None:
    path = None
    for record in data.split(b"\n"):
        _, _, keyword_value = record.partition(b" ")
        keyword, _, value = keyword_value.partition(b"=")
        if keyword == b"path":
            path = _text(value)
    return path


def _text(name: bytes) -> str:
    """A member name as text; bytes that are not UTF-8 are kept as surrogates (as ``tarfile`` does)."""
    return name.decode("utf-8", "surrogateescape")


class _Labels:
    """Which member of a sample holds its label (the split's, from the index), and how it is read."""

    def __init__(
        self,
        labels: LabelSource,
        class_to_idx: Mapping[str, int] | None,
        num_classes: int | None,
        *,
        keep_all: bool,
    ) -> None:
        self.member = labels.member
        self.num_classes = num_classes
        # The .json member is read only when it holds the label or a stage may want it (pack
        # writes one for people).
        self.skipped = frozenset() if labels.member == "json" or keep_all else frozenset({"json"})
        self.parse: Callable[[bytes], int] = functools.partial(labels.parse, class_to_idx=class_to_idx or {})


def _to_raw(
    key: str | None, parts: dict[str, bytes], url: str, labels: _Labels
) -> RawSample | CorruptImageError:
    shard = url.rsplit("/", 1)[-1]
    images = [ext for ext in parts if ext in _IMAGE_EXTS]
    label = parts.get(labels.member)
    if label is None or len(images) != 1:
        return _corrupt(key, shard, f"members {sorted(parts)}, not one image and a .{labels.member}")
    try:
        value = labels.parse(label)
    except ValueError as e:  # says what the member holds
        return _corrupt(key, shard, str(e))
    num_classes = labels.num_classes
    if num_classes is not None and not 0 <= value < num_classes:
        return _corrupt(key, shard, f"label {value}, outside the index's classes 0..{num_classes - 1}")
    return RawSample(parts, key=str(key), url=url, label=value, ext=images[0])


def _corrupt(key: str | None, shard: str, reason: str) -> CorruptImageError:
    return CorruptImageError(
        f"sample {key!r} in shard {shard} has {reason}; it is skipped "
        '(on_error="raise" stops on it); re-pack the dataset, or run `imgshards verify`',
        key=key,
        shard=shard,
    )
