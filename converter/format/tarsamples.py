"""Samples out of a tar's members, and what makes one unusable: one verdict for index, verify and loader.

:class:`SampleReader` groups the members of :class:`~.tarstream.TarStream` as webdataset groups
them (``base_plus_ext``: adjacent members sharing the name up to the first dot of the last path
part; a member without an extension belongs to no sample), reading the members a caller wants and
stepping over the rest. :func:`sample_problem` says what is wrong with a sample's members (no image,
two images, no label, a member twice); :func:`label_value` reads a label member into a class id or
a class name. ``index`` refuses a shard where either finds something, ``verify`` reports it, and the
loader skips the sample as corrupt, so a sample is either counted by all three or refused by
``index`` with the reason.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass

from . import errors
from .errors import ShardFormatError
from .labels import MAX_LABEL_BYTES, label_value
from .manifest import IMAGE_EXTENSIONS
from .tarstream import TarStream

__all__ = [
    "MAX_LABEL_BYTES",
    "SampleReader",
    "TarSample",
    "checked_samples",
    "label_value",
    "sample_problem",
    "shown",
]

_IMAGE_EXTS = frozenset(IMAGE_EXTENSIONS)


@dataclass(slots=True)
class TarSample:
    """One sample as stored: its position in the shard, key, the members read, every member's extension.

    ``cut`` marks the sample the shard's damage fell in (its members after the damage are missing);
    ``start`` is where its first member's first header is, in bytes from the shard's start.
    """

    index: int
    key: str
    parts: dict[str, bytes]
    exts: list[str]
    cut: bool = False
    start: int = 0


class SampleReader:
    """Samples ``[start, stop)`` of one tar stream, in stored order.

    Members of samples before ``start`` are stepped over, never read; reading stops at ``stop``
    (None: the end). ``at`` is the number of the sample ``tar`` stands at (a stream moved to where
    sample ``at`` starts, by a shard's table of sample starts; 0: the shard's start). Of a
    sample's members, those whose extension is in ``skip``, or not in ``only`` (when given), or
    larger than ``max_read`` bytes are stepped over too; every extension is listed.
    A member's key and extension are :func:`~.manifest.split_member_name`'s (inlined: the hot path).

    A :class:`~.errors.ShardFormatError` of the stream ends the iteration: the sample it fell in
    is yielded first (``cut``), if it is in range. :attr:`seen` counts the samples whose members all
    came before the damage or the end, :attr:`cut_exts` lists the extensions of the sample the
    damage fell in (in range or not), and :attr:`final` is set as the shard's last sample is yielded.
    """

    def __init__(
        self,
        tar: TarStream,
        *,
        start: int = 0,
        stop: int | None = None,
        skip: Collection[str] = frozenset(),
        only: Collection[str] | None = None,
        max_read: int | None = None,
        at: int = 0,
    ) -> None:
        self.tar, self.start, self.stop, self.at = tar, start, stop, at
        self.skip, self.only, self.max_read = skip, only, max_read
        self.seen = at
        self.final = False  # set as the shard's last sample (none after it) is yielded
        self.cut_exts: list[str] | None = None  # the members of the sample the damage fell in, if any

    def __iter__(self) -> Iterator[TarSample]:
        tar, start, stop, skip, only, max_read = (
            self.tar, self.start, self.stop, self.skip, self.only, self.max_read
        )  # fmt: skip
        index, key, begun = self.at - 1, None, 0
        parts: dict[str, bytes] = {}
        exts: list[str] = []
        try:
            for name, size in tar:
                slash = name.rfind("/") + 1
                dot = name.find(".", slash)
                if dot < 0:  # no extension: not part of a sample (webdataset skips these too)
                    continue
                member_key = name[:dot]
                if member_key != key:
                    if index >= start:
                        yield TarSample(index, key, parts, exts, False, begun)  # type: ignore[arg-type]
                    index += 1
                    self.seen = index
                    if stop is not None and index >= stop:
                        return
                    key, parts, exts, begun = member_key, {}, [], tar.member_start
                ext = name[dot + 1 :].lower()
                exts.append(ext)
                if (
                    index < start
                    or ext in skip
                    or (only is not None and ext not in only)
                    or (max_read is not None and size > max_read)
                    or ext in parts  # a member twice: the sample is refused (sample_problem), the first kept
                ):
                    continue
                parts[ext] = tar.data()
        except ShardFormatError:
            self.cut_exts = exts if key is not None else None
            if key is not None and index >= start:
                yield TarSample(index, key, parts, exts, cut=True, start=begun)
            raise
        self.seen, self.final = index + 1, True
        if key is not None and index >= start:
            yield TarSample(index, key, parts, exts, False, begun)


def sample_problem(exts: list[str], member: str) -> str | None:
    """What is wrong with a sample of members ``exts`` whose label is in member ``member``; None if nothing.

    One image (an extension of :data:`~.manifest.IMAGE_EXTENSIONS`), one label member, no member
    twice. The label's value is :func:`label_value`'s to judge.
    """
    images = 0
    for ext in exts:
        images += ext in _IMAGE_EXTS
    if images == 1 and exts.count(member) == 1 and len(set(exts)) == len(exts):
        return None
    if len(set(exts)) != len(exts):
        twice = sorted({e for e in exts if exts.count(e) > 1})
        return f"has members {sorted(exts)}: {', '.join('.' + e for e in twice)} more than once"
    if images != 1:
        return (
            f"has members {sorted(exts)}: not one image among {', '.join(IMAGE_EXTENSIONS)} "
            "(the extensions imgshards reads)"
        )
    return f"has no .{member} member for its label"


def checked_samples(
    tar: TarStream, member: str, field: str | None = None, *, also: Collection[str] = ()
) -> Iterator[tuple[TarSample, int | str | None, str | None]]:
    """Every sample of a shard with its label value, or what is wrong with it: what index and verify read.

    Only the label member is read (up to :data:`~.manifest.MAX_LABEL_BYTES`), and the members named
    in ``also`` (as large, at most: a ``.json`` for its ``path``). A key met again after
    other samples is a problem (the loader would read it as two samples, ``index`` as one name). A
    :class:`~.errors.ShardFormatError` ends the iteration; the sample it fell in is not yielded.
    """
    first: dict[str, int] = {}
    for sample in SampleReader(tar, only=frozenset({member, *also}), max_read=MAX_LABEL_BYTES):
        if sample.cut:
            continue
        problem = sample_problem(sample.exts, member)
        value: int | str | None = None
        if sample.key in first:
            problem = f"repeats the key of sample {first[sample.key]}, with other samples between them"
        first.setdefault(sample.key, sample.index)
        if problem is None:
            data = sample.parts.get(member)
            try:
                if data is None:  # stepped over: larger than a label
                    raise ValueError(f"a .{member} larger than a label ({MAX_LABEL_BYTES} bytes)")
                value = label_value(data, member, field)
            except ValueError as e:
                problem = f"has {e}"
        yield sample, value, problem


def shown(key: str) -> str:
    """A sample key as a message shows it: :func:`~.errors.shown`, quoted (``sample '00042'``)."""
    return errors.shown(key, quoted=True)
