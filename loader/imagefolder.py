"""``ImageFolder``: torchvision's ``ImageFolder`` over a packed split, a map-style dataset.

For a script written for ``torchvision.datasets.ImageFolder(root, transform)`` and a
``DataLoader(..., shuffle=True, num_workers=...)``: the switch is the import, and every sampler,
transform (v1 or v2), collate and worker start method keeps working. The constructor is
torchvision's (``root, transform, target_transform, loader, is_valid_file, allow_empty``), and so are
``ds[i]`` (``(transform(PIL RGB image), target_transform(class id))``), ``classes``,
``class_to_idx``, ``targets`` (a list), ``samples`` and ``imgs`` (``(source path, class id)``),
``extensions``, ``find_classes`` and the ``repr``. ``root`` is a packed dataset's directory, or
``<packed directory>/<split>`` as a script joins ``os.path.join(data, "train")``. The samples are
numbered in the order they are packed (shuffled by ``pack``), not in ImageFolder's sorted order:
``targets[i]`` is ``ds[i]``'s label.

Building it reads only ``index.json`` (no listing). Its tables (``converter/format/tables.py``) give, for
each sample, where it starts in its shard, its class id, its key's CRC-32 and its source path; the
first three are held as ``numpy`` arrays (10 bytes a sample, shared copy-on-write by forked
workers), the sources as the index holds them, compressed, until ``samples`` is first asked for.
``targets`` and ``samples`` open no shard. ``ds[i]`` reads sample ``i``'s bytes, from its first tar
header to the next sample's, with one ``os.pread``, parses them with the converter's one tar parser
and sample grouper (:class:`~imgshards.converter.format.tarstream.TarStream`,
:class:`~imgshards.converter.format.tarsamples.SampleReader`,
:func:`~imgshards.converter.format.tarsamples.sample_problem`), and checks that they are the sample the
index names: exactly one sample's members, ending where the next sample starts, under the key and
with the label the index gives. The image is decoded by
:func:`~imgshards.loader.image.decode.pil_image` (the same bounds, before any decode, as
``ShardDataset``'s decoder), or handed to a ``loader`` as a file object of its bytes.

Each process keeps at most ``max_open`` shards open (least recently used closed first), each opened
the way ``ShardDataset`` opens one (a regular file inside the dataset, never a FIFO or a link out),
with the kernel's read-ahead as it is (:data:`FADVISE_RANDOM`). Files opened before a fork
are never used by the child (each process opens its own: a ``pread`` does not share a seek
position, but a pid check keeps it simple), and none crosses a pickle (``spawn`` workers).

A damaged sample (a cut or rewritten shard, a member the parser refuses, an image that does not
decode, a table of starts that does not match the shard) raises
:class:`~imgshards.loader.errors.CorruptImageError` naming the sample, its shard and its source
path: a map-style dataset cannot skip an index its sampler has chosen (torchvision's ``ImageFolder``
raises too). ``ShardDataset`` skips and counts such samples.
"""

from __future__ import annotations

import io
import operator
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO, SupportsIndex, overload

import numpy as np
from torchvision.datasets import VisionDataset
from torchvision.datasets import folder as torchvision_folder

from imgshards.converter.format.errors import ManifestError, ShardFormatError
from imgshards.converter.format.labels import label_value
from imgshards.converter.format.locate import INDEX_NAME, is_url, local_path
from imgshards.converter.format.manifest import (
    IMAGE_EXTENSIONS,
    Manifest,
    ShardInfo,
    SplitInfo,
    read_manifest,
)
from imgshards.converter.format.tables import BLOCK, decode_sources, decode_table, key_digest
from imgshards.converter.format.tarsamples import SampleReader, checked_samples, sample_problem, shown
from imgshards.converter.format.tarstream import TarStream

from .errors import ConfigError, CorruptImageError, DatasetNotFoundError, ShardReadError
from .image.decode import pil_image
from .pipeline.tar import source_path
from .remote import ShardSource

__all__ = ["DEFAULT_MAX_OPEN", "ImageFolder", "default_loader"]

