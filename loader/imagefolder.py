"""``ImageFolder``: torchvision's ``ImageFolder`` over a packed split, a map-style dataset.

For a script written for ``torchvision.datasets.ImageFolder(root, transform)`` and a
``DataLoader(..., shuffle=True, num_workers=...)``: the switch is the import, and every sampler,
transform (v1 or v2), collate and worker start method keeps working. The constructor is
torchvision's (``root, transform, target_transform, loader, is_valid_file, allow_empty``), and so are
``ds[i]`` (``(transform(PIL RGB image), target_transform(class id))``), ``classes``,
``class_to_idx``, ``targets`` (a list), ``samples`` and ``imgs`` (``(path, class id)``, the path
torchvision gives: the source file's, in the tree ``pack`` read), ``extensions``, ``find_classes``
and the ``repr``. ``root`` is a packed dataset's directory, or ``<packed directory>/<split>`` as a
script joins ``os.path.join(data, "train")``. The samples are numbered in the order they are packed
(shuffled by ``pack``), not in ImageFolder's sorted order: ``targets[i]`` is ``ds[i]``'s label.

torchvision's extension points work as there: a subclass's ``find_classes`` chooses the classes and
their ids (the samples of the others left out, the rest relabelled), ``ds.samples = ...`` (a subset
or a reordering of the split's samples, by path) makes the dataset those samples, and
``self.loader(path)`` in a subclass's ``__getitem__`` reads the sample that ``samples`` names so.

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
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, SupportsIndex, overload

import numpy as np
from torchvision.datasets import folder as torchvision_folder

from imgshards.converter.format.errors import ManifestError, shown
from imgshards.converter.format.locate import INDEX_NAME, is_url, local_path
from imgshards.converter.format.manifest import Manifest, SplitInfo, read_manifest
from imgshards.converter.format.tablefiles import SplitTables

from .errors import ConfigError, DatasetNotFoundError
from .image.decode import pil_image
from .pipeline.splitreader import DEFAULT_MAX_OPEN, IndexStamp, SplitReader
from .remote import ShardSource
from .workers import socket_safe_tempdir

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    class VisionDataset(Dataset[tuple[Any, Any]]):
        """torchvision's ``VisionDataset``, as ImageFolder inherits it, for type checkers.

        torchvision ships no ``py.typed``: to a type checker its own class is Any, and a class built
        on Any takes any attribute, so a user's typo (``ds.clases``) would pass unseen.
        """

        root: str
        transform: Callable[..., Any] | None
        target_transform: Callable[..., Any] | None
        transforms: Callable[..., Any] | None

        def __init__(
            self,
            root: str | Path | None = None,
            transforms: Callable[..., Any] | None = None,
            transform: Callable[..., Any] | None = None,
            target_transform: Callable[..., Any] | None = None,
        ) -> None: ...

        def extra_repr(self) -> str:
            """Lines under the dataset's name in its ``repr``."""
            ...

else:
    from torchvision.datasets import VisionDataset

__all__ = ["DEFAULT_MAX_OPEN", "ImageFolder", "default_loader"]

# POSIX_FADV_RANDOM on every shard opened: off. Measured with bench/imagefolder.py --fadvise (docs/
# imagefolder.md): no gain, cold or warm; Linux already reads an isolated random read of under
# 128 KB as just its pages, and read-ahead past a larger one is read by a later sample. A switch for
# that bench, not an option.
FADVISE_RANDOM = False
# torchvision's loaders open a path: given one, ImageFolder decodes as its own default does.
_TORCHVISION_LOADERS = (torchvision_folder.default_loader, torchvision_folder.pil_loader)
# The paths ``samples[i]`` last gave, to their positions: ``self.loader(path)`` right after it (a
# subclass's ``__getitem__``) finds its sample without a table of every path.
_RECENT_PATHS = 256
# Paths fetched at a time, sorted by position, for a walk over reordered samples (each shard's
# paths inflated about once a chunk, not once a sample).
_CHUNK = 1 << 20


