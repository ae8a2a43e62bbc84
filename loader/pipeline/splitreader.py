"""A packed split's samples, read: the one reader of every dataset (issue 49).

``ShardDataset`` and ``MixedDataset`` (a pass's runs, :class:`~.runs.RunReader`) and ``ImageFolder``
(one sample by its position) read through :class:`SplitReader`, the read side of the packed format
in one place, so a change to the format is made here:

- **the tables** of the split (where each sample starts, its class id, its key's CRC-32, its source
  path): :class:`~imgshards.converter.format.tablefiles.SplitTables`, mapped read-only from the
  dataset's files (every process of a machine shares one copy in the page cache), fetched by
  ranges from a URL, a shard's entries at a time (:meth:`ShardSource.read_range
  <imgshards.loader.remote.ShardSource.read_range>`), or decoded from an index of format 1;
- **a run** (:meth:`SplitReader.run`): samples ``[start, stop)`` of a shard, parsed by
  :func:`.tar.read_run`; a run from inside a shard seeks to its first sample's start, and the
  sample found there must carry the key the table names (else the run is damage: its samples lost
  and counted, never another sample delivered in their place);
- **a sample by position** (:meth:`SplitReader.sample`): one ``pread`` from its start to the next
  sample's, parsed by the one tar parser and checked to be the sample the tables name (one
  sample's members, nothing after them, its key's CRC-32 and its label the tables'), else
  :class:`~imgshards.loader.errors.CorruptImageError` (:meth:`SplitReader.damaged`);
- **the shards opened**: each opened as :class:`~imgshards.loader.remote.ShardSource` opens one (a
  regular file inside the root), and only while it is still the shard the index the dataset was
  built from describes (:class:`IndexStamp`: a re-pack or re-index of the dataset replaces its
  ``index.json``, and a shard opened after that is refused, unless the new index lists this split's
  shards and tables exactly as before); for reads by position, at most ``max_open`` held in a
  process, least recently used closed first, and none carried across a fork or a pickle;
- **the tables an index lacks** (written before them, or by another tool):
  :meth:`SplitReader.labels_and_sources` reads every sample's class id and source path from the
  shards, once.
"""

from __future__ import annotations

import io
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from imgshards.converter.format.errors import ManifestError, ShardFormatError
from imgshards.converter.format.labels import label_value
from imgshards.converter.format.locate import INDEX_NAME, redact_url
from imgshards.converter.format.manifest import IMAGE_EXTENSIONS, SplitInfo, read_manifest
from imgshards.converter.format.tablefiles import SplitTables, TableFile
from imgshards.converter.format.tables import BLOCK, key_digest
from imgshards.converter.format.tarsamples import SampleReader, checked_samples, sample_problem, shown
from imgshards.converter.format.tarstream import TarStream

from ..errors import ConfigError, CorruptImageError, ShardAccessError, ShardReadError
from ..remote import ShardSource
from .tar import RawSample, read_run, source_path

__all__ = ["DEFAULT_MAX_OPEN", "IndexStamp", "SplitReader"]

DEFAULT_MAX_OPEN = 8  # shards open for reads by position, per process: a file costs ~1 MB of buffer
_IMAGE_EXTS = frozenset(IMAGE_EXTENSIONS)


@dataclass(frozen=True)
class IndexStamp:
    """Which file a local dataset's ``index.json`` was when it was read: device, inode, size, mtime.

    Taken *before* the index is read (:meth:`of`), so an index replaced in between is seen as
    replaced (a refusal to read on, never a stale index taken for the new one). ``pack``,
    ``imgshards index`` and ``--upgrade`` write the index last, through a new file renamed into
    place: a re-pack of the dataset always makes another file, whatever it holds.
    """

    path: str
    file: tuple[int, int, int, int]

    @classmethod
    def of(cls, root: str | os.PathLike[str]) -> IndexStamp | None:
        """The stamp of the index of the local dataset at ``root``; None if there is none to stat."""
        path = str(Path(root) / INDEX_NAME)
        file = _file_of(path)
        return None if file is None else cls(path, file)

    def now(self) -> tuple[int, int, int, int] | None:
        """What the index's file is now (None: gone)."""
        return _file_of(self.path)


