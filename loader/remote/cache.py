"""A bounded local directory of whole shards, shared by the processes of one machine, evicted LRU.

Files in the cache directory ``CACHE``::

    CACHE/.lock                                       locked while space is counted and reserved
    CACHE/train-000042.<sha256[:20]>.tar              a whole shard, named by its content
    CACHE/.train-000042.<sha256[:20]>.tar.<pid>-<n>.partial    a shard being written

Invariants, held by every process that uses the directory with the same ``limit``:

1. **A file under a final name is a whole shard whose SHA-256 is the index's.** It is written under
   a partial name, hashed as it arrives, fsynced and renamed (atomic on one file system); a shard
   that does not hash as the index says is never renamed. Names carry the hash, so a re-packed
   dataset never reads an old shard of the same name, and two datasets can share the directory.
2. **The sizes of the files in CACHE add up to at most ``limit`` at every moment.** Bytes are added
   only by creating a partial file at its shard's full size (``ftruncate``; sparse until written),
   and only under the exclusive lock on ``CACHE/.lock``, after adding up every file there and
   evicting whole shards until the new one fits. Writing into a partial file never grows it,
   renaming keeps the total (and happens under the lock too, so whoever adds up the files while
   holding it counts each shard once), and eviction only lowers it.
3. **A partial file is flocked by its writer for as long as it is written.** One that another
   process can lock was left by a dead process and is removed by the next reservation. At most one
   process writes a given shard: a live partial of it makes other processes stream it instead.
4. **Eviction takes the least recently used shards (oldest mtime, bumped on every hit) that no one
   is reading.** Readers hold a shared ``flock`` on a cached shard while they read it; eviction
   skips shards it cannot lock exclusively. (A reader that opened a shard just before it was
   evicted still reads it whole from its open file.)
5. **The cache never blocks reading.** When no room can be made (the shard is larger than the
   limit, or everything else is being read or written), the shard is streamed without caching; so
   it is when the directory cannot be written (read-only, or its disk full: the reader of
   :mod:`.source` says so once, and reads on from the server).

The lock on ``CACHE/.lock`` is a POSIX record lock (``lockf``) taken under a lock of the process:
unlike an ``flock``, it is not inherited by a DataLoader worker forked while a thread of the parent
holds it (the child would hold it forever: the thread holding it is not forked). The ``flock`` on a
partial file or on a shard being read is inherited by a child forked meanwhile: that file then
stays unevictable (or its partial file alive) until the child exits too, which wastes room, never
data.

Locks are reliable on local file systems only: share a cache directory between the workers and
ranks of one machine, not between machines over NFS.

A cache directory someone else can write to is untrusted input: one not owned by this user, or
writable by its group or by others, is refused (:class:`~imgshards.loader.errors.ConfigError`, one
line); one the cache makes is ``0o755``. A file is read from the cache only if it is what the cache
writes: a regular file (opened ``O_NOFOLLOW | O_NONBLOCK``, then checked with ``fstat``: never a
link, a FIFO, a device), owned by this user, with one link, of the shard's size. Anything else under
a shard's name is removed, with a warning, and the shard downloaded again (one that cannot be
removed, a directory, makes it stream past the cache). The content is not hashed again at each
open: only this user can write into the directory, and the cache writes a file under its final
name only after hashing it (invariant 1).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import select
import stat
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from imgshards.converter.format.manifest import check_name

from ..errors import ConfigError

__all__ = ["CacheEntry", "Reservation", "ShardCache", "end_with", "remove_partials"]

_LOCK_NAME = ".lock"
_PARTIAL = ".partial"
_READ_BUFFER = 1 << 20
_counter = itertools.count()
_counter_lock = threading.Lock()
# Held around the record lock on CACHE/.lock: record locks belong to the process, so two threads
# would both get one, and closing either's file would release both.
_process_lock = threading.Lock()


# The partial files this process writes, for remove_partials() (a forked child writes none of them).
_partials: set[Path] = set()
_partials_lock = threading.Lock()


# The processes this one ends with (end_with), each watched by one thread (a forked child: none).
_watched: set[int] = set()


def _after_fork() -> None:
    global _process_lock, _partials_lock
    _process_lock = threading.Lock()  # a thread of the parent may have held it at the fork
    _partials_lock = threading.Lock()
    _partials.clear()
    _watched.clear()


def remove_partials() -> None:
    """Remove the partial files this process is writing, just before it ends without unwinding.

    For a process that is about to ``os._exit`` (a DataLoader worker whose training process died):
    its download threads never get to abort their reservations.
    """
    with _partials_lock:
        for path in _partials:
            with contextlib.suppress(OSError):
                path.unlink()
        _partials.clear()


def end_with(pid: int) -> None:
    """End this process (a DataLoader worker) when process ``pid`` ends, removing its partial files.

    DataLoader's own watchdog looks at the worker's parent between batches only, never while the
    worker waits on the network inside a batch, and a worker started from a forkserver has the server
    as its parent, which outlives a killed training process. A daemon thread waits for ``pid`` (on a
    pidfd where the OS has them, else a check every half second), then :func:`remove_partials` and
    ``os._exit``. Once per ``pid`` in a process.
    """
    if pid in _watched:
        return
    _watched.add(pid)
    try:
        fd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux; or the process is gone already
        fd = None
    threading.Thread(target=_wait_for, args=(pid, fd), name=f"imgshards-end-with-{pid}", daemon=True).start()


def _wait_for(pid: int, fd: int | None) -> None:
    if fd is not None:
        select.select([fd], [], [])  # readable once the process has ended
    else:
        # The parent: it is gone once this process has another; any other process: signal 0.
        parent = pid == os.getppid()
        while os.getppid() == pid if parent else _alive(pid):
            time.sleep(0.5)
    remove_partials()  # the cache files this worker was writing: no one else would remove them now
    os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


os.register_at_fork(after_in_child=_after_fork)


def cache_name(shard: str, sha256: str) -> str:
    """The file name of a shard in the cache: its name with (a prefix of) its SHA-256."""
    stem, dot, ext = shard.rpartition(".")
    return f"{stem}.{sha256[:20]}.{ext}" if dot else f"{shard}.{sha256[:20]}"


@dataclass(frozen=True)
class CacheEntry:
    """A file in the cache directory, as seen when space is counted."""

    path: Path
    size: int
    mtime: float
    partial: bool


class Reservation:
    """Space reserved for one shard: a locked partial file of the shard's size, written in order.

    :meth:`commit` or :meth:`abort` ends it; :meth:`abort` after a failed :meth:`commit` (the
    rename failed: the cache directory went away) removes what is left. The file descriptor is
    closed exactly once: closing a number twice could close a file another thread opened meanwhile.
    """

    def __init__(self, cache: ShardCache, partial: Path, final: Path, fd: int, size: int) -> None:
        self.partial, self.final, self.size = partial, final, size
        self._cache = cache
        self._fd: int | None = fd
        self.written = 0
        with _partials_lock:
            _partials.add(partial)

    def write(self, data: memoryview | bytes) -> None:
        """Append ``data`` (never past the reserved size)."""
        view = memoryview(data)
        if self.written + len(view) > self.size:
            raise ValueError(f"{self.final.name}: writing past the {self.size} bytes reserved")
        fd = self._open_fd()
        while view:
            n = os.pwrite(fd, view, self.written)
            self.written += n
            view = view[n:]

    def commit(self) -> None:
        """Make the whole shard visible under its final name (after fsync), then unlock it."""
        if self.written != self.size:
            raise ValueError(f"{self.final.name}: committing {self.written} of {self.size} bytes")
        try:
            os.fsync(self._open_fd())
            # Under the partial's lock (no one takes it as stale) and the cache lock (whoever counts
            # the files under that lock sees the shard once, by one name or the other).
            with self._cache.locked():
                os.rename(self.partial, self.final)
        finally:
            self._close()

    def abort(self) -> None:
        """Give the space back (also after a :meth:`commit` that failed)."""
        try:
            self.partial.unlink(missing_ok=True)
        finally:
            self._close()

    def _open_fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.final.name}: the reservation has ended")
        return self._fd

    def _close(self) -> None:
        """Close the partial file (which drops its lock), once."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
            with _partials_lock:
                _partials.discard(self.partial)