def default_loader(f: BinaryIO) -> Any:
    """``ImageFolder``'s loader: the image in file object ``f`` as an RGB PIL image, upright.

    As :func:`~imgshards.loader.image.decode.pil_image` decodes (pixel bounds checked before any
    decode), where torchvision's ``default_loader`` opens a path. A dataset's ``ds.loader`` (this
    one, bound to the dataset) also takes a path of its ``samples``.

    Raises:
        TypeError: ``f`` is a path (this function has no dataset to find it in).

    """
    if isinstance(f, (str, os.PathLike)):
        raise TypeError(
            f"default_loader reads a file object of an image's bytes, not the path "
            f"{shown(os.fspath(f), quoted=True)}: a path of an ImageFolder's samples names a sample "
            "inside a shard; read it with ds.loader(path), or sample i with ds[i]"
        )
    data = f.read()
    return pil_image(data, _format_of(data))


class ImageFolder(VisionDataset):
    """A packed split as a map-style dataset: ``torchvision.datasets.ImageFolder``'s API.

    ``from imgshards.loader import ImageFolder`` and ``ImageFolder("shards/train", transform)``
    replace ``datasets.ImageFolder("photos/train", transform)`` after ``imgshards pack photos/train
    shards``.

    Args:
        root: The packed dataset's directory (holding ``index.json``), its ``index.json``, or
            ``<packed directory>/<split>``: the split of the dataset above it where ``<split>`` is
            no packed dataset itself (a packed dataset at the path wins over a split of its parent:
            it is the one the path names). So ``ImageFolder("data/train")`` reads split ``train``
            after ``imgshards pack data/train data``, whether or not the tree ``data/train`` is still
            there. A local path: a URL fails at once, naming ``ShardDataset``, which streams one.
        transform: Called on each image, a PIL RGB image (any torchvision v1 or v2 transform).
        target_transform: Called on each class id.
        loader: Called with a binary file object of a sample's image bytes (not a path: the image is
            inside a shard); returns the image handed to ``transform``. ``Image.open(f)`` takes it;
            torchvision's ``default_loader`` and ``pil_loader`` (which open a path) are taken as
            :func:`default_loader`, and ``ds.loader`` is then bound to the dataset: given a path of
            its ``samples``, it reads that sample's image.
        is_valid_file: Called with each sample's path (as in ``samples``) as the dataset is built;
            the samples it refuses are left out.
        allow_empty: Keep a class left with no sample (by ``is_valid_file``, or a class that
            ``find_classes`` names and the split lacks) instead of raising.
        split: Which split of the dataset; None: the one ``root`` names, else ``"train"``, else the
            dataset's only split.
        max_open: Most shards each process keeps open.

    Attributes:
        classes: Class names, sorted as ImageFolder sorts them (or as a subclass's ``find_classes``
            gives them).
        class_to_idx: Class name to class id. Set after the dataset is made, it changes nothing read
            (as torchvision's: the ids are chosen when the dataset is made).
        samples: ``(path, class id)`` of each sample; assigning a subset or reordering of them (by
            path) makes the dataset those samples, with those class ids.
        imgs, targets: As torchvision's: read from the samples; set, they are kept as set and
            change nothing read.
        extensions: torchvision's image extensions, or None with ``is_valid_file``, as torchvision's.
        root: The dataset's directory; ``split``: the split read.
        reader: How its samples are read (:class:`~.pipeline.splitreader.SplitReader`, the reader of
            every imgshards dataset): the split's tables and the shards open in this process.

    Raises:
        DatasetNotFoundError: no packed dataset at ``root``, or no such split (a
            ``FileNotFoundError`` and a ``ManifestError``); the message names the splits there.
        FileNotFoundError: a class is left with no sample (without ``allow_empty``), as torchvision's.
        ValueError: ``find_classes`` gave no class, or an id that is not an integer.
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
        socket_safe_tempdir()  # before any DataLoader forks its workers: they inherit it
        self._tree = _tree_of(split_info)  # where the samples' paths are: the tree pack read, if here
        # Which samples, and their class ids: None where they are the split's, as its tables say.
        self._kept: np.ndarray | None = None  # the dataset's samples: their positions in the split
        self._class_ids: np.ndarray | None = None  # an index class id -> this dataset's (find_classes)
        self._assigned: np.ndarray | None = None  # each sample's class id, as ``samples`` was set
        self._targets_set: list[Any] | None = None  # ``targets`` and ``imgs`` as set: kept, never read
        self._imgs_set: Sequence[Any] | None = None
        # Built when first used in a process, never pickled.
        self._targets: list[int] | None = None
        self._samples: _Samples | None = None
        self._read_back: tuple[np.ndarray, list[str]] | None = None  # an index without the tables
        self._by_path: dict[str, int] | None = None
        self._recent: OrderedDict[str, int] = OrderedDict()
        # As torchvision's DatasetFolder: the classes from find_classes (a subclass's, if it has
        # one), then the samples of those classes that is_valid_file keeps.
        self.classes, self.class_to_idx = self.find_classes(self.root)
        self._make_dataset(self.class_to_idx, is_valid_file, allow_empty)

    @property
    def max_open(self) -> int:
        """Most shards each process keeps open."""
        return self.reader.max_open

    # ---- what torchvision's ImageFolder has -----------------------------------------------------

    def __len__(self) -> int:
        """The number of samples (those ``is_valid_file`` and ``find_classes`` kept, or as set)."""
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
        k = self._index(index)
        i = k if self._kept is None else int(self._kept[k])
        parts, ext, target = self.reader.sample(i)
        if self._assigned is not None:
            target = int(self._assigned[k])
        elif self._class_ids is not None:
            target = int(self._class_ids[target])
        img: Any
        loader = self._loader
        if loader is default_loader or loader in _TORCHVISION_LOADERS:
            img = self._image(i, parts, ext)
        else:
            img = self._load(loader, parts[ext])
        if self.transform is not None:
            img = self.transform(img)
        out: Any = target if self.target_transform is None else self.target_transform(target)
        return img, out

    @property
    def loader(self) -> Callable[[Any], Any]:
        """The loader: the one given, or (the default) :func:`default_loader` bound to this dataset.

        The bound default also takes a path of ``samples`` (``self.loader(path)``, as a subclass's
        ``__getitem__`` calls torchvision's), and reads that sample's image from its shard.
        """
        loader = self._loader
        if loader is default_loader or loader in _TORCHVISION_LOADERS:
            return _SampleLoader(self)
        return loader

    @loader.setter
    def loader(self, value: Callable[[Any], Any]) -> None:
        self._loader = default_loader if isinstance(value, _SampleLoader) else value

    @property
    def targets(self) -> list[int]:
        """The class id of every sample, in the dataset's order: a list, as torchvision's ``targets``.

        From the split's table of labels (no shard opened), built on first use and kept; a process
        that never reads it (a DataLoader worker) never builds it. An index without the table
        (written before it) has each sample's label read from the shards instead, once. Set, it is
        kept as set and read by nothing else, as torchvision's attribute (``ds[i]``'s class id is
        ``samples[i]``'s).
        """
        if self._targets_set is not None:
            return self._targets_set
        if self._targets is None:
            self._targets = _int_list(self._target_array())
        return self._targets

    @targets.setter
    def targets(self, value: list[Any]) -> None:
        self._targets_set = value

    @property
    def samples(self) -> Sequence[tuple[str, int]]:
        """``(path, class id)`` of every sample, in the dataset's order, as torchvision's ``samples``.

        The path is the file's in the tree that was packed (``/data/photos/train/cat/0001.jpg``, the
        tree as ``pack`` resolved it), as torchvision's ImageFolder of that tree gives it; where that
        tree is not a directory on this machine (deleted, or packed elsewhere), and for shards that
        ``imgshards index`` indexed, the path relative to the tree (``cat/0001.jpg``; for another
        tool's shards, the image member's name). Either way a name from the index, never opened
        here: ``ds.loader(path)`` reads the sample from its shard. A sequence built on first use
        from the split's tables (no shard opened): each item is made when it is read, so a million
        samples cost their paths' bytes, not a million tuples.

        Set to ``(path, class id)`` pairs of this split's samples (a subset, a reordering, other
        class ids), it makes the dataset those samples, as torchvision's: ``len``, ``ds[i]``,
        ``targets`` and ``imgs`` follow (those last two unless set themselves).

        Raises (when set):
            ValueError: a pair that is not one, or whose path is no sample of the split (named).

        """
        if self._samples is None:
            self._samples = _Samples(self._source_paths(), self._target_array(), self._kept, self._recent)
        return self._samples

    @samples.setter
    def samples(self, value: Iterable[tuple[str, int]]) -> None:
        if value is self._samples:
            return
        items = value if isinstance(value, Sized) else list(value)
        positions = np.empty(len(items), dtype=np.int64)
        ids = np.empty(len(items), dtype=np.int64)
        for k, item in enumerate(items):
            try:
                path, target = item
                ids[k] = operator.index(target)
            except (TypeError, ValueError, OverflowError):
                raise ValueError(
                    f"samples are (path, class id) pairs, as ImageFolder's; item {k} is {shown(repr(item))}"
                ) from None
            positions[k] = self._position_of(path, ValueError, f"item {k} of the samples set")
        total = self.reader.tables.samples
        whole = len(positions) == total and np.array_equal(positions, np.arange(total))
        self._kept = None if whole else positions
        labels = self._table_labels()[positions]
        natural = labels if self._class_ids is None else self._class_ids[labels]
        self._assigned = None if np.array_equal(ids, natural) else ids
        self._samples = self._targets = None

    @property
    def imgs(self) -> Sequence[Any]:
        """As :attr:`samples`, as torchvision's ``imgs``; set, it is kept as set and read by nothing else."""
        return self.samples if self._imgs_set is None else self._imgs_set

    @imgs.setter
    def imgs(self, value: Sequence[Any]) -> None:
        self._imgs_set = value

    def find_classes(self, directory: str | os.PathLike[str]) -> tuple[list[str], dict[str, int]]:
        """The class names and ids at ``directory``: a packed dataset's, from its index; a tree's folders.

        The dataset's own root (what ``__init__`` asks for, as torchvision's) answers from the index
        already read. A directory holding no ``index.json`` is taken as an ImageFolder tree and its
        class folders listed, as torchvision's ``find_classes`` lists them. A subclass may override
        it to keep some classes or number them otherwise: the dataset then holds the samples of the
        classes it names, each with its id there.

        Raises:
            DatasetNotFoundError: no packed dataset there (a ``FileNotFoundError``).
            FileNotFoundError: a directory without an index and without a class folder.

        """
        reader = self.__dict__.get("reader")
        if reader is not None and os.fspath(directory) == self.root:
            return list(reader.classes), dict(reader.class_to_idx)
        path = local_path(directory)
        if path.is_dir() and not os.path.lexists(path / INDEX_NAME):
            found: tuple[list[str], dict[str, int]] = torchvision_folder.find_classes(path)
            return found
        manifest = _locate(directory, None)[1]
        return list(manifest.classes), manifest.class_to_idx

    def extra_repr(self) -> str:
        """The split, under torchvision's ``Dataset ImageFolder`` / ``Number of datapoints`` lines."""
        return f"Split: {self.split}"

    # ---- pickling into spawn workers: no open file, no list crosses -------------------------------

    def __getstate__(self) -> dict[str, Any]:
        dropped = {"_targets": None, "_samples": None, "_read_back": None, "_by_path": None}
        return {**self.__dict__, **dropped, "_recent": OrderedDict()}

    def close(self) -> None:
        """Close the shards this process holds open (reading again opens them again)."""
        reader = self.__dict__.get("reader")  # None: __init__ failed before it
        if reader is not None:
            reader.close()

    # ---- which samples, with which class ids ------------------------------------------------------

    def _make_dataset(
        self,
        class_to_idx: Mapping[str, int],
        is_valid_file: Callable[[str], bool] | None,
        allow_empty: bool,
    ) -> None:
        """Keep the samples of the classes ``class_to_idx`` names that ``is_valid_file`` takes.

        The index's classes and ids (the default ``find_classes``) without ``is_valid_file`` touch
        no table entry. Other classes or ids: a numpy pass over the table of labels, the samples of
        the classes left out dropped and the others' ids mapped, as torchvision's ``make_dataset``
        gives them. A class with no sample then raises as torchvision's (``allow_empty`` keeps it).
        """
        index_ids = self.reader.class_to_idx
        custom = dict(class_to_idx) != index_ids
        if custom:
            if not class_to_idx:
                raise ValueError("'class_to_index' must have at least one entry to collect any samples.")
            ids = np.zeros(len(index_ids), dtype=np.int64)
            named = np.zeros(len(index_ids), dtype=bool)
            for name, value in class_to_idx.items():
                try:
                    class_id = operator.index(value)
                except TypeError:
                    raise ValueError(
                        f"find_classes gave class {shown(str(name), quoted=True)} the id "
                        f"{shown(repr(value))}: a class id is an integer"
                    ) from None
                j = index_ids.get(name)
                if j is not None:
                    ids[j], named[j] = class_id, True
            if not np.array_equal(ids, np.arange(len(ids))):
                self._class_ids = ids
            if not named.all():
                self._kept = np.flatnonzero(named[self._table_labels()])
        if is_valid_file is not None:
            self._kept = self._valid(is_valid_file, self._kept)
        if (custom or is_valid_file is not None) and not allow_empty:
            labels = self._table_labels()
            counts = np.bincount(
                labels if self._kept is None else labels[self._kept], minlength=len(index_ids)
            )
            empty = [name for name in class_to_idx if name not in index_ids or not counts[index_ids[name]]]
            if empty:
                msg = f"Found no valid file for the classes {', '.join(sorted(empty))}. "
                if self.extensions is not None:
                    msg += f"Supported extensions are: {', '.join(self.extensions)}"
                raise FileNotFoundError(msg)

    def _valid(self, is_valid_file: Callable[[str], bool], among: np.ndarray | None) -> np.ndarray:
        """The positions (of ``among``, or of the split) of the samples ``is_valid_file`` keeps."""
        paths = self._source_paths()
        if among is None:
            return np.fromiter((i for i, path in enumerate(paths) if is_valid_file(path)), np.int64)
        kept: np.ndarray = among[np.fromiter(map(is_valid_file, paths.at(among)), bool, count=len(among))]
        return kept

    def _position_of(self, path: object, error: type[Exception], what: str) -> int:
        """The position in the split of the sample whose ``samples`` path is ``path``; else ``error``.

        The paths ``samples[i]`` last gave are looked up first; then a table of every path to its
        position, built once a process when first needed (O(samples), never pickled).
        """
        text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
        i = None if text is None else self._recent.get(text)
        if i is not None:
            return i
        if self._by_path is None:
            by_path: dict[str, int] = {}
            for i, name in enumerate(self._source_paths()):
                if by_path.setdefault(name, i) != i:
                    by_path[name] = -1  # a path several samples have: it names none of them
            self._by_path = by_path
        i = None if text is None else self._by_path.get(text)
        if i is None:
            raise error(
                f"{what}, {shown(repr(path))}, is not the path of a sample of split {self.split!r} at "
                f"{self.root} (a path as ImageFolder's samples give it): read sample i with ds[i]"
            )
        if i < 0:
            raise error(
                f"{what}, {shown(text or '', quoted=True)}, is the path of several samples of split "
                f"{self.split!r} at {self.root} (shards another tool wrote): it names none; read sample i "
                "with ds[i]"
            )
        return i

    # ---- the tables --------------------------------------------------------------------------------

    def _table_labels(self) -> np.ndarray:
        """Every sample of the split's index class id, by position: the table (no copy), or the shards'."""
        labels = self.reader.tables.all_labels()  # the map itself, checked: no copy
        return self._from_shards()[0] if labels is None else labels

    def _target_array(self) -> np.ndarray:
        """Each of the dataset's samples' class id, in its order (the table itself where it is all)."""
        if self._assigned is not None:
            return self._assigned
        labels = self._table_labels()
        if self._kept is not None:
            labels = labels[self._kept]
        return labels if self._class_ids is None else self._class_ids[labels]

    def _source_paths(self) -> _Sources:
        """Every sample's path, by position: the split's table, or (an older index) the shards'."""
        tables = self.reader.tables
        prefix = "" if self._tree is None else self._tree + os.sep
        if tables.has("sources"):
            return _Sources(tables, prefix)
        return _Sources(tables, prefix, paths=self._from_shards()[1])

    def _from_shards(self) -> tuple[np.ndarray, list[str]]:
        """Every sample's class id and source path, read from the shards once (an index without tables)."""
        if self._read_back is None:
            self._read_back = self.reader.labels_and_sources()
        return self._read_back

    # ---- reading one sample -----------------------------------------------------------------------

    def _index(self, index: SupportsIndex) -> int:
        """The sample's index in the dataset, checked (negative ones from the end)."""
        i = operator.index(index)
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {operator.index(index)} of a split of {n}")
        return i

    def _read(self, i: int) -> tuple[dict[str, bytes], str, int]:
        """Sample ``i``'s members, its image's extension and its class id (``bench/imagefolder.py reads``)."""
        return self.reader.sample(i)

    def _image(self, i: int, parts: dict[str, bytes], ext: str) -> Any:
        """Sample ``i``'s image, decoded as :func:`default_loader` decodes; a damaged one raises."""
        try:
            return pil_image(parts[ext], ext)
        except ValueError as e:
            raise self.reader.damaged(i, parts, f"has an image that does not decode ({e})") from None

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