DEFAULT_MAX_OPEN = 8  # open shards per process: a random sample is in any shard, a file costs ~1 MB of buffer
_IMAGE_EXTS = frozenset(IMAGE_EXTENSIONS)
# POSIX_FADV_RANDOM on every shard opened: off. Measured with bench/imagefolder.py --fadvise (docs/
# imagefolder.md): no gain, cold or warm; Linux already reads an isolated random read of under
# 128 KB as just its pages, and read-ahead past a larger one is read by a later sample. A switch for
# that bench, not an option.
FADVISE_RANDOM = False
# torchvision's loaders open a path: given one, ImageFolder decodes as its own default does.
_TORCHVISION_LOADERS = (torchvision_folder.default_loader, torchvision_folder.pil_loader)


def default_loader(f: BinaryIO) -> Any:
    """``ImageFolder``'s loader: the image in file object ``f`` as an RGB PIL image, upright.

    As :func:`~imgshards.loader.image.decode.pil_image` decodes (pixel bounds checked before any
    decode), where torchvision's ``default_loader`` opens a path.
    """
    data = f.read()
    return pil_image(data, _format_of(data))


class ImageFolder(VisionDataset):
    """A packed split as a map-style dataset: ``torchvision.datasets.ImageFolder``'s API.

    ``from imgshards.loader import ImageFolder`` and ``ImageFolder("shards/train", transform)``
    replace ``datasets.ImageFolder("photos/train", transform)`` after ``imgshards pack photos/train
    shards``.

    Args:
        root: The packed dataset's directory (holding ``index.json``), its ``index.json``, or
            ``<packed directory>/<split>`` (no such directory: the split of the dataset above it). A
            local path: a URL fails at once, naming ``ShardDataset``, which streams one.
        transform: Called on each image, a PIL RGB image (any torchvision v1 or v2 transform).
        target_transform: Called on each class id.
        loader: Called with a binary file object of a sample's image bytes (not a path: the image is
            inside a shard); returns the image handed to ``transform``. ``Image.open(f)`` takes it;
            torchvision's ``default_loader`` and ``pil_loader`` (which open a path) are taken as
            :func:`default_loader`.
        is_valid_file: Called with each sample's source path (relative to the packed tree, as in
            ``samples``) as the dataset is built; the samples it refuses are left out.
        allow_empty: Keep a class that ``is_valid_file`` leaves with no sample, instead of raising.
        split: Which split of the dataset; None: the one ``root`` names, else ``"train"``, else the
            dataset's only split.
        max_open: Most shards each process keeps open.

    Attributes:
        classes: Class names, sorted as ImageFolder sorts them; a class id is a position here.
        class_to_idx: Class name to class id.
        extensions: torchvision's image extensions, or None with ``is_valid_file``, as torchvision's.
        root: The dataset's directory; ``split``: the split read.

    Raises:
        DatasetNotFoundError: no packed dataset at ``root``, or no such split (a
            ``FileNotFoundError`` and a ``ManifestError``); the message names the splits there.
        FileNotFoundError: a class is left with no sample by ``is_valid_file`` (without
            ``allow_empty``), as torchvision's.
        ManifestError: a bad index, or a missing shard.
        ConfigError: ``root`` is a URL; ``max_open < 1``; a shard has no table of sample starts.

    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        loader: Callable[[BinaryIO], Any] = default_loader,
        is_valid_file: Callable[[str], bool] | None = None,
        allow_empty: bool = False,
        *,
        split: str | None = None,
        max_open: int = DEFAULT_MAX_OPEN,
    ) -> None:
        if is_url(root):
            raise ConfigError(
                f"ImageFolder reads a packed dataset on this machine, one sample at a time; {root} is a "
                f"URL: stream it with ShardDataset({str(root)!r}, ...) (docs/remote.md), or copy it here"
            )
        if max_open < 1:
            raise ConfigError(f"max_open must be at least 1 open shard, got {max_open}")
        path, manifest, split_info = _locate(root, split)
        super().__init__(str(path), transform=transform, target_transform=target_transform)
        self.root: str = str(path)
        self.split = split_info.name
        self.loader = loader
        self.extensions = torchvision_folder.IMG_EXTENSIONS if is_valid_file is None else None
        self.max_open = max_open
        shards = split_info.shards
        self.source = ShardSource(path)  # opens a shard as ShardDataset does: regular, inside the root
        self.source.check(shards, self.split)
        self.classes, self.class_to_idx = list(manifest.classes), manifest.class_to_idx
        self._labels = split_info.labels
        # Sample i is in shard s where first[s] <= i < first[s + 1]; it starts at block starts[i].
        self._first = np.zeros(len(shards) + 1, dtype=np.int64)
        np.cumsum([s.samples for s in shards], out=self._first[1:])
        missing = [s.name for s in shards if s.table("offsets") is None]
        if missing:
            raise ConfigError(
                f"shard {missing[0]} of split {self.split!r} at {path} has no table of sample starts "
                "(an index `imgshards index` wrote before it kept one, or an index older than the table): "
                "ImageFolder reads a sample at its start; index the shards again with `imgshards index`, "
                "re-pack with `imgshards pack`, or read it with ShardDataset"
            )
        # Every array below is as long as its tables in the index (checked by read_manifest: one entry
        # a sample), never as a count the index claims: a claim without its tables allocates nothing.
        starts = _joined(shards, "offsets", np.uint32)
        assert starts is not None  # every shard has its table: checked above
        self._starts: np.ndarray = starts
        self._keys = _joined(shards, "keys", np.uint32)  # None: some shard has no table of keys
        self._label_table = _joined(shards, "labels", _id_type(len(self.classes)))
        # The sources, compressed as the index holds them, inflated when ``samples`` is first read.
        self._source_tables: list[str | None] | None = [s.table("sources") for s in shards]
        self._sources: _Sources | None = None
        self.split_info: SplitInfo = replace(split_info, shards=tuple(_without_tables(s) for s in shards))
        self._kept: np.ndarray | None = None  # positions in the split of the samples is_valid_file kept
        if is_valid_file is not None:
            self._kept = self._valid(is_valid_file, allow_empty)
        self._targets: list[int] | None = None
        self._samples: _Samples | None = None
        self._files: OrderedDict[int, BinaryIO] = OrderedDict()
        self._sizes: dict[int, int] = {}  # of the shards opened in this process, as fstat says
        self._pid = os.getpid()

    # ---- what torchvision's ImageFolder has -----------------------------------------------------

    def __len__(self) -> int:
        """The number of samples (those ``is_valid_file`` kept)."""
        return len(self._starts) if self._kept is None else len(self._kept)

    def __getitem__(self, index: SupportsIndex) -> tuple[Any, Any]:
        """Sample ``index``: ``(transform(image), target_transform(class id))``; the image a PIL RGB one.

        Raises:
            IndexError: ``index`` is out of range (negative ones count from the end, as a list's).
            CorruptImageError: the sample is damaged, or is not where the index says; the message
                names it, its shard and its source.
            ShardReadError: the shard cannot be read (an I/O error); ShardAccessError: it is gone.

        """
        i = self._position(index)
        parts, ext, target = self._read(i)
        img: Any
        loader = self.loader
        if loader is default_loader or loader in _TORCHVISION_LOADERS:
            try:
                img = pil_image(parts[ext], ext)
            except ValueError as e:
                raise self._damaged(
                    i, self._shard_of(i), parts, f"has an image that does not decode ({e})"
                ) from None
        else:
            img = self._load(loader, parts[ext])
        if self.transform is not None:
            img = self.transform(img)
        out: Any = target if self.target_transform is None else self.target_transform(target)
        return img, out

    @property
    def targets(self) -> list[int]:
        """The class id of every sample, in the dataset's order: a list, as torchvision's ``targets``.

        From the index's tables (no shard opened), built on first use and kept; a process that
        never reads it (a DataLoader worker) never builds it. An index without the table (written
        before it) has each sample's label read from the shards instead, once.
        """
        if self._targets is None:
            ints = list(range(len(self.classes)))  # one int object per class id, shared by the list
            self._targets = list(map(ints.__getitem__, self._label_array().tolist()))
        return self._targets

    @targets.setter
    def targets(self, value: list[int]) -> None:  # as torchvision's attribute: set, never read back
        self._targets = value

    @property
    def samples(self) -> Sequence[tuple[str, int]]:
        """``(source path, class id)`` of every sample, in the dataset's order, as torchvision's ``samples``.

        The source path is relative to the tree that was packed (``cat/0001.jpg``; for another tool's
        shards, the image member's name), not a file on this machine. A sequence built on first use
        from the index's tables (no shard opened): each item is made when it is read, so a million
        samples cost their paths' bytes, not a million tuples.
        """
        if self._samples is None:
            sources, labels = self._source_paths(), self._label_array(every=True)
            self._samples = _Samples(sources, labels, self._kept)
        return self._samples

    @property
    def imgs(self) -> Sequence[tuple[str, int]]:
        """The same as :attr:`samples`, as torchvision's ``imgs``."""
        return self.samples

    def find_classes(self, directory: str | os.PathLike[str]) -> tuple[list[str], dict[str, int]]:
        """The classes of the packed dataset at ``directory`` and their ids, from its index.

        Raises:
            DatasetNotFoundError: no packed dataset there (a ``FileNotFoundError``).

        """
        manifest = _locate(directory, None)[1]
        return list(manifest.classes), manifest.class_to_idx

    def extra_repr(self) -> str:
        """The split, under torchvision's ``Dataset ImageFolder`` / ``Number of datapoints`` lines."""
        return f"Split: {self.split}"

    # ---- pickling into spawn workers: no open file crosses ---------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        no_lists = {"_targets": None, "_samples": None, "_sources": None, "_source_tables": None}
        return {**self.__dict__, "_files": OrderedDict(), "_sizes": {}, "_pid": -1, **no_lists}

    def close(self) -> None:
        """Close the shards this process holds open (reading again opens them again)."""
        files = getattr(self, "_files", None)  # None: __init__ failed before it
        while files:
            files.popitem()[1].close()  # in a forked child, its copy of the descriptor: the parent's stays

    def __del__(self) -> None:
        self.close()

    # ---- the tables --------------------------------------------------------------------------------

    def _label_array(self, *, every: bool = False) -> np.ndarray:
        """Every kept sample's class id (``every``: every sample's), from the index or the shards."""
        if self._label_table is None:
            self._label_table, paths = self._read_tables()
            if self._sources is None:
                self._sources = _Sources(self._first, self.split_info.shards, paths=paths)
        return self._label_table if self._kept is None or every else self._label_table[self._kept]

    def _source_paths(self) -> _Sources:
        """Every sample's source path, by position: the index's tables, or (an older index) the shards'."""
        if self._sources is None:
            tables = self._source_tables
            if tables is None:  # not pickled into a spawn worker: read from the index again
                tables = [s.table("sources") for s in _locate(self.root, self.split)[2].shards]
            if any(t is None for t in tables):
                labels, paths = self._read_tables()
                if self._label_table is None:
                    self._label_table = labels
                self._sources = _Sources(self._first, self.split_info.shards, paths=paths)
            else:
                where = f"{self.root}/{INDEX_NAME}"
                self._sources = _Sources(self._first, self.split_info.shards, tables=tables, where=where)
        return self._sources

    def _valid(self, is_valid_file: Callable[[str], bool], allow_empty: bool) -> np.ndarray:
        """Positions of the samples ``is_valid_file`` keeps; a class left empty raises, as in torchvision."""
        paths = self._source_paths()
        kept = np.fromiter((i for i, path in enumerate(paths) if is_valid_file(path)), np.int64)
        labels = self._label_array()
        if not allow_empty:
            present = np.bincount(labels[kept], minlength=len(self.classes)) > 0
            empty = [name for name, there in zip(self.classes, present, strict=True) if not there]
            if empty:
                raise FileNotFoundError(f"Found no valid file for the classes {', '.join(sorted(empty))}. ")
        return kept

    # ---- reading one sample -----------------------------------------------------------------------

    def _position(self, index: SupportsIndex) -> int:
        """The sample's position in the split."""
        i = operator.index(index)
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {operator.index(index)} of a split of {n}")
        return i if self._kept is None else int(self._kept[i])

    def _shard_number(self, i: int) -> int:
        return int(np.searchsorted(self._first, i, side="right")) - 1

    def _shard_of(self, i: int) -> ShardInfo:
        return self.split_info.shards[self._shard_number(i)]

    def _read(self, i: int) -> tuple[dict[str, bytes], str, int]:
        """Sample ``i``'s members, its image's extension and its class id, read with one ``pread``.

        What is read must be the sample the index names: one sample's members, from its start to the
        next sample's, under the key and with the label of the index's tables.
        """
        s = self._shard_number(i)
        shard = self.split_info.shards[s]
        start = int(self._starts[i]) * BLOCK
        # To the next sample's first header, or the shard's end (its end-of-archive blocks too).
        stop = int(self._starts[i + 1]) * BLOCK if i + 1 < self._first[s + 1] else shard.bytes
        fd, size = self._file(s)
        try:  # no more than the file holds: the index's sizes are untrusted (pread allocates them first)
            data = os.pread(fd, max(0, min(stop, size) - start), start)
        except OSError as e:
            where = self.source.url(shard.name)
            raise ShardReadError(f"cannot read shard {where}: {e}", shard=shard.name) from e
        tar = TarStream(io.BytesIO(data), end=len(data), offset=0)
        member = self._labels.member
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
            elif self._keys is not None and key_digest(sample.key) != self._keys[i]:
                problem = f"is not where the index's table of starts says: {shown(sample.key)} is there"
            else:
                problem = sample_problem(sample.exts, member)
        if problem is None and sample is not None:
            try:
                target = self._class_id(label_value(sample.parts[member], member, self._labels.key))
            except ValueError as e:
                problem = f"has {e}"
            else:
                table = self._label_table
                if table is not None and target != table[i]:
                    problem = f"has label {target} where the index says {table[i]}"
        if problem is not None:
            if len(data) < stop - start:  # the file is shorter than the index says: what explains it
                problem = f"is cut short: the shard ends {len(data)} of its {stop - start} bytes in"
            raise self._damaged(i, shard, None if sample is None else sample.parts, problem)
        assert sample is not None  # a sample without a problem
        ext = next(e for e in sample.parts if e in _IMAGE_EXTS)
        return sample.parts, ext, target

    def _load(self, loader: Callable[[BinaryIO], Any], data: bytes) -> Any:
        """The user's loader on the image's bytes; a loader that opens a path is told what it gets."""
        try:
            return loader(io.BytesIO(data))
        except TypeError as e:
            if "PathLike" not in str(e):
                raise
            raise ConfigError(
                f"ImageFolder's loader {getattr(loader, '__name__', loader)!r} opened its argument as a "
                "path; it gets a file object of the image's bytes (the image is inside a shard): open "
                "it with Image.open(f), or leave loader out (docs/imagefolder.md)"
            ) from None

    def _class_id(self, value: int | str) -> int:
        """The class id of a label value under the split's labels; ValueError naming what is wrong."""
        target = self._labels.class_id(value, self.class_to_idx)
        if not 0 <= target < len(self.classes):
            raise ValueError(f"label {target}, outside the index's classes 0..{len(self.classes) - 1}")
        return target

    def _file(self, s: int) -> tuple[int, int]:
        """Shard ``s``'s descriptor in this process and its size (at most ``max_open`` open, LRU)."""
        if self._pid != os.getpid():  # a forked child: its parent's files stay the parent's
            self.close()
            self._pid = os.getpid()
        files = self._files
        open_file = files.get(s)
        if open_file is not None:
            files.move_to_end(s)
            return open_file.fileno(), self._sizes[s]
        f = self.source.open(self.split_info.shards[s])  # ShardAccessError / ShardReadError name it
        fd = f.fileno()
        if FADVISE_RANDOM:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        files[s], self._sizes[s] = f, os.fstat(fd).st_size
        while len(files) > self.max_open:
            files.popitem(last=False)[1].close()
        return fd, self._sizes[s]

    def _damaged(
        self, i: int, shard: ShardInfo, parts: dict[str, bytes] | None, reason: str
    ) -> CorruptImageError:
        """The error for damaged sample ``i``: its shard and source path (from its ``.json``), what to do."""
        where = f"shard {shard.name}"
        source = source_path({"json": parts.get("json")} if parts else {})
        if source is not None:
            where += f", packed from {shown(source)}"
        return CorruptImageError(
            f"sample {i} of split {self.split!r} at {self.root} ({where}) {reason}: the shard is damaged or "
            f"was rewritten since it was packed; run `imgshards verify {self.root}` to list every damaged "
            "sample, and re-pack (ShardDataset skips and counts such samples)",
            shard=shard.name,
        )

    def _read_tables(self) -> tuple[np.ndarray, list[str]]:
        """Every sample's class id and source path, read from the shards (an index without the tables)."""
        targets = np.empty(int(self._first[-1]), dtype=np.int64)
        sources: list[str] = []
        member, field = self._labels.member, self._labels.key
        for s, shard in enumerate(self.split_info.shards):
            first, count = int(self._first[s]), shard.samples
            with self.source.open(shard) as f:
                tar = TarStream(f, end=os.fstat(f.fileno()).st_size)
                got = 0
                try:
                    for sample, value, problem in checked_samples(tar, member, field, also=("json",)):
                        if sample.index >= count:
                            break
                        if problem is None and value is not None:
                            try:
                                targets[first + sample.index] = self._class_id(value)
                            except ValueError as e:
                                problem = f"has {e}"
                        if problem is not None:
                            raise self._damaged(first + sample.index, shard, None, problem)
                        image = next(e for e in sample.exts if e in _IMAGE_EXTS)
                        sources.append(source_path(sample.parts) or f"{sample.key}.{image}")
                        got += 1
                except ShardFormatError as e:
                    raise self._damaged(first + got, shard, None, f"does not parse: {e}") from None
            if got != count:
                raise self._damaged(first + got, shard, None, f"is missing: the shard holds {got} of {count}")
        return targets, sources


class _Sources:
    """Each sample's source path by its position in the split, inflated one shard at a time.

    The index's tables stay compressed (a few bytes a sample); the shard last read is kept inflated,
    so a walk in order inflates each shard once. An index without the tables gives the paths read
    from the shards, as a list.
    """

    def __init__(
        self,
        first: np.ndarray,
        shards: Sequence[ShardInfo],
        *,
        tables: Sequence[str | None] = (),
        paths: list[str] | None = None,
        where: str = "",
    ) -> None:
        self._first, self._shards, self._tables, self._where = first, shards, tables, where
        self._paths = paths
        self._shard = -1  # the shard last inflated, and its paths
        self._inflated: list[str] = []

    def __len__(self) -> int:
        return int(self._first[-1])

    def path(self, i: int) -> str:
        """Sample ``i``'s source path."""
        if self._paths is not None:
            return self._paths[i]
        s = int(np.searchsorted(self._first, i, side="right")) - 1
        return self._of(s)[i - int(self._first[s])]

    def __iter__(self) -> Iterator[str]:
        if self._paths is not None:
            return iter(self._paths)
        return (path for s in range(len(self._shards)) for path in self._of(s))

    def _of(self, s: int) -> list[str]:
        if s != self._shard:
            shard = self._shards[s]
            try:
                self._inflated = decode_sources(self._tables[s] or "", shard.samples)
            except ValueError as e:
                raise ManifestError(
                    f"{self._where}: the sources of shard {shard.name} are not what they must be ({e}); "
                    "re-pack the dataset"
                ) from None
            self._shard = s
        return self._inflated


class _Samples(Sequence[tuple[str, int]]):
    """``(source path, class id)`` pairs, each made as it is read: torchvision's ``samples``, no tuples."""

    def __init__(self, sources: _Sources, labels: np.ndarray, kept: np.ndarray | None) -> None:
        self._sources, self._labels, self._kept = sources, labels, kept

    def __len__(self) -> int:
        return len(self._labels) if self._kept is None else len(self._kept)

    @overload
    def __getitem__(self, index: int) -> tuple[str, int]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, int]]: ...
    def __getitem__(self, index: int | slice) -> tuple[str, int] | list[tuple[str, int]]:
        if isinstance(index, slice):
            return [self[k] for k in range(*index.indices(len(self)))]
        k = operator.index(index)
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(f"sample {index} of {len(self)}")
        i = k if self._kept is None else int(self._kept[k])
        return self._sources.path(i), int(self._labels[i])

    def __iter__(self) -> Iterator[tuple[str, int]]:
        if self._kept is None:
            return zip(self._sources, self._labels.tolist(), strict=True)
        return (self[k] for k in range(len(self)))  # kept positions increase: each shard inflated once

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (list, tuple, _Samples)) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # as a list's

    def __repr__(self) -> str:
        head = ", ".join(repr(item) for item in self[:3])
        return f"[{head}{', ...' if len(self) > 3 else ''}]  # {len(self):,} samples"


