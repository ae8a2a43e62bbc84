"""Read a run of samples from one WebDataset tar shard as raw (undecoded) bytes: the loader's adapter.

The tar is parsed by the format's one member parser
(:class:`~imgshards.converter.format.tarstream.TarStream`) and grouped into samples by its one
grouper (:class:`~imgshards.converter.format.tarsamples.SampleReader`), the very code
``imgshards index`` and ``verify`` read shards with, so all three accept and refuse the same
members (sparse files, a NUL in a name, extended headers past the one cap...) and count the same
samples. Not ``tarfile``: its stream mode reads in 10 KiB Python-level chunks and parses every
header field in Python. The parser does one ``read`` per header and one per kept member, checks each
header's checksum, steps over skipped members with ``seek``, and stops at the run's end without
reading the rest of the shard.

Members are grouped into samples as webdataset does (``base_plus_ext``: the key is the name up to the
first dot of its last path part, the extension the rest, lower-cased); the tests hold its output to
webdataset's reading of the same shard. Besides the ustar headers the converter writes, it reads pax
(``x``, ``g``) and GNU long-name (``L``) headers, so shards from webdataset's or GNU tar's writers
load too.

A shard is untrusted input: every member's declared size is checked against the bytes left in the
shard before anything is allocated or skipped, names that are not UTF-8 are read as bytes
(``surrogateescape``, as ``tarfile`` does), and a sample that is not one image and a label, or whose
label is not a class id in ``0..classes-1`` (read by the one label reader,
:func:`~imgshards.converter.format.labels.label_value`), is corrupt (``on_corrupt``), never passed on.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from collections.abc import Callable, Generator, Iterator, Mapping
from io import BufferedReader
from pathlib import Path
from typing import Any, BinaryIO, cast

from imgshards.converter.format.errors import ImgshardsError, ShardFormatError
from imgshards.converter.format.manifest import IMAGE_EXTENSIONS, LabelSource, open_regular
from imgshards.converter.format.tables import key_digest
from imgshards.converter.format.tarsamples import SampleReader, TarSample, sample_problem, shown
from imgshards.converter.format.tarstream import TarStream

from ..errors import CorruptImageError, ResourceLimitError, ShardReadError

__all__ = ["RawSample", "ShardFormatError", "image_member", "read_run", "sample_shard", "source_path"]

_READ_BUFFER = 1 << 20
_MAX_JSON = 1 << 16  # a .json member a message reads the source path from (pack writes ~100 bytes)
_MAX_PATH = 1024  # characters of a source path a message shows
_IMAGE_EXTS = frozenset(IMAGE_EXTENSIONS)


class RawSample(dict[str, Any]):
    """One sample as webdataset has it, plus its label: a dict that webdataset's stages take as is.

    Keys: ``__key__``, ``__url__`` (the shard), one entry per member read (``jpg``, ``cls``...,
    ``bytes``; an image read from a memory-mapped shard is a ``memoryview`` of it, in a pass that no
    user stage sees), and ``__label__``, the class id as the split's index says. The attributes name what
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


def source_path(sample: Mapping[str, Any]) -> str | None:
    """The file ``sample`` was packed from (its ``.json``'s ``path``), for a message about it; else None.

    The ``.json`` member is not read on the fast path (pack writes it for people): only when a
    message needs it, from the sample if it holds it, else read again from its local shard (a
    remote one is not read again: its message names the key). Untrusted: bounded, and only a string
    ``path`` of printable characters is taken.
    """
    data = sample.get("json")
    url, key = str(sample.get("__url__", "")), sample.get("__key__")
    if data is None and key is not None and url and "://" not in url:
        data = _member(url, str(key), "json")
    try:
        path = json.loads(bytes(data)).get("path") if data is not None and len(data) <= _MAX_JSON else None
    except (ValueError, AttributeError, TypeError):
        return None
    return path if isinstance(path, str) and path.isprintable() and 0 < len(path) <= _MAX_PATH else None


_MEMBER_LOOKS = 64
_member_looks = 0