class _SampleLoader:
    """:func:`default_loader` bound to a dataset: the image of a file object, or of a path of its samples.

    What ``ds.loader`` is by default: ``self.loader(path)`` with ``path`` from ``self.samples`` (a
    subclass's ``__getitem__``, as torchvision's ``DatasetFolder`` reads) reads that sample from its
    shard, decoded as ``ds[i]`` decodes it. Nothing is opened by its path.
    """

    def __init__(self, dataset: ImageFolder) -> None:
        self.dataset = dataset

    def __call__(self, f: BinaryIO | str | os.PathLike[str]) -> Any:
        if not isinstance(f, (str, os.PathLike)):
            return default_loader(f)
        ds = self.dataset
        i = ds._position_of(f, FileNotFoundError, "ImageFolder's loader was given a path")
        parts, ext, _ = ds.reader.sample(i)
        return ds._image(i, parts, ext)

    def __repr__(self) -> str:
        return f"<imgshards default_loader of {self.dataset.root}, split {self.dataset.split!r}>"


class _Sources:
    """Each sample's path by its position in the split, from the split's table a shard at a time.

    The table is read (inflated) a shard at a time, its last shards kept (:class:`SplitTables`), so
    a walk in order inflates each shard once. An index without the table gives the paths read from
    the shards, as a list. Each path is ``prefix`` (the tree's directory, or nothing) and the path
    recorded, joined as it is read.
    """

    def __init__(self, tables: SplitTables, prefix: str, *, paths: list[str] | None = None) -> None:
        self._tables, self._prefix, self._paths = tables, prefix, paths

    def __len__(self) -> int:
        return int(self._tables.samples)

    def path(self, i: int) -> str:
        """Sample ``i``'s path."""
        if self._paths is not None:
            return self._prefix + self._paths[i]
        s = self._tables.shard_of(i)
        return self._prefix + self._of(s)[i - int(self._tables.first[s])]

    def at(self, positions: np.ndarray) -> Iterator[str]:
        """The paths of the samples at ``positions``, in that order: read by position, a chunk at a time."""
        increasing = len(positions) < 2 or bool(np.all(positions[1:] >= positions[:-1]))
        if increasing:  # each shard inflated once
            return (self.path(i) for i in positions.tolist())
        return (
            path for c in range(0, len(positions), _CHUNK) for path in self._chunk(positions[c : c + _CHUNK])
        )

    def _chunk(self, positions: np.ndarray) -> list[str]:
        order = np.argsort(positions, kind="stable").tolist()
        got = positions.tolist()
        out = [""] * len(got)
        for k in order:
            out[k] = self.path(got[k])
        return out

    def __iter__(self) -> Iterator[str]:
        prefix = self._prefix
        if self._paths is not None:
            return (prefix + path for path in self._paths)
        return (prefix + path for s in range(len(self._tables.first) - 1) for path in self._of(s))

    def _of(self, s: int) -> list[str]:
        paths: list[str] | None = self._tables.sources(s)
        assert paths is not None  # the split has the table: checked before this was made
        return paths