class ShardCache:
    """Whole shards in ``root``, at most ``limit`` bytes of files in all (see the module docstring).

    Args:
        root: The cache directory; created if missing. Share it between processes of one machine.
        limit: Most bytes the files in ``root`` may hold together.

    """

    def __init__(self, root: str | os.PathLike[str], limit: int) -> None:
        if limit < 1:
            raise ValueError(f"cache limit must be a positive number of bytes, got {limit}")
        self.root = Path(root)
        self.limit = limit
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)  # group and others: no write
        _check_private(self.root)

    def path(self, shard: str, sha256: str) -> Path:
        """Where the shard lives in the cache when it is there: always directly in ``root``.

        Raises:
            ManifestError: ``shard`` is not a plain file name (the index checks it already; the cache
                writes files, so it checks again).

        """
        check_name(shard, "shard name", str(self.root))
        path = self.root / cache_name(shard, sha256)
        if path.parent != self.root:
            raise ValueError(f"{shard!r} with hash {sha256!r} names a file outside the cache {self.root}")
        return path

    def open(self, shard: str, sha256: str, size: int | None = None) -> BinaryIO | None:
        """Open the cached shard for reading (shared-locked, its use time bumped), or None on a miss.

        Only a file the cache wrote is read (see the module docstring); anything else under the
        shard's name (of another ``size`` than given, too) is removed with a warning: a miss.
        """
        path = self.path(shard, sha256)
        try:  # never follows a link, never waits on a FIFO
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:  # ELOOP: a link; ENXIO: a socket
            self._discard(path, "a symbolic link" if os.path.islink(path) else (e.strerror or str(e)))
            return None
        st = os.fstat(fd)
        problem = _not_ours(st, size)
        if problem is not None:
            os.close(fd)
            self._discard(path, problem)
            return None
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        f = os.fdopen(fd, "rb", buffering=_READ_BUFFER)
        fcntl.flock(f, fcntl.LOCK_SH)  # held until the reader closes the file
        # Evicted between open and flock: still whole. A read-only cache directory serves its shards
        # without recording the use.
        with contextlib.suppress(OSError):
            os.utime(fd)
        return f

    def _discard(self, path: Path, what: str) -> None:
        """Remove what is under a shard's name though the cache did not write it, saying so."""
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as e:  # a directory; or the directory is read-only: stream the shard past it
            warnings.warn(
                f"the shard cache holds {path}, {what}, not a shard it wrote; it cannot be removed "
                f"({e.strerror or e}): the shard is streamed past the cache; remove it",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        warnings.warn(
            f"the shard cache held {path}, {what}, not a shard it wrote: removed, the shard is "
            "downloaded again",
            RuntimeWarning,
            stacklevel=3,
        )

    def reserve(self, shard: str, sha256: str, size: int) -> Reservation | None:
        """Make room for a shard of ``size`` bytes and return its partial file, or None (stream it).

        None when the shard is cached already, another process is writing it, or no room can be made.
        """
        if not 0 <= size <= self.limit:
            return None
        final = self.path(shard, sha256)
        with self.locked():
            entries = self._entries(clean=True)
            writing = any(e.partial and e.path.name.startswith(f".{final.name}.") for e in entries)
            if writing or os.path.lexists(final):
                return None
            used = sum(e.size for e in entries)
            for victim in sorted((e for e in entries if not e.partial), key=lambda e: e.mtime):
                if used + size <= self.limit:
                    break
                if _remove_unused(victim.path):
                    used -= victim.size
            if used + size > self.limit:
                return None
            with _counter_lock:
                n = next(_counter)
            partial = self.root / f".{final.name}.{os.getpid()}-{n}{_PARTIAL}"
            fd = os.open(partial, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, size)
        return Reservation(self, partial, final, fd, size)

    def usage(self) -> int:
        """Bytes the files in the cache hold now, partial files at their reserved size."""
        with self.locked():
            return sum(e.size for e in self._entries(clean=False))

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the cache lock: no space is reserved, evicted or committed meanwhile."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        with _process_lock:
            fd = os.open(self.root / _LOCK_NAME, flags, 0o644)  # not through a link, not on a FIFO
            with open(fd, "a") as f:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(f"{self.root / _LOCK_NAME} is not a regular file")
                fcntl.lockf(f, fcntl.LOCK_EX)  # released when f closes
                yield

    def _entries(self, *, clean: bool) -> list[CacheEntry]:
        """Every file in the cache but the lock; with ``clean``, partial files of dead processes go."""
        entries = []
        with os.scandir(self.root) as it:
            for d in it:
                if d.name == _LOCK_NAME or not d.is_file(follow_symlinks=False):
                    continue
                partial = d.name.endswith(_PARTIAL)
                if partial and clean and _remove_unused(Path(d.path)):
                    continue
                try:
                    st = d.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                entries.append(CacheEntry(Path(d.path), st.st_size, st.st_mtime, partial))
        return entries


def _check_private(root: Path) -> None:
    """Refuse a cache directory another user could write into (see the module docstring)."""
    st = os.stat(root)
    uid = os.geteuid()
    if st.st_uid != uid:
        raise ConfigError(
            f"cache directory {root} belongs to uid {st.st_uid}, not to this user (uid {uid}): another "
            "user could put files in it; give cache_dir a directory of your own"
        )
    if st.st_mode & 0o022:
        raise ConfigError(
            f"cache directory {root} is writable by its group or by others (mode "
            f"{stat.S_IMODE(st.st_mode):o}): anyone could put files in it; run `chmod go-w {root}`, or "
            "give cache_dir another directory"
        )


def _not_ours(st: os.stat_result, size: int | None) -> str | None:
    """Why a file opened under a shard's name is not one the cache wrote (None: it may be read)."""
    if not stat.S_ISREG(st.st_mode):
        kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"))
        return next((what for test, what in kinds if test(st.st_mode)), "not a regular file")
    if st.st_uid != os.geteuid():
        return f"a file of uid {st.st_uid}"
    if st.st_nlink != 1:
        return f"a file with {st.st_nlink} links"
    if size is not None and st.st_size != size:
        return f"a file of {st.st_size} bytes where the shard has {size}"
    return None


def _remove_unused(path: Path) -> bool:
    """Remove ``path`` if no process holds a lock on it; say whether it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)