def _file_of(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class _Held(NamedTuple):
    """A shard open for reads by position, with its entries of the tables (views; starts in bytes)."""

    file: BinaryIO
    size: int  # as fstat says
    starts: np.ndarray  # in blocks, as stored
    keys: np.ndarray | None
    labels: np.ndarray | None


class _FetchTable:
    """How :class:`SplitTables` reads a table file behind a URL: a range at a time, through the source."""

    def __init__(self, source: ShardSource) -> None:
        self.source = source

    def __call__(self, table: TableFile, start: int, stop: int) -> bytes:
        return self.source.read_range(table.name, table.bytes, start, stop)


class SplitReader:
    """Reads the samples of one packed split (see the module docstring).

    Args:
        split: The split, as its index says.
        classes: The index's class names (a label is a position here).
        source: Where its shards (and its table files) are read from.
        stamp: The index's file when it was read (:meth:`IndexStamp.of`, taken before reading it);
            None for a URL (a remote shard's version is pinned by its reader instead).
        max_open: Most shards a process holds open for :meth:`sample`.
        fadvise_random: ``POSIX_FADV_RANDOM`` on every shard opened for :meth:`sample`.

    Picklable: a DataLoader worker gets the split, its tables' names and the stamp (O(shards)),
    no open file and no entry of a table; a forked child opens its own shards.

    """

    def __init__(
        self,
        split: SplitInfo,
        classes: Sequence[str],
        source: ShardSource,
        *,
        stamp: IndexStamp | None,
        max_open: int = DEFAULT_MAX_OPEN,
        fadvise_random: bool = False,
    ) -> None:
        self.split, self.source, self.stamp = split, source, stamp
        self.classes = tuple(classes)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.max_open, self.fadvise_random = max_open, fadvise_random
        where = redact_url(source.root)
        if source.remote:
            self.tables = SplitTables(split, len(self.classes), fetch=_FetchTable(source), where=where)
        else:
            self.tables = SplitTables(split, len(self.classes), root=source.root, where=where)
        self._held: OrderedDict[int, _Held] = OrderedDict()
        self._pid = os.getpid()

    @property
    def root(self) -> str:
        """The dataset's directory or URL (credentials hidden), for messages."""
        shown_root: str = redact_url(self.source.root)
        return shown_root

    # ---- pickling, forks ---------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_held": OrderedDict(), "_pid": -1}

    def close(self) -> None:
        """Close the shards this process holds open (a read opens them again)."""
        held = getattr(self, "_held", None)  # None: __init__ failed before it
        while held:  # in a forked child, its copies of the descriptors: the parent keeps its own
            held.popitem()[1].file.close()

    def __del__(self) -> None:
        self.close()

    # ---- opening a shard ---------------------------------------------------------------------------

    def open(self, s: int) -> BinaryIO:
        """Shard ``s`` opened for reading, as the index this reader was made from describes it.

        Raises:
            ShardAccessError: the shard is gone or refused, or the dataset was re-packed (its index
                replaced by one that lists this split otherwise) since this reader was made.
            ShardReadError: the shard cannot be opened (an I/O error).

        """
        shard = self.split.shards[s]
        f = self.source.open(shard)
        try:
            self._check_index(shard.name)  # after the open: a shard swapped in before it is seen
        except BaseException:
            f.close()
            raise
        return f

    def _check_index(self, name: str) -> None:
        """Raise :class:`ShardAccessError` if the dataset's index is no longer the one read.

        An index rewritten with this split as it was (another split packed beside it) is taken as
        the one read: the same shards (names, sizes, sha256) and tables, the same classes.
        """
        stamp = self.stamp
        if stamp is None:
            return
        now = stamp.now()
        if now == stamp.file:
            return
        seen = None if now is None else self._split_unchanged()
        if seen is not None:
            self.stamp = IndexStamp(stamp.path, seen)
            return
        raise ShardAccessError(
            f"the dataset at {self.root} was re-packed or re-indexed after this dataset was made from it "
            f"(its {INDEX_NAME} is {'gone' if now is None else 'another file now'}): shard {name} may "
            "hold other samples than the index read then says; make the dataset again",
            shard=name,
        )

    def _split_unchanged(self) -> tuple[int, int, int, int] | None:
        """The index's file now, if the index it holds lists this split as it was read; else None."""
        assert self.stamp is not None
        before = self.stamp.now()
        try:
            manifest = read_manifest(Path(self.stamp.path).parent)
        except ManifestError:
            return None
        split = manifest.splits.get(self.split.name)
        unchanged = (
            split is not None
            and tuple(manifest.classes) == self.classes
            and split.shards == self.split.shards
            and dict(split.tables) == dict(self.split.tables)
            and split.labels == self.split.labels
        )
        return before if unchanged and before is not None and before == self.stamp.now() else None

    # ---- a run of samples of a shard ---------------------------------------------------------------

    def run(
        self,
        s: int,
        start: int,
        stop: int,
        *,
        file: Callable[[BinaryIO], BinaryIO] | None = None,
        on_truncated: Callable[[str], None] | None = None,
        on_corrupt: Callable[[CorruptImageError], None] | None = None,
        keep_all: bool = False,
    ) -> Iterator[RawSample]:
        """Samples ``[start, stop)`` of shard ``s``, in stored order (:func:`.tar.read_run`), lazily.

        The shard is opened (:meth:`open`, then ``file`` of it: how the run reads it) at the first
        sample asked for. A run from inside the shard seeks to sample ``start``'s start, where the
        split has a table of starts, and the sample there must carry the key its table names: a
        sample of another key ends the run as damage (told to ``on_truncated``, its samples lost).

        Raises:
            ManifestError: the tables are not what the index says (a start outside the shard...).

        """
        shard = self.split.shards[s]

        def samples() -> Iterator[RawSample]:
            offset = expect = None
            if start and self.tables.has("starts"):  # a seek, not a walk over the samples before it
                self._check_index(shard.name)  # the tables of the index read: still this dataset's?
                offset = int(self.tables.starts(s)[start])
                keys = self.tables.keys(s)
                expect = None if keys is None else int(keys[start])
            yield from read_run(
                redact_url(self.source.url(shard.name)),
                start,
                stop,
                on_truncated=on_truncated,
                opener=lambda: self.open(s) if file is None else file(self.open(s)),
                num_classes=len(self.classes),
                on_corrupt=on_corrupt,
                labels=self.split.labels,
                class_to_idx=self.class_to_idx,
                keep_all=keep_all,
                offset=offset,
                expect=expect,
            )

        return samples()

    # ---- one sample by its position ----------------------------------------------------------------

    def sample(self, i: int) -> tuple[dict[str, bytes], str, int]:
        """Sample ``i`` of the split: its members, its image's extension and its class id.

        Read with one ``pread``, from its start to the next sample's (or the shard's end); what is
        read must be the sample the tables name: one sample's members, nothing after them, under
        the key and with the label of the tables.

        Raises:
            CorruptImageError: it is not (the message names the sample, its shard and its source).
            ManifestError: the tables are not what the index says (a start outside the shard, a
                class id past the classes...).
            ShardReadError: the shard cannot be read (an I/O error); ShardAccessError: it is gone,
                or the dataset was re-packed since this reader was made.

        """
        s = self.tables.shard_of(i)
        shard = self.split.shards[s]
        held = self._hold(s)
        j = i - int(self.tables.first[s])
        start = int(held.starts[j]) * BLOCK
        # To the next sample's first header, or the shard's end (its end-of-archive blocks too).
        stop = int(held.starts[j + 1]) * BLOCK if j + 1 < len(held.starts) else shard.bytes
        if not start < stop <= shard.bytes:
            raise self.tables.bad(
                "starts",
                f"sample {i}'s start is not below the next one's: starts not increasing inside the shard",
            )
        if held.labels is not None and held.labels[j] >= len(self.classes):
            raise self.tables.bad(
                "labels", f"sample {i}'s class id is not below the index's {len(self.classes)}"
            )
        try:  # no more than the file holds: the index's sizes are untrusted (pread allocates them first)
            data = os.pread(held.file.fileno(), max(0, min(stop, held.size) - start), start)
        except OSError as e:
            url = self.source.url(shard.name)
            raise ShardReadError(f"cannot read shard {url}: {e}", shard=shard.name) from e
        tar = TarStream(io.BytesIO(data), end=len(data), offset=0)
        member = self.split.labels.member
        sample, target = None, -1
        try:
            found = list(SampleReader(tar, stop=2))
        except ShardFormatError as e:
            problem: str | None = f"does not parse as a tar sample: {e}"
        else:
            sample = found[0] if found else None
            if sample is None or sample.cut:
                problem = "is not there"
            elif len(found) > 1:
                problem = "is not where the index's table of starts says: another sample follows it there"
            elif held.keys is not None and key_digest(sample.key) != held.keys[j]:
                problem = f"is not where the index's table of starts says: {shown(sample.key)} is there"
            else:
                problem = sample_problem(sample.exts, member)
        if problem is None and sample is not None:
            try:
                target = self.class_id(label_value(sample.parts[member], member, self.split.labels.key))
            except ValueError as e:
                problem = f"has {e}"
            else:
                if held.labels is not None and target != held.labels[j]:
                    problem = f"has label {target} where the index says {held.labels[j]}"
        if problem is not None:
            if len(data) < stop - start:  # the file is shorter than the index says: what explains it
                problem = f"is cut short: the shard ends {len(data)} of its {stop - start} bytes in"
            raise self.damaged(i, None if sample is None else sample.parts, problem, s=s)
        assert sample is not None  # a sample without a problem
        ext = next(e for e in sample.parts if e in _IMAGE_EXTS)
        return sample.parts, ext, target

    def require_starts(self) -> None:
        """Raise :class:`ConfigError` if the split has no table of sample starts (no read by position)."""
        if not self.tables.has("starts"):
            shards = self.split.shards
            missing = next((s.name for s in shards if s.samples and s.offsets is None), shards[0].name)
            raise ConfigError(
                f"shard {missing} of split {self.split.name!r} at {self.root} has no table of sample starts "
                "(an index `imgshards index` wrote before it kept one, or an index older than the table): "
                "a sample is read by its position at its start; index the shards again with `imgshards "
                "index`, re-pack with `imgshards pack`, or read it with ShardDataset"
            )

    def _hold(self, s: int) -> _Held:
        """Shard ``s`` open in this process with its tables' entries (at most ``max_open``, LRU)."""
        if self._pid != os.getpid():  # a forked child: its parent's files stay the parent's
            self.close()
            self._pid = os.getpid()
        held = self._held.get(s)
        if held is not None:
            self._held.move_to_end(s)
            return held
        self.require_starts()
        f = self.open(s)  # first: a dataset re-packed since is refused as such, whatever its tables
        try:
            # Views of the maps, unchecked: a read checks the two starts it uses and what it finds
            # there (one sample, its key, its label), so opening a shard costs no pass over its entries.
            tables = self.tables
            starts = tables.entries("starts", s)
            keys = tables.entries("keys", s) if tables.has("keys") else None
            labels = tables.entries("labels", s) if tables.has("labels") else None
        except BaseException:
            f.close()
            raise
        fd = f.fileno()
        if self.fadvise_random:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        held = self._held[s] = _Held(f, os.fstat(fd).st_size, starts, keys, labels)
        while len(self._held) > self.max_open:
            self._held.popitem(last=False)[1].file.close()
        return held

    def class_id(self, value: int | str) -> int:
        """The class id of a label value under the split's labels; ValueError naming what is wrong."""
        target: int = self.split.labels.class_id(value, self.class_to_idx)
        if not 0 <= target < len(self.classes):
            raise ValueError(f"label {target}, outside the index's classes 0..{len(self.classes) - 1}")
        return target

    def damaged(
        self, i: int, parts: dict[str, bytes] | None, reason: str, *, s: int | None = None
    ) -> CorruptImageError:
        """The error for damaged sample ``i`` (of shard ``s``): its shard and source path, what to do.

        The source path is read from the sample's ``.json`` in ``parts``, if it has one.
        """
        shard = self.split.shards[self.tables.shard_of(i) if s is None else s]
        where = f"shard {shard.name}"
        source = source_path({"json": parts.get("json")} if parts else {})
        if source is not None:
            where += f", packed from {shown(source)}"
        return CorruptImageError(
            f"sample {i} of split {self.split.name!r} at {self.root} ({where}) {reason}: the shard is "
            f"damaged or was rewritten since it was packed; run `imgshards verify {self.root}` to list "
            "every damaged sample, and re-pack (ShardDataset skips and counts such samples)",
            shard=shard.name,
        )

    # ---- the tables an index lacks -----------------------------------------------------------------

    def labels_and_sources(self) -> tuple[np.ndarray, list[str]]:
        """Every sample's class id and source path, read from the shards (an index without the tables).

        Raises:
            CorruptImageError: a sample of a shard is damaged, or missing.

        """
        first = self.tables.first
        targets = np.empty(int(first[-1]), dtype=np.int64)
        sources: list[str] = []
        member, field = self.split.labels.member, self.split.labels.key
        for s, shard in enumerate(self.split.shards):
            at, count = int(first[s]), shard.samples
            with self.open(s) as f:
                tar = TarStream(f, end=os.fstat(f.fileno()).st_size)
                got = 0
                try:
                    for sample, value, problem in checked_samples(tar, member, field, also=("json",)):
                        if sample.index >= count:
                            break
                        if problem is None and value is not None:
                            try:
                                targets[at + sample.index] = self.class_id(value)
                            except ValueError as e:
                                problem = f"has {e}"
                        if problem is not None:
                            raise self.damaged(at + sample.index, None, problem, s=s)
                        image = next(e for e in sample.exts if e in _IMAGE_EXTS)
                        sources.append(source_path(sample.parts) or f"{sample.key}.{image}")
                        got += 1
                except ShardFormatError as e:
                    raise self.damaged(at + got, None, f"does not parse: {e}", s=s) from None
            if got != count:
                raise self.damaged(at + got, None, f"is missing: the shard holds {got} of {count}", s=s)
        return targets, sources