class _Samples(Sequence[tuple[str, int]]):
    """``(path, class id)`` pairs, each made as it is read: torchvision's ``samples``, no tuples.

    ``targets`` holds each of the dataset's samples' class id, in its order; ``kept`` their
    positions in the split (None: all of them). Each path ``[k]`` gives is noted in ``recent`` (the
    dataset's), for a ``loader(path)`` that follows it.
    """

    def __init__(
        self, sources: _Sources, targets: np.ndarray, kept: np.ndarray | None, recent: OrderedDict[str, int]
    ) -> None:
        self._sources, self._targets, self._kept, self._recent = sources, targets, kept, recent

    def __len__(self) -> int:
        return len(self._targets)

    @overload
    def __getitem__(self, index: int) -> tuple[str, int]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, int]]: ...
    def __getitem__(self, index: int | slice) -> tuple[str, int] | list[tuple[str, int]]:
        if isinstance(index, slice):
            ks = np.arange(*index.indices(len(self)), dtype=np.int64)
            positions = ks if self._kept is None else self._kept[ks]
            return list(zip(self._sources.at(positions), self._targets[ks].tolist(), strict=True))
        k = operator.index(index)
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(f"sample {index} of {len(self)}")
        i = k if self._kept is None else int(self._kept[k])
        path = self._sources.path(i)
        recent = self._recent
        recent[path] = i
        if len(recent) > _RECENT_PATHS:
            recent.popitem(last=False)
        return path, int(self._targets[k])

    def __iter__(self) -> Iterator[tuple[str, int]]:
        if self._kept is None:
            return zip(self._sources, self._targets.tolist(), strict=True)
        return zip(self._sources.at(self._kept), self._targets.tolist(), strict=True)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (list, tuple, _Samples)) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # as a list's

    def __repr__(self) -> str:
        head = ", ".join(repr(item) for item in self[:3])
        return f"[{head}{', ...' if len(self) > 3 else ''}]  # {len(self):,} samples"


