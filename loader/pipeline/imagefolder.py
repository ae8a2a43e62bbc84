"""``ImageFolder``: torchvision's ``ImageFolder`` over a packed split, a map-style dataset.

For a script written for ``torchvision.datasets.ImageFolder(root, transform)`` and a
``DataLoader(..., shuffle=True, num_workers=...)``: the switch is one line, and every sampler,
transform (v1 or v2), collate and worker start method keeps working. ``ds[i]`` is
``(transform(PIL RGB image), target_transform(class id))``; ``classes``, ``class_to_idx`` and
``targets`` are ImageFolder's. The samples are numbered in the order they are packed (shuffled by
``pack``), not in ImageFolder's sorted order: ``targets[i]`` is ``ds[i]``'s label.

Building it reads only ``index.json`` (no listing): the table of sample starts that ``pack`` writes
beside each shard (``converter/offsets.py``) is held as one ``uint32`` array (4 bytes a sample,
shared copy-on-write by forked workers): a million-sample split is ready in about a tenth of a
second (the index's own check of its tables), without a listing.
``ds[i]`` reads sample ``i``'s bytes, from its first tar header to the next sample's, with one
``os.pread`` and parses them with the converter's one tar parser and sample grouper
(:class:`~imgshards.converter.tarstream.TarStream`, :class:`~imgshards.converter.tarsamples.SampleReader`,
:func:`~imgshards.converter.tarsamples.sample_problem`): the same members accepted and refused as
``ShardDataset``, ``index`` and ``verify``. The image is decoded by
:func:`~imgshards.loader.image.decode.pil_image` (the same bounds, before any decode, as
``ShardDataset``'s decoder).

Each process keeps at most ``max_open`` shards open (least recently used closed first), each opened
the way ``ShardDataset`` opens one (a regular file inside the dataset, never a FIFO or a link out),
with the kernel's read-ahead as it is (:data:`FADVISE_RANDOM`). Files opened before a fork
are never used by the child (each process opens its own: a ``pread`` does not share a seek
position, but a pid check keeps it simple), and none crosses a pickle (``spawn`` workers).

A damaged sample (a cut or rewritten shard, a member the parser refuses, an image that does not
decode) raises :class:`~imgshards.loader.errors.CorruptImageError` naming the sample, its shard
and its source path: a map-style dataset cannot skip an index its sampler has chosen (torchvision's
``ImageFolder`` raises too). ``ShardDataset`` skips and counts such samples.
"""

from __future__ import annotations

import io
import operator
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from typing import Any, BinaryIO, SupportsIndex

import numpy as np
from torch.utils.data import Dataset

from imgshards.converter.errors import ShardFormatError
from imgshards.converter.labels import label_value
from imgshards.converter.locate import INDEX_NAME, is_url, local_path
from imgshards.converter.manifest import IMAGE_EXTENSIONS, ShardInfo, SplitInfo, read_manifest
from imgshards.converter.offsets import BLOCK, decode_offsets
from imgshards.converter.tarsamples import SampleReader, checked_samples, sample_problem, shown
from imgshards.converter.tarstream import TarStream

from ..errors import ConfigError, CorruptImageError, ShardReadError
from ..image.decode import pil_image
from ..remote import ShardSource
from .tar import source_path

__all__ = ["DEFAULT_MAX_OPEN", "ImageFolder"]

DEFAULT_MAX_OPEN = 8  # open shards per process: a random sample is in any shard, a file costs ~1 MB of buffer
_IMAGE_EXTS = frozenset(IMAGE_EXTENSIONS)
# POSIX_FADV_RANDOM on every shard opened: off. Measured with bench/imagefolder.py --fadvise (docs/
# imagefolder.md): no gain, cold or warm; Linux already reads an isolated random read of under
# 128 KB as just its pages, and read-ahead past a larger one is read by a later sample. A switch for
# that bench, not an option.
FADVISE_RANDOM = False


