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

Building it reads only ``index.json`` (no listing) and touches no sample's entry: the split's tables
(:mod:`imgshards.converter.format.tablefiles`: where each sample starts, its class id, its key's
CRC-32, its source path) are files mapped read-only when first used, so forked and spawned workers
alike share one copy in the page cache, and the pickle a spawned worker gets is O(shards).
``targets`` is made from the table of labels when first asked for, ``samples`` reads the source
paths a shard at a time; neither opens a shard. A sample is read by the one reader of every imgshards
dataset, :class:`~imgshards.loader.pipeline.splitreader.SplitReader` (``ds[i]`` is its
:meth:`~imgshards.loader.pipeline.splitreader.SplitReader.sample`: one ``pread`` from the sample's
first tar header to the next sample's, parsed by the format's one tar parser, checked to be the
sample the tables name; at most ``max_open`` shards open per process; a shard opened only while the
dataset's index is the one read), and its image decoded by
:func:`~imgshards.loader.image.decode.pil_image` (the same bounds, before any decode, as
``ShardDataset``'s decoder), or handed to a ``loader`` as a file object of its bytes.

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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, SupportsIndex, overload

import numpy as np
from torchvision.datasets import VisionDataset
from torchvision.datasets import folder as torchvision_folder

from imgshards.converter.format.errors import ManifestError
from imgshards.converter.format.locate import INDEX_NAME, is_url, local_path
from imgshards.converter.format.manifest import Manifest, SplitInfo, read_manifest
from imgshards.converter.format.tablefiles import SplitTables

from .errors import ConfigError, DatasetNotFoundError
from .image.decode import pil_image
from .pipeline.splitreader import DEFAULT_MAX_OPEN, IndexStamp, SplitReader
from .remote import ShardSource

__all__ = ["DEFAULT_MAX_OPEN", "ImageFolder", "default_loader"]

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
        reader: How its samples are read (:class:`~.pipeline.splitreader.SplitReader`, the reader of
            every imgshards dataset): the split's tables and the shards open in this process.

    Raises:
        DatasetNotFoundError: no packed dataset at ``root``, or no such split (a
            ``FileNotFoundError`` and a ``ManifestError``); the message names the splits there.
        FileNotFoundError: a class is left with no sample by ``is_valid_file`` (without
            ``allow_empty``), as torchvision's.
        ManifestError: a bad index, or a missing shard.
        ConfigError: ``root`` is a URL; ``max_open < 1``; the split has no table of sample starts.

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
        path, manifest, split_info, stamp = _locate(root, split)
        super().__init__(str(path), transform=transform, target_transform=target_transform)
        self.root: str = str(path)
        self.split = split_info.name
        self.loader = loader
        self.extensions = torchvision_folder.IMG_EXTENSIONS if is_valid_file is None else None
        source = ShardSource(path)  # opens a shard as ShardDataset does: regular, inside the root
        source.check(split_info.shards, self.split)
        self.classes, self.class_to_idx = list(manifest.classes), manifest.class_to_idx
        # The one reader of every dataset: the split's tables (mapped, never copied: nothing here
        # touches a sample's entries), its shards opened as the index read describes them.
        self.reader = SplitReader(
            split_info,
            manifest.classes,
            source,
            stamp=stamp,
            max_open=max_open,
            fadvise_random=FADVISE_RANDOM,
        )
        self.reader.require_starts()
        self._kept: np.ndarray | None = None  # positions in the split of the samples is_valid_file kept
        self._targets: list[int] | None = None
        self._samples: _Samples | None = None
        self._read_back: tuple[np.ndarray, list[str]] | None = None  # an index without the tables
        if is_valid_file is not None:
            self._kept = self._valid(is_valid_file, allow_empty)

    @property
    def max_open(self) -> int:
        """Most shards each process keeps open."""
        return self.reader.max_open

    # ---- what torchvision's ImageFolder has -----------------------------------------------------

    def __len__(self) -> int:
        """The number of samples (those ``is_valid_file`` kept)."""
        return self.reader.tables.samples if self._kept is None else len(self._kept)

    def __getitem__(self, index: SupportsIndex) -> tuple[Any, Any]:
        """Sample ``index``: ``(transform(image), target_transform(class id))``; the image a PIL RGB one.

        Raises:
            IndexError: ``index`` is out of range (negative ones count from the end, as a list's).
            CorruptImageError: the sample is damaged, or is not where the index says; the message
                names it, its shard and its source.
            ShardReadError: the shard cannot be read (an I/O error); ShardAccessError: it is gone,
                or the dataset was re-packed since this one was made.

        """
        i = self._position(index)
        parts, ext, target = self.reader.sample(i)
        img: Any
        loader = self.loader
        if loader is default_loader or loader in _TORCHVISION_LOADERS:
            try:
                img = pil_image(parts[ext], ext)
            except ValueError as e:
                raise self.reader.damaged(i, parts, f"has an image that does not decode ({e})") from None
        else:
            img = self._load(loader, parts[ext])
        if self.transform is not None:
            img = self.transform(img)
        out: Any = target if self.target_transform is None else self.target_transform(target)
        return img, out

    @property
    def targets(self) -> list[int]:
        """The class id of every sample, in the dataset's order: a list, as torchvision's ``targets``.

        From the split's table of labels (no shard opened), built on first use and kept; a process
        that never reads it (a DataLoader worker) never builds it. An index without the table
        (written before it) has each sample's label read from the shards instead, once.
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
        from the split's tables (no shard opened): each item is made when it is read, so a million
        samples cost their paths' bytes, not a million tuples.
        """
        if self._samples is None:
            self._samples = _Samples(self._source_paths(), self._label_array(every=True), self._kept)
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

    # ---- pickling into spawn workers: no open file, no list crosses -------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_targets": None, "_samples": None, "_read_back": None}

    def close(self) -> None:
        """Close the shards this process holds open (reading again opens them again)."""
        reader = self.__dict__.get("reader")  # None: __init__ failed before it
        if reader is not None:
            reader.close()

    # ---- the tables --------------------------------------------------------------------------------

    def _label_array(self, *, every: bool = False) -> np.ndarray:
        """Every kept sample's class id (``every``: every sample's), from the table or the shards."""
        labels = self.reader.tables.all_labels()  # the map itself, checked: no copy
        if labels is None:
            labels = self._from_shards()[0]
        return labels if self._kept is None or every else labels[self._kept]

    def _source_paths(self) -> _Sources:
        """Every sample's source path, by position: the split's table, or (an older index) the shards'."""
        tables = self.reader.tables
        if tables.has("sources"):
            return _Sources(tables)
        return _Sources(tables, paths=self._from_shards()[1])

    def _from_shards(self) -> tuple[np.ndarray, list[str]]:
        """Every sample's class id and source path, read from the shards once (an index without tables)."""
        if self._read_back is None:
            self._read_back = self.reader.labels_and_sources()
        return self._read_back

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

    def _read(self, i: int) -> tuple[dict[str, bytes], str, int]:
        """Sample ``i``'s members, its image's extension and its class id (``bench/imagefolder.py reads``)."""
        return self.reader.sample(i)

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


class _Sources:
    """Each sample's source path by its position in the split, from the split's table a shard at a time.

    The table is read (inflated) a shard at a time, its last shards kept (:class:`SplitTables`), so
    a walk in order inflates each shard once. An index without the table gives the paths read from
    the shards, as a list.
    """

    def __init__(self, tables: SplitTables, *, paths: list[str] | None = None) -> None:
        self._tables, self._paths = tables, paths

    def __len__(self) -> int:
        return self._tables.samples

    def path(self, i: int) -> str:
        """Sample ``i``'s source path."""
        if self._paths is not None:
            return self._paths[i]
        s = self._tables.shard_of(i)
        return self._of(s)[i - int(self._tables.first[s])]

    def __iter__(self) -> Iterator[str]:
        if self._paths is not None:
            return iter(self._paths)
        return (path for s in range(len(self._tables.first) - 1) for path in self._of(s))

    def _of(self, s: int) -> list[str]:
        paths = self._tables.sources(s)
        assert paths is not None  # the split has the table: checked before this was made
        return paths


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


def _locate(
    root: str | os.PathLike[str], split: str | None
) -> tuple[Path, Manifest, SplitInfo, IndexStamp | None]:
    """The packed dataset's directory, its index, the split that ``root`` (and ``split``) name, the stamp.

    ``root`` is the dataset's directory or index, or ``<dataset>/<split>`` where no such directory
    is (a script's ``os.path.join(data, "train")``). The stamp is the index's file, taken before it
    is read (:class:`~.pipeline.splitreader.IndexStamp`).
    """
    path = local_path(root)
    if path.name == INDEX_NAME and path.is_file():
        path = path.parent
    named: str | None = None
    if not os.path.lexists(path / INDEX_NAME) and not os.path.lexists(path):
        parent = path.parent
        if os.path.lexists(parent / INDEX_NAME):
            path, named = parent, path.name
    stamp = IndexStamp.of(path)
    try:
        manifest = read_manifest(path)  # untrusted: every name, count and size checked
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
    return path, manifest, manifest.split(wanted), stamp


def _format_of(data: bytes) -> str:
    """An image member's extension from its first bytes, for the decoder's choice of path."""
    return "jpg" if data[:3] == b"\xff\xd8\xff" else "png"