_CHUNK = 1 << 20  # ids converted to Python ints at a time


def _int_list(ids: np.ndarray) -> list[int]:
    """``ids`` as a list of ints, one int object per distinct small id (8 bytes a sample, not 36).

    Converted a chunk at a time: ``ids.tolist()`` whole would make an int object a sample first
    (28 bytes each: 2.8 GB at 100 M samples, which the allocator keeps after it is freed).
    """
    if len(ids) and int(ids.min()) >= 0 and int(ids.max()) < 1 << 16:
        ints = list(range(int(ids.max()) + 1))
        out: list[int] = []
        for at in range(0, len(ids), _CHUNK):
            out.extend(map(ints.__getitem__, ids[at : at + _CHUNK].tolist()))
        return out
    return [int(x) for x in ids.tolist()]


def _tree_of(split: SplitInfo) -> str | None:
    """The tree ``pack`` read the split from (its ``pack.source``), if it is a directory here; else None.

    The samples' paths are files of it, as torchvision's ImageFolder of it names them. Untrusted text:
    only an absolute path of printable characters is taken. None for shards ``imgshards index``
    indexed (no tree), or a tree gone or elsewhere: the paths stay relative to it.
    """
    source = split.pack_args.get("source")
    if not isinstance(source, str) or not source.isprintable() or not os.path.isabs(source):
        return None
    tree = source.rstrip(os.sep)
    return tree if tree and os.path.isdir(tree) else None


