"""List an ImageFolder tree the way ``torchvision.datasets.ImageFolder`` does, fast and compactly.

Classes are the sorted immediate subdirectories of the root; images are found recursively in each
class directory, following symlinked directories, and kept when their extension (any case) is one of
torchvision's ``IMG_EXTENSIONS``. Samples come out in ImageFolder's order, so sample ``i`` here is
``ImageFolder(root).samples[i]``.

Differences, all on files ImageFolder would choke on: a symlink that loops back to a directory above
it is reported, not walked forever; broken symlinks and special files are reported; files that are
not in a class directory or have another extension are reported. Every file under the root ends up
in :attr:`ScanResult.paths` or :attr:`ScanResult.rejects`.

Millions of paths are held as one byte buffer plus offsets (:class:`PathTable`), about the length of
the path plus 8 bytes a file, not a list of Python tuples.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, overload

import numpy as np

from ..format.errors import DestinationError, SourceError, shown
from ..format.locate import IMG_EXTENSIONS, PHOTO_EXTENSIONS, is_url, missing_path, url_typo
from .reasons import Reason

if TYPE_CHECKING:
    from ..config import PackConfig

__all__ = [
    "IMG_EXTENSIONS",
    "SPLIT_NAMES",
    "PathTable",
    "Reject",
    "ScanResult",
    "check_source",
    "scan_tree",
    "split_named",
    "split_tree_error",
    "tree_warnings",
]

_PACKED_EXTENSIONS = IMG_EXTENSIONS + PHOTO_EXTENSIONS
# Folder names that mean a split of a dataset, not a class of it.
SPLIT_NAMES = frozenset({"train", "training", "val", "valid", "validation", "test", "testing"})


@dataclass(frozen=True)
class Reject:
    """An input file (or directory) that was not packed, and why."""

    path: str
    reason: Reason
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        """Return the JSON form written to the rejects file."""
        return {"path": self.path, "reason": self.reason.value, "detail": self.detail}


class PathTable(Sequence[str]):
    """An immutable sequence of relative paths stored in one buffer: compact, cheap to pickle."""

    def __init__(self, blob: bytes, offsets: np.ndarray) -> None:
        self._blob = blob
        self._offsets = offsets

    @classmethod
    def from_paths(cls, paths: Sequence[str]) -> PathTable:
        """Build a table from ``str`` paths."""
        encoded = [os.fsencode(p) for p in paths]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        return cls(b"".join(encoded), offsets)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return os.fsdecode(self._blob[self._offsets[i] : self._offsets[i + 1]])

    def take(self, indices: np.ndarray) -> PathTable:
        """Return a new table with the paths at ``indices``, in that order."""
        return PathTable.from_paths([self[int(i)] for i in indices])

    def update_hash(self, h: hashlib._Hash) -> None:
        """Feed the table's content to a hashlib object."""
        h.update(self._offsets.astype("<i8").tobytes())
        h.update(self._blob)

    @property
    def nbytes(self) -> int:
        """Memory held by the table."""
        return len(self._blob) + self._offsets.nbytes


@dataclass
class ScanResult:
    """What a scan found: classes, the candidate images in ImageFolder order, and the rejects."""

    root: Path
    classes: tuple[str, ...]
    paths: PathTable
    labels: np.ndarray
    sizes: np.ndarray
    inodes: np.ndarray
    rejects: list[Reject] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.paths)

    def fingerprint(self) -> str:
        """Digest of what was found: a resumed run must see the same tree as the run it continues.

        Inode numbers are left out: they say where files are on disk (``pack`` reads in inode order
        for locality), not what they hold.
        """
        h = hashlib.sha256()
        for name in self.classes:
            h.update(os.fsencode(name) + b"\0")
        self.paths.update_hash(h)
        h.update(self.labels.astype("<i4").tobytes())
        h.update(self.sizes.astype("<i8").tobytes())
        return h.hexdigest()


@dataclass
class _ClassListing:
    """One class directory's images as compact arrays (cheap to send back from a worker process)."""

    blob: bytes
    lengths: np.ndarray
    sizes: np.ndarray
    inodes: np.ndarray
    rejects: list[Reject]