def _member(path: str, key: str, ext: str) -> bytes | None:
    """Member ``key.ext`` of the local shard at ``path`` (the one tar parser, stepping over the rest).

    Opened as a regular file only (a FIFO swapped in would block a plain ``open``); each look walks
    the shard from its start, so a process looks at most ``_MEMBER_LOOKS`` times (a badly damaged
    shard's messages then name the key alone).
    """
    global _member_looks
    if _member_looks >= _MEMBER_LOOKS:
        return None
    _member_looks += 1
    try:
        with open_regular(path) as f:
            end = f.seek(0, os.SEEK_END)
            f.seek(0)
            reader = SampleReader(TarStream(f, end=end), only=(ext,), max_read=_MAX_JSON)
            for sample in reader:
                if sample.key == key:
                    data = sample.parts.get(ext)
                    return None if data is None else bytes(data)
    except (OSError, ImgshardsError, ValueError):
        return None
    return None


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
    offset: int | None = None,
    expect: int | None = None,
) -> Iterator[RawSample]:
    """Yield samples ``[start, stop)`` of the shard at ``path``, in stored order.

    ``opener`` opens the shard (a remote one, see :class:`~imgshards.loader.remote.ShardSource`);
    without it ``path`` is a local file. The shard is opened at the first sample asked for.
    ``labels`` says which member holds a sample's label (the split's, from the index; default
    ``.cls``); ``class_to_idx`` maps class names to ids for labels that are names. Every member is
    read but ``.json`` (when the label is elsewhere), or every member with ``keep_all``. ``offset``
    is where sample ``start`` begins (the index's table of sample starts): the run seeks there
    instead of stepping over the samples before it; ``expect``, the CRC-32 of that sample's key (the
    index's table of keys), is checked against the sample found there: another sample there ends
    the run, its samples lost (told as a shard cut short is), never read in their place.

    A shard that ends early (truncated, cut mid-member, or damaged) yields what it has before the
    damage; ``on_truncated`` (or a ``RuntimeWarning``) is told once, naming the shard and the sample
    it stopped at.

    A sample without one image and a label, or whose label is not an integer in
    ``0..num_classes-1``, goes to ``on_corrupt`` (raised without it) and the run goes on. A read
    error of the file is a :class:`~imgshards.loader.errors.ShardReadError`.
    """
    url, path = str(path), Path(path)
    expected, got, problem, misplaced = stop - start, 0, "", False
    readable = [0]  # complete samples the shard was seen to hold, counted by _samples
    with opener() if opener is not None else open(path, "rb", buffering=_READ_BUFFER) as f:
        labeled = _Labels(labels or LabelSource(), class_to_idx, num_classes, keep_all=keep_all)
        samples = _samples(cast(BufferedReader, f), start, stop, url, labeled, readable, offset, expect)
        try:
            for sample in samples:
                got += 1
                if isinstance(sample, CorruptImageError):
                    sample = sample.named(source_path({"__url__": url, "__key__": sample.key}))
                    if on_corrupt is None:
                        raise sample
                    on_corrupt(sample)
                else:
                    yield sample
        except _Misplaced as e:
            problem, misplaced = str(e), True
        except ShardFormatError as e:
            problem = f"; {e}"
        except (OSError, MemoryError) as e:
            if isinstance(e, ImgshardsError):
                raise
            out = ResourceLimitError.of(e, path=url, shard=path.name)  # a setting to fix, not damage
            if out is not None:
                raise out from e
            if isinstance(e, MemoryError):
                raise
            raise ShardReadError(f"cannot read shard {path}: {e}", shard=path.name) from e
        finally:
            samples.close()
    if misplaced:
        message = (
            f"shard {path.name}: {problem}: the {expected} samples [{start}, {stop}) read here are lost "
            "(the index does not describe this shard: rewritten since it was packed, or its tables "
            "damaged; run `imgshards verify`); the epoch goes on without them"
        )
    elif got < expected:
        held = start + got if got else readable[0]
        message = (
            f"shard {path.name} holds only {held} readable sample(s){problem}: {expected - got} of the "
            f"{expected} samples [{start}, {stop}) read here are lost (truncated or rewritten since it "
            "was packed); the epoch goes on without them"
        )
    if misplaced or got < expected:
        if on_truncated is not None:
            on_truncated(message)
        else:
            warnings.warn(message, RuntimeWarning, stacklevel=2)