def _locate(
    root: str | os.PathLike[str], split: str | None
) -> tuple[Path, Manifest, SplitInfo, IndexStamp | None]:
    """The packed dataset's directory, its index, the split that ``root`` (and ``split``) name, the stamp.

    ``root`` is the dataset's directory or index, or ``<dataset>/<split>`` (a script's
    ``os.path.join(data, "train")``) where ``<dataset>/<split>`` holds no index: no such directory,
    or a directory (the tree packed into ``<dataset>``, say) while ``<dataset>`` has that split. A
    dataset at the path itself wins: that is what the path names. The stamp is the index's file,
    taken before it is read (:class:`~.pipeline.splitreader.IndexStamp`).
    """
    path = local_path(root)
    if path.name == INDEX_NAME and path.is_file():
        path = path.parent
    named: str | None = None
    parent = path.parent
    if (
        not os.path.lexists(path / INDEX_NAME)
        and os.path.lexists(parent / INDEX_NAME)
        and (not os.path.lexists(path) or _has_split(parent, path.name))
    ):
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
    if split is not None:  # "" too: no split has that name (as `--split ""`)
        wanted = split
    else:
        wanted = named or ("train" if "train" in splits or len(splits) != 1 else splits[0])
    if wanted not in manifest.splits:
        where = f"{path} (the dataset above {root})" if named else str(path)
        raise DatasetNotFoundError(
            f"no split {wanted!r} in the packed dataset at {where}; its splits are {splits}: give "
            f"ImageFolder('{path}/<split>') or ImageFolder('{path}', split=...) with one of them"
        )
    return path, manifest, manifest.split(wanted), stamp


def _has_split(dataset: Path, name: str) -> bool:
    """Whether the packed dataset at ``dataset`` reads (its index checked) and has a split ``name``."""
    try:
        return name in read_manifest(dataset).splits
    except ManifestError:
        return False


def _format_of(data: bytes) -> str:
    """An image member's extension from its first bytes, for the decoder's choice of path."""
    return "jpg" if data[:3] == b"\xff\xd8\xff" else "png"