class ImageFolder(Dataset[tuple[Any, Any]]):
    """A packed split as a map-style dataset, like ``torchvision.datasets.ImageFolder``.

    ``from imgshards.loader import ImageFolder`` and ``ImageFolder("shards", transform)`` replace
    ``datasets.ImageFolder("photos/train", transform)`` after ``imgshards pack photos/train shards``.

    Args:
        root: The packed dataset's directory (holding ``index.json``), or its ``index.json``. A
            local path: a URL fails at once, naming ``ShardDataset``, which streams one.
        transform: Called on each image, a PIL RGB image (any torchvision v1 or v2 transform).
        target_transform: Called on each class id.
        split: Which split of the dataset.
        max_open: Most shards each process keeps open.

    Attributes:
        classes: Class names, sorted as ImageFolder sorts them; a class id is a position here.
        class_to_idx: Class name to class id.
        root: The dataset's directory.

    Raises:
        ManifestError: no index at ``root``, a bad index, an unknown split, or a missing shard.
        ConfigError: ``root`` is a URL; a shard has no table of sample starts; ``max_open < 1``.

    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        split: str = "train",
        max_open: int = DEFAULT_MAX_OPEN,
    ) -> None:
        if is_url(root):
            raise ConfigError(
                f"ImageFolder reads a packed dataset on this machine, one sample at a time; {root} is a "
                f"URL: stream it with ShardDataset({str(root)!r}, ...) (docs/remote.md), or copy it here"
            )
        if max_open < 1:
            raise ConfigError(f"max_open must be at least 1 open shard, got {max_open}")
        path = local_path(root)
        if path.name == INDEX_NAME and path.is_file():
            path = path.parent
        self.root = path
        self.transform = transform
        self.target_transform = target_transform
        self.split = split
        self.max_open = max_open
        manifest = read_manifest(path)  # untrusted: every name, count and table checked
        split_info = manifest.split(split)
        shards = split_info.shards
        self.source = ShardSource(path)  # opens a shard as ShardDataset does: regular, inside the root
        self.source.check(shards, split)
        self.classes: list[str] = list(manifest.classes)
        self.class_to_idx: dict[str, int] = manifest.class_to_idx
        # The split's index entry; its tables of sample starts (base64, 5.3 bytes a sample) are
        # held once, in the array below, and every worker gets a copy of what is held here.
        self.split_info: SplitInfo = replace(split_info, shards=tuple(replace(s, offsets="") for s in shards))
        self._labels = split_info.labels
        # Sample i is in shard s where first[s] <= i < first[s + 1]; it starts at block starts[i].
        self._first = np.zeros(len(shards) + 1, dtype=np.int64)
        np.cumsum([s.samples for s in shards], out=self._first[1:])
        self._starts = np.empty(int(self._first[-1]), dtype=np.uint32)
        for s, shard in enumerate(shards):
            if not shard.offsets:
                raise ConfigError(
                    f"shard {shard.name} of split {split!r} at {path} has no table of sample starts "
                    "(an index `imgshards index` wrote, or one older than the table): ImageFolder reads "
                    "a sample at its offset; re-pack with `imgshards pack`, or read it with ShardDataset"
                )
            table = decode_offsets(shard.offsets)  # checked by read_manifest: one per sample, increasing
            self._starts[self._first[s] : self._first[s + 1]] = np.frombuffer(table, dtype=np.uint32)
        self._targets: np.ndarray | None = None
        self._files: OrderedDict[int, BinaryIO] = OrderedDict()
        self._sizes: dict[int, int] = {}  # of the shards opened in this process, as fstat says
        self._pid = os.getpid()

    # ---- what torchvision's ImageFolder has -----------------------------------------------------

    def __len__(self) -> int:
        """The number of samples in the split."""
        return len(self._starts)

    def __getitem__(self, index: SupportsIndex) -> tuple[Any, Any]:
        """Sample ``index``: ``(transform(image), target_transform(class id))``; the image a PIL RGB one.

        Raises:
            IndexError: ``index`` is out of range (negative ones count from the end, as a list's).
            CorruptImageError: the sample is damaged; the message names it, its shard and its source.
            ShardReadError: the shard cannot be read (an I/O error); ShardAccessError: it is gone.

        """
        i = self._position(index)
        parts, ext, target = self._read(i)
        try:
            img: Any = pil_image(parts[ext], ext)
        except ValueError as e:
            raise self._damaged(
                i, self._shard_of(i), parts, f"has an image that does not decode ({e})"
            ) from None
        if self.transform is not None:
            img = self.transform(img)
        out: Any = target if self.target_transform is None else self.target_transform(target)
        return img, out

    @property
    def targets(self) -> np.ndarray:
        """The class id of every sample, in the dataset's order (``int64``), as ImageFolder's ``targets``.

        Read from the shards on first use, then kept: only each sample's label member, stepping
        over its image (about 15 us a sample: 15 s for a million samples), since the index holds
        counts per class, not a label per sample.

        Raises:
            CorruptImageError: a sample's label cannot be read (the shard is damaged).

        """
        if self._targets is None:
            self._targets = self._read_targets()
        return self._targets

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({str(self.root)!r}, split={self.split!r}, samples={len(self)}, "
            f"classes={len(self.classes)}, transform={self.transform!r})"
        )

    # ---- pickling into spawn workers: no open file crosses ---------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_files": OrderedDict(), "_sizes": {}, "_pid": -1}

    def close(self) -> None:
        """Close the shards this process holds open (reading again opens them again)."""
        files = getattr(self, "_files", None)  # None: __init__ failed before it
        while files:
            files.popitem()[1].close()  # in a forked child, its copy of the descriptor: the parent's stays

    def __del__(self) -> None:
        self.close()

    # ---- reading one sample -----------------------------------------------------------------------

    def _position(self, index: SupportsIndex) -> int:
        i = operator.index(index)
        n = len(self._starts)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {operator.index(index)} of a split of {n}")
        return i

    def _shard_number(self, i: int) -> int:
        return int(np.searchsorted(self._first, i, side="right")) - 1

    def _shard_of(self, i: int) -> ShardInfo:
        return self.split_info.shards[self._shard_number(i)]

    def _read(self, i: int) -> tuple[dict[str, bytes], str, int]:
        """Sample ``i``'s members, its image's extension and its class id, read with one ``pread``."""
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
            sample = next(iter(SampleReader(tar, stop=1)), None)
        except ShardFormatError as e:
            problem: str | None = f"does not parse as a tar sample: {e}"
        else:
            problem = "is not there" if sample is None or sample.cut else sample_problem(sample.exts, member)
        if problem is None and sample is not None:
            try:
                target = self._class_id(label_value(sample.parts[member], member, self._labels.key))
            except ValueError as e:
                problem = f"has {e}"
        if problem is not None:
            if len(data) < stop - start:  # the file is shorter than the index says: what explains it
                problem = f"is cut short: the shard ends {len(data)} of its {stop - start} bytes in"
            raise self._damaged(i, shard, None if sample is None else sample.parts, problem)
        assert sample is not None  # a sample without a problem
        ext = next(e for e in sample.parts if e in _IMAGE_EXTS)
        return sample.parts, ext, target

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

    def _read_targets(self) -> np.ndarray:
        """Every sample's class id, shard by shard, reading only the label members."""
        targets = np.empty(len(self), dtype=np.int64)
        member, field = self._labels.member, self._labels.key
        for s, shard in enumerate(self.split_info.shards):
            first, count = int(self._first[s]), shard.samples
            with self.source.open(shard) as f:
                tar = TarStream(f, end=os.fstat(f.fileno()).st_size)
                got = 0
                try:
                    for sample, value, problem in checked_samples(tar, member, field):
                        if sample.index >= count:
                            break
                        if problem is None and value is not None:
                            try:
                                targets[first + sample.index] = self._class_id(value)
                            except ValueError as e:
                                problem = f"has {e}"
                        if problem is not None:
                            raise self._damaged(first + sample.index, shard, None, problem)
                        got += 1
                except ShardFormatError as e:
                    raise self._damaged(first + got, shard, None, f"does not parse: {e}") from None
            if got != count:
                raise self._damaged(first + got, shard, None, f"is missing: the shard holds {got} of {count}")
        return targets