def _locate(root: str | os.PathLike[str], split: str | None) -> tuple[Path, Manifest, SplitInfo]:
    """The packed dataset's directory, its index and the split that ``root`` (and ``split``) name.

    ``root`` is the dataset's directory or index, or ``<dataset>/<split>`` where no such directory
    is (a script's ``os.path.join(data, "train")``).
    """
    path = local_path(root)
    if path.name == INDEX_NAME and path.is_file():
        path = path.parent
    named: str | None = None
    if not os.path.lexists(path / INDEX_NAME) and not os.path.lexists(path):
        parent = path.parent
        if os.path.lexists(parent / INDEX_NAME):
            path, named = parent, path.name
    try:
        manifest = read_manifest(path)  # untrusted: every name, count and table checked
    except ManifestError as e:
        if not os.path.lexists(path) or not os.path.lexists(path / INDEX_NAME):
            raise DatasetNotFoundError(str(e)) from None
        raise
    splits = sorted(manifest.splits)
    if named is not None and split is not None and split != named:
        raise ConfigError(f"{root} names split {named!r}, and split={split!r} another: give one")
    wanted = split or named or ("train" if "train" in splits or len(splits) != 1 else splits[0])
    if wanted not in manifest.splits:
        where = f"{path} (the dataset above {root})" if named else str(path)
        raise DatasetNotFoundError(
            f"no split {wanted!r} in the packed dataset at {where}; its splits are {splits}: give "
            f"ImageFolder('{path}/<split>') or ImageFolder('{path}', split=...) with one of them"
        )
    return path, manifest, manifest.split(wanted)


def _joined(shards: Sequence[ShardInfo], table: str, dtype: type) -> np.ndarray | None:
    """Table ``table`` of every shard, end to end; None where a shard has none."""
    texts = [s.table(table) for s in shards]
    if any(t is None for t in texts):
        return None
    out = np.empty(sum(s.samples for s in shards), dtype=dtype)
    at = 0
    for shard, text in zip(shards, texts, strict=True):
        values = np.frombuffer(decode_table(text or ""), dtype=np.uint32)
        out[at : at + len(values)] = values  # one entry a sample: read_manifest checked the count
        at += shard.samples
    return out


def _id_type(classes: int) -> type:
    return np.uint16 if classes <= 1 << 16 else np.uint32


def _without_tables(shard: ShardInfo) -> ShardInfo:
    """A shard's entry without its tables (held once, in the arrays): what every worker gets a copy of."""
    return replace(shard, offsets=None, labels=None, keys=None, sources=None)


def _format_of(data: bytes) -> str:
    """An image member's extension from its first bytes, for the decoder's choice of path."""
    return "jpg" if data[:3] == b"\xff\xd8\xff" else "png"
