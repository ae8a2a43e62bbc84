"""Files under a destination directory, never reached through a symbolic link.

A destination someone else can write to may hold a planted link: ``DST/.imgshards/train`` pointing
at another directory, ``DST/.index.json.partial`` at a file. Whatever ``pack`` writes or removes
below the destination goes through these functions, which never follow one:

- a directory below the root is opened one component at a time, each relative to the directory fd
  above it, with ``O_NOFOLLOW | O_DIRECTORY``; a component that is a link (or not a directory) is
  refused with :class:`~.format.errors.DestinationError` naming it;
- a file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` relative to its directory's fd (a stale
  entry at a temporary name, link or file, is unlinked first: unlinking a link removes the link);
- a tree is removed with ``shutil.rmtree(name, dir_fd=...)``, which walks by fd and never descends
  through a link.

The root itself (the destination the user named, resolved) is trusted. ``root=None`` trusts every
directory above the file, for commands whose output directory is the one the user named
(``imgshards index`` writes its index beside the shards).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ..format.errors import DestinationError, UnsafeFileError

__all__ = [
    "clear_dir",
    "create",
    "is_regular",
    "locked_fd",
    "make_dirs",
    "open_dir",
    "open_file",
    "read_bytes",
    "remove",
    "rename",
    "write_atomic",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# What an open (O_NOFOLLOW, O_NONBLOCK) or rename says when the name holds something else.
_IN_THE_WAY = {errno.ELOOP: "a symbolic link", errno.EISDIR: "a directory", errno.ENXIO: "not a regular file"}


def _refuse(path: Path, what: str) -> DestinationError:
    try:
        target = f" (to {os.readlink(path)})" if os.path.islink(path) else ""
    except OSError:
        target = ""
    why = (
        "pack never writes or deletes through a link under its destination"
        if target
        else "pack needs that name"
    )
    return DestinationError(f"{path} is {what}{target}; {why}: remove it, or choose another destination")


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    """Errors on ``path`` (reached by a directory fd, so unnamed) as a refusal, or named in full.

    A link, FIFO or directory in the way is a :class:`DestinationError`; any other error (a full or
    read-only disk) is re-raised as the same ``OSError`` kind, with ``path`` as its file name.
    """
    try:
        yield
    except OSError as e:
        if isinstance(e, UnsafeFileError):
            raise
        if e.errno in _IN_THE_WAY:
            raise _refuse(path, _IN_THE_WAY[e.errno]) from None
        if e.filename is not None and os.path.isabs(e.filename):
            raise
        raise OSError(e.errno, e.strerror, str(path)) from None


def _link_or_file(parent_fd: int, name: str, path: Path) -> DestinationError:
    try:
        st = os.lstat(name, dir_fd=parent_fd)
    except OSError:
        return _refuse(path, "not a directory")
    return _refuse(path, "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory")


def open_dir(root: Path, rel: str | os.PathLike[str] = "", *, create: bool = False) -> int:
    """Open ``root/rel`` as a directory fd, each component below ``root`` opened without following a link.

    Args:
        root: The trusted directory (opened as is).
        rel: A relative path below it; ``""`` for the root itself.
        create: Make missing components (mode 0o777 less the umask).

    Raises:
        DestinationError: a component is a symbolic link or not a directory.

    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    at = root
    try:
        for part in Path(rel).parts:
            at = at / part
            try:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _link_or_file(fd, part, at) from None
                raise OSError(e.errno, e.strerror, str(at)) from None  # named in full
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _dir_of(path: Path, root: Path | None) -> Iterator[int]:
    """The fd of ``path``'s directory: walked from ``root`` without links, or opened as is."""
    if root is None:
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    else:
        fd = open_dir(root, path.parent.relative_to(root))
    try:
        yield fd
    finally:
        os.close(fd)


def make_dirs(root: Path, rel: str | os.PathLike[str]) -> None:
    """Make ``root/rel`` and its parents below ``root``, refusing a link at any of them."""
    os.close(open_dir(root, rel, create=True))