def _dir_key(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _walk_class(root: str, class_name: str) -> _ClassListing:
    """List one class directory recursively in ImageFolder's order, detecting symlink loops."""
    found: list[tuple[str, list[tuple[str, int, int]]]] = []
    rejects: list[Reject] = []
    # Each stack entry: a directory's path relative to root, and the (device, inode) of it and of
    # every directory above it up to the root; a symlink that resolves to one of those would loop.
    try:
        top = frozenset({_dir_key(root), _dir_key(os.path.join(root, class_name))})
    except OSError as e:
        top, rejects = (
            frozenset(),
            [Reject(class_name, Reason.UNREADABLE, f"cannot list directory: {e.strerror}")],
        )
    stack: list[tuple[str, frozenset[tuple[int, int]]]] = [(class_name, top)] if top else []
    while stack:
        rel, ancestors = stack.pop()
        files: list[tuple[str, int, int]] = []
        try:
            # In inode order: directory order is hash order on ext4 and others, and stat-ing a cold
            # directory's files in that order reads its inode table at random.
            entries = sorted(os.scandir(os.path.join(root, rel)), key=os.DirEntry.inode)
        except OSError as e:
            rejects.append(Reject(rel, Reason.UNREADABLE, f"cannot list directory: {e.strerror}"))
            continue
        for entry in entries:
            entry_rel = f"{rel}/{entry.name}"
            try:
                if entry.is_dir():
                    est = entry.stat()
                    key = (est.st_dev, est.st_ino)
                    if key in ancestors:
                        target = os.readlink(entry.path) if entry.is_symlink() else entry.path
                        rejects.append(Reject(entry_rel, Reason.SYMLINK_LOOP, f"points back to {target}"))
                    else:
                        stack.append((entry_rel, ancestors | {key}))
                elif entry.is_file():
                    if entry.name.lower().endswith(_PACKED_EXTENSIONS):
                        st = entry.stat()
                        files.append((entry.name, st.st_size, st.st_ino))
                    else:
                        rejects.append(Reject(entry_rel, Reason.UNSUPPORTED_EXTENSION))
                elif entry.is_symlink():
                    target = os.readlink(entry.path)
                    rejects.append(Reject(entry_rel, Reason.BROKEN_SYMLINK, f"points to missing {target}"))
                else:
                    rejects.append(Reject(entry_rel, Reason.SPECIAL_FILE, "not a regular file"))
            except OSError as e:
                rejects.append(Reject(entry_rel, Reason.UNREADABLE, e.strerror or str(e)))
        found.append((rel, files))
    # ImageFolder sorts os.walk's (root, dirs, files) tuples, i.e. directories by path, then names.
    found.sort(key=lambda item: item[0])
    ordered = [(f"{rel}/{name}", size, ino) for rel, files in found for name, size, ino in sorted(files)]
    encoded = [os.fsencode(path) for path, _, _ in ordered]
    return _ClassListing(
        blob=b"".join(encoded),
        lengths=np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)),
        sizes=np.fromiter((size for _, size, _ in ordered), dtype=np.int64, count=len(ordered)),
        inodes=np.fromiter((ino for _, _, ino in ordered), dtype=np.uint64, count=len(ordered)),
        rejects=rejects,
    )


def find_classes(root: Path) -> tuple[list[str], list[Reject]]:
    """Return the sorted class directories of ``root`` and rejects for loose files beside them.

    Raises:
        SourceError: ``root`` is missing, unreadable, or has no class directory.

    """
    if not root.exists():
        raise SourceError(f"source directory {root} does not exist: {missing_path(root)}")
    if not root.is_dir():
        raise SourceError(f"source {root} is not a directory; give the root of an ImageFolder tree")
    try:
        entries = list(os.scandir(root))
    except OSError as e:
        raise SourceError(f"cannot read source directory {root}: {e.strerror}") from e
    classes = sorted(e.name for e in entries if e.is_dir())
    if not classes:
        images = sorted(e.name for e in entries if e.name.lower().endswith(_PACKED_EXTENSIONS))
        if images:  # a flat folder of images: the labels are nowhere yet
            some = ", ".join(shown(name) for name in images[:2]) + (", ..." if len(images) > 2 else "")
            raise SourceError(
                f"no class directories in {root}, only {len(images):,} image{'s' if len(images) > 1 else ''} "
                f"({some}): an image's class is the folder it is in, root/<class>/<image>; move them into "
                "one folder per class (then, to choose the train and val images yourself, list them in a "
                "JSON file for --split-file)"
            )
        raise SourceError(
            f"no class directories in {root}: an ImageFolder tree is root/<class>/<image>, "
            "one subdirectory per class"
        )
    loose = sorted(e.name for e in entries if not e.is_dir())
    return classes, [Reject(name, Reason.OUTSIDE_CLASS_DIR, "not inside a class directory") for name in loose]