def _samples(
    f: BufferedReader,
    start: int,
    stop: int,
    url: str,
    labels: _Labels,
    readable: list[int],
    offset: int | None = None,
    expect: int | None = None,
) -> Generator[RawSample | CorruptImageError, None, None]:
    """Samples ``[start, stop)`` of the shard, from the converter's one tar reader, as raw samples.

    A sample that is not usable comes out as the error saying why, in its place. ``readable[0]``
    follows how many complete samples the shard was seen to hold (for the message about a damaged
    shard). After a seek, a first sample whose key's CRC-32 is not ``expect`` raises
    :class:`_Misplaced`.
    """
    end = f.seek(0, os.SEEK_END)  # members are checked against the bytes the shard really has
    # A seek to the table's start of sample `start`; past the end, a truncated shard: walked to its end.
    at, offset = (start, offset) if offset is not None and offset < end else (0, 0)
    if not at:
        expect = None  # a walk from the shard's start finds sample `start` where it is
    f.seek(offset)
    tar = TarStream(f, end=end, offset=offset)
    reader = SampleReader(tar, start=start, stop=stop, skip=labels.skipped, at=at)
    member = labels.member
    try:
        for sample in reader:
            if expect is not None:  # the first sample after the seek: the one the index names?
                if key_digest(sample.key) != expect:
                    raise _Misplaced(
                        f"sample {start} is not where the index's table of starts says (byte {offset}): "
                        f"{shown(sample.key)} is there, not the key its table of keys names"
                    )
                expect = None
            if sample.cut:  # the damage fell in this sample: whole if its label and image came before it
                if member in sample.parts and not _IMAGE_EXTS.isdisjoint(sample.parts):
                    yield _to_raw(sample, url, labels)
                continue
            raw = _to_raw(sample, url, labels)
            if (
                reader.final
                and not tar.ended
                and isinstance(raw, CorruptImageError)
                and (member not in sample.exts or _IMAGE_EXTS.isdisjoint(sample.exts))
            ):
                readable[0] = sample.index  # no end-of-archive block: the shard was cut inside it
                raise ShardFormatError(f"sample {sample.key!r} is cut short")
            yield raw
    except ShardFormatError:
        cut = reader.cut_exts  # the sample before the damage counts as whole if it had a label and an image
        whole = cut is not None and member in cut and not _IMAGE_EXTS.isdisjoint(cut)
        readable[0] = max(readable[0], reader.seen + whole)
        raise
    readable[0] = reader.seen


class _Misplaced(Exception):
    """The sample a run sought is not where the index's table of starts says: another one is there."""


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


def _to_raw(sample: TarSample, url: str, labels: _Labels) -> RawSample | CorruptImageError:
    shard = url.rsplit("/", 1)[-1]
    problem = sample_problem(sample.exts, labels.member)
    if problem is not None:
        return _corrupt(sample.key, shard, problem)
    parts = sample.parts
    try:
        value = labels.parse(bytes(parts[labels.member]))  # bytes: the same object, or a view's copy
    except ValueError as e:  # says what the member holds
        return _corrupt(sample.key, shard, f"has {e}")
    num_classes = labels.num_classes
    if num_classes is not None and not 0 <= value < num_classes:
        return _corrupt(
            sample.key, shard, f"has label {value}, outside the index's classes 0..{num_classes - 1}"
        )
    for ext in parts:
        if ext in _IMAGE_EXTS:
            return RawSample(parts, key=sample.key, url=url, label=value, ext=ext)
    raise AssertionError("sample_problem passed a sample without an image")


def _corrupt(key: str | None, shard: str, reason: str) -> CorruptImageError:
    return CorruptImageError.about(
        str(key), shard, reason, "re-pack the dataset, or run `imgshards verify`", noun="sample"
    )