def _create_at(dir_fd: int, name: str, mode: int = 0o644) -> int:
    """A new file ``name`` in ``dir_fd``; a stale entry there (a link included) is unlinked, not followed."""
    try:
        return os.open(name, _NEW_FILE, mode, dir_fd=dir_fd)
    except FileExistsError:
        _remove_entry(dir_fd, name)  # a crashed run's temporary file, or a planted link: not followed
        return os.open(name, _NEW_FILE, mode, dir_fd=dir_fd)


def create(path: str | os.PathLike[str], *, root: Path | None = None, buffering: int = -1) -> BinaryIO:
    """Open a new file at ``path`` for writing (``O_CREAT | O_EXCL | O_NOFOLLOW``), replacing a stale one."""
    path = Path(path)
    with _naming(path), _dir_of(path, root) as dir_fd:
        fd = _create_at(dir_fd, path.name)
    return os.fdopen(fd, "wb", buffering=buffering)


def open_file(
    path: str | os.PathLike[str], *, root: Path | None, append: bool = False, buffering: int = -1
) -> BinaryIO:
    """Open the regular file ``path`` to read, or to append to (creating it); never through a link."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT if append else os.O_RDONLY | os.O_NONBLOCK
    with _naming(path), _dir_of(path, root) as dir_fd:
        fd = os.open(path.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _refuse(path, "a directory" if stat.S_ISDIR(mode) else "not a regular file")
    return os.fdopen(fd, "ab" if append else "rb", buffering=buffering)


def write_atomic(path: Path, data: bytes, *, root: Path | None = None) -> None:
    """Write ``data`` to ``path`` through a new temporary file beside it, fsync and rename.

    Args:
        path: The file to write.
        data: Its whole content.
        root: The trusted directory above ``path``; the directories between are walked without
            following a link. ``None`` trusts ``path``'s directory as is.

    On any failure the temporary file is removed: a full disk leaves the directory as it was.

    Raises:
        DestinationError: a directory below ``root`` is a link.

    """
    tmp = f".{path.name}.partial"
    with _dir_of(path, root) as dir_fd:
        try:
            with _naming(path.with_name(tmp)), os.fdopen(_create_at(dir_fd, tmp), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            with _naming(path):  # replaces a link, never follows one
                os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:  # a full disk, a directory in the way, Ctrl-C: no temporary file stays
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)


def rename(path: Path, name: str, *, root: Path | None = None) -> None:
    """Rename the file ``path`` to ``name`` in its directory, replacing (never following) a link; fsynced."""
    with _dir_of(path, root) as dir_fd, _naming(path.with_name(name)):
        os.replace(path.name, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)


def read_bytes(path: Path, *, root: Path | None = None) -> bytes | None:
    """The content of the regular file ``path`` (``None`` when absent), never read through a link."""
    try:
        f = open_file(path, root=root)
    except FileNotFoundError:
        return None
    with f:
        return f.read()


def is_regular(path: Path) -> bool:
    """Whether ``path`` is a regular file itself (not a link to one)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def remove(path: Path, *, root: Path) -> None:
    """Remove ``path`` (a directory tree, a file, a link or a FIFO) if it exists, never through a link."""
    try:
        with _naming(path), _dir_of(path, root) as dir_fd:
            _remove_entry(dir_fd, path.name)
    except FileNotFoundError:
        pass


def _remove_entry(dir_fd: int, name: str) -> None:
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)  # fd-based: a link inside is removed, not followed
    else:
        os.unlink(name, dir_fd=dir_fd)  # a link itself, not its target


def clear_dir(path: Path, *, root: Path, keep: frozenset[str] = frozenset()) -> None:
    """Remove everything in the directory ``path`` but the names in ``keep``, never through a link."""
    fd = open_dir(root, path.relative_to(root))
    try:
        for name in os.listdir(fd):
            if name not in keep:
                _remove_entry(fd, name)
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked_fd(path: Path, *, root: Path) -> Iterator[int]:
    """Open (creating it) the lock file ``path`` without following a link; yield its fd."""
    with _naming(path), _dir_of(path, root) as dir_fd:
        # O_NONBLOCK: a FIFO planted at the name fails (ENXIO) instead of blocking the open.
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(path.name, flags, 0o644, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _refuse(path, "not a regular file")
        yield fd
    finally:
        os.close(fd)