def scan_tree(
    root: str | os.PathLike[str],
    *,
    executor: Executor | None = None,
    on_class: Callable[[str, int], None] | None = None,
    on_classes: Callable[[int], None] | None = None,
) -> ScanResult:
    """Scan an ImageFolder tree.

    Args:
        root: The tree's root directory.
        executor: Lists class directories in parallel; a process pool scales past the GIL (``pack``
            passes its workers). ``None``: two threads, which overlap the waits on the disk.
        on_class: Called with each class name and its file count as the scan moves on (progress).
        on_classes: Called once with the number of class directories, before they are listed.

    Raises:
        SourceError: the root is unusable, or a class directory holds no image (as ImageFolder).

    """
    root = Path(root)
    classes, rejects = find_classes(root)
    if on_classes is not None:
        on_classes(len(classes))
    blobs: list[bytes] = []
    lengths: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    sizes: list[np.ndarray] = []
    inodes: list[np.ndarray] = []
    empty: list[str] = []
    unlisted: list[str] = []  # class directories that cannot be listed (permissions): their own error
    with contextlib.ExitStack() as stack:
        if executor is None:
            executor = stack.enter_context(ThreadPoolExecutor(max_workers=2))
        listings = executor.map(_walk_class, itertools.repeat(str(root)), classes, chunksize=8)
        for label, listing in enumerate(listings):
            rejects.extend(listing.rejects)
            if not len(listing.lengths):
                name = shown(classes[label])
                cause = [r.detail.rpartition(": ")[2] for r in listing.rejects if r.path == classes[label]]
                if cause:
                    unlisted.append(f"{name} ({cause[0]})")
                else:
                    empty.append(name)
                continue
            blobs.append(listing.blob)
            lengths.append(listing.lengths)
            sizes.append(listing.sizes)
            inodes.append(listing.inodes)
            labels.append(np.full(len(listing.lengths), label, dtype=np.int32))
            if on_class is not None:
                on_class(classes[label], len(listing.lengths))
    if unlisted:
        raise SourceError(
            f"cannot list class director{'ies' if len(unlisted) > 1 else 'y'} in {root}: "
            f"{', '.join(unlisted[:5])}{f' and {len(unlisted) - 5} more' if len(unlisted) > 5 else ''}; "
            "make them readable (chmod) or remove them"
        )
    if empty:
        names = ", ".join(empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
        raise SourceError(
            f"class director{'ies' if len(empty) > 1 else 'y'} with no image in {shown(root)}: {names}. "
            f"Images need one of the extensions {', '.join(_PACKED_EXTENSIONS)}; remove or fill "
            "the empty class directories (ImageFolder refuses them too)"
        )
    offsets = np.zeros(sum(len(x) for x in lengths) + 1, dtype=np.int64)
    np.cumsum(np.concatenate(lengths), out=offsets[1:])
    rejects.sort(key=lambda r: r.path)
    return ScanResult(
        root=root,
        classes=tuple(classes),
        paths=PathTable(b"".join(blobs), offsets),
        labels=np.concatenate(labels),
        sizes=np.concatenate(sizes),
        inodes=np.concatenate(inodes),
        rejects=rejects,
    )


def split_named(root: str | os.PathLike[str]) -> str | None:
    """The split a tree's own folder names (``photos/val`` -> ``val``), or None for a folder not named so.

    ``imgshards pack photos/val shards`` packs split ``val`` without ``--split``, as a script's
    ``os.path.join(data, "val")`` names it; any other folder's tree is ``train``.
    """
    name = Path(root).name
    return name.lower() if name.lower() in SPLIT_NAMES else None


def split_tree_error(root: str | os.PathLike[str], dst: str = "DST") -> str | None:
    """Why ``root`` is refused when every one of its class folders is named like a split, else None.

    Such a root (``photos/`` holding ``train/`` and ``val/``) is the folder above the trees of the
    splits far more often than a dataset whose classes are called ``train`` and ``val``: packing it
    would make those two classes and exit 0. The message names the commands probably meant, and
    ``--allow-split-names`` (``PackConfig(allow_split_names=True)``), which packs it anyway.
    """
    root = Path(root)
    try:
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    except OSError:
        return None  # the scan says what is wrong with the root
    if not classes or not all(name.lower() in SPLIT_NAMES for name in classes):
        return None
    commands = "; ".join(
        f"imgshards pack {shown(root / name)} {shown(dst)} --split {_flag(name)}" for name in classes
    )
    return (
        f"the class folders of {shown(root)} are all split names ({', '.join(map(shown, classes))}), not "
        f"classes: pack each split from its own tree: {commands} (--allow-split-names packs them as "
        "classes anyway)"
    )


def tree_warnings(root: str | os.PathLike[str], dst: str = "DST") -> tuple[str, ...]:
    """What suggests ``root`` is not the ImageFolder tree that was meant, each with what to run instead.

    Packing such a tree succeeds, with wrong classes: the folder above the trees of the splits
    (classes ``train`` and ``val``), or a tree nested one level deeper (``root/animals/<class>/...``:
    one class, ``animals``). Reads the names in ``root`` and the top of each class folder up to its
    first image only, so it costs next to nothing beside the scan. ``dst`` is shown in the commands.

    Returns:
        One message, or none: class folders named like splits (:data:`SPLIT_NAMES`), or every class
        folder holding only folders and no image at its top level.

    """
    root = Path(root)
    try:
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    except OSError:
        return ()  # the scan says what is wrong with the root
    splits = [name for name in classes if name.lower() in SPLIT_NAMES]
    if splits:
        named = ", ".join(map(shown, splits))
        commands = "; ".join(
            f"imgshards pack {shown(root / name)} {shown(dst)} --split {_flag(name)}" for name in splits
        )
        return (
            f"the class folders of {shown(root)} are named like splits ({named}): packing it makes "
            f"{len(classes)} class{'es' if len(classes) != 1 else ''} named "
            f"{', '.join(map(shown, classes[:4]))}"
            f"{', ...' if len(classes) > 4 else ''}. Did you mean to pack each split from its own tree? "
            f"{commands}",
        )
    nested: list[list[str]] = []
    for name in classes:
        folders = _only_folders(root / name)
        if not folders:
            return ()  # an image at the top of a class folder: ImageFolder's root/<class>/<image>
        nested.append(folders)
    if not nested:
        return ()
    first = shown(classes[0])
    inner = ", ".join(map(shown, nested[0][:3])) + (", ..." if len(nested[0]) > 3 else "")
    if len(classes) == 1:
        which = f"the one class folder, {first},"
    else:
        some = ", ".join(map(shown, classes[:3])) + (", ..." if len(classes) > 3 else "")
        which = f"every class folder ({some})"
    plural = "es" if len(classes) != 1 else ""
    return (
        f"in {shown(root)}, {which} holds only folders ({first}/{inner}) and no image at its top level: "
        f"packing it makes {len(classes)} class{plural} of the folders above the images. If the classes "
        f"are the folders inside, pack that tree: imgshards pack {shown(root / classes[0])} {shown(dst)}",
    )


def _only_folders(folder: Path) -> list[str]:
    """The subfolders of ``folder`` if it holds folders and no image directly, else [] (stops at an image)."""
    folders = []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if entry.is_dir():
                    folders.append(entry.name)
                elif entry.name.lower().endswith(_PACKED_EXTENSIONS):
                    return []
    except OSError:
        return []
    return sorted(folders)


def _flag(name: str) -> str:
    """A split name ``--split`` accepts for a folder named ``name`` (``Validation`` -> ``validation``)."""
    flag = name.lower()
    return flag if flag and all(c.isalnum() or c == "_" for c in flag) and flag.isascii() else "NAME"


def check_source(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], config: PackConfig
) -> tuple[str, ...]:
    """Refuse a source or destination (directory or URL) that cannot be packed; return the warnings.

    Reads the names at the top of ``src`` only (see :func:`tree_warnings`), nothing of
    ``dst``: a dry run (:mod:`.plan.dryrun`) asks it too, and writes nothing.

    Raises:
        SourceError: ``src`` is missing or not a directory, its class folders are all split names
            (unless ``config.allow_split_names``), or (``config.strict``) it looks like the wrong folder.
        DestinationError: ``dst`` is a URL with a slash missing, or inside ``src``.

    """
    if (meant := url_typo(dst)) is not None:  # else a local folder named "s3:" would be made
        raise DestinationError(f"{os.fspath(dst)} is a URL with a slash missing; write {meant}")
    src_path, dst_path = Path(src).resolve(), Path(dst).resolve()
    if not is_url(dst) and (dst_path == src_path or src_path in dst_path.parents):
        raise DestinationError(f"destination {dst_path} is inside the source tree {src_path}; choose another")
    if not src_path.exists():
        raise SourceError(f"source directory {os.fspath(src)} does not exist: {missing_path(Path(src))}")
    if not src_path.is_dir():
        raise SourceError(f"source {os.fspath(src)} is not a directory; give the root of an ImageFolder tree")
    # The paths as the caller wrote them, in the commands the messages name.
    if not config.allow_split_names and (refusal := split_tree_error(src, dst=os.fspath(dst))):
        raise SourceError(f"refused: {refusal}")
    suspicious = tree_warnings(src, dst=os.fspath(dst))
    if config.strict and suspicious:
        raise SourceError(f"refused (strict): {suspicious[0]}")
    return suspicious
