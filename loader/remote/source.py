"""Where a split's shards are read from: a local directory, or any fsspec URL with an optional cache.

``ShardSource.open(shard)`` returns a readable, seekable binary file for the tar reader, chosen in
this order::

    local directory            -> the file itself
    URL, shard in the cache    -> the cached file (shared-locked while read)
    URL, shard downloading     -> a tail of the partial file, read as the download writes it
    URL, room in the cache     -> start the download into the cache, read its tail
    URL, otherwise             -> a RangeReader streaming the shard (nothing cached)

Every remote read of a shard goes through one :class:`~.objects.RemoteObject`, which checks that
each answer comes from the version of the shard the first answer came from (HTTP and S3; see
:mod:`.objects`). A download is a thread that streams the shard (see :mod:`.ranges`) into a
reservation of the cache
(see :mod:`.cache`), hashing it; the reader reads the partial file as it grows, so the first sample
comes after the first chunk, not after the whole shard. :meth:`ShardSource.set_read_order` tells the source
the order in which this worker reads its shards; every :meth:`~ShardSource.open` then starts the
downloads of the next ``prefetch`` shards of that order in the background.

A source is made in the main process and pickled into DataLoader workers; the file system object,
the downloads and the threads are made in each process on first use.

Faults that end no epoch: a cache directory that cannot be written (read-only, its disk full, a
quota) turns caching off in the process, with one warning, and every shard is streamed past it (one
cut short by a full disk goes on from the server at the byte where the cache stopped, from the same
version of the shard). Faults that end it at once: a listed shard missing, or refused to these
credentials (:class:`~imgshards.loader.errors.ShardAccessError`). A DataLoader
worker whose parent dies while it waits on the network removes the partial cache files it is
writing and ends, instead of outliving the training as an orphan.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from hashlib import sha256
from pathlib import Path
from typing import Any, BinaryIO

from imgshards.converter.format.errors import ManifestError
from imgshards.converter.format.locate import redact_url, shown_cause
from imgshards.converter.format.manifest import INDEX_NAME, ShardInfo, is_url, local_path, open_regular
from imgshards.converter.format.remotefs import with_timeouts

from ..errors import ConfigError, ResourceLimitError, ShardAccessError, ShardReadError
from .cache import Reservation, ShardCache, end_with
from .objects import RemoteObject, remote_object
from .ranges import DEFAULT_CHUNK_SIZE, DEFAULT_TIMEOUT, RangeReader, RetryPolicy, SeekableRawReader

__all__ = ["ShardSource"]

log = logging.getLogger(__name__)

_READ_BUFFER = 1 << 20


class ShardSource:
    """Opens the shards of a packed dataset at ``root``: a directory, or an fsspec URL.

    Args:
        root: Directory or URL (``s3://bucket/prefix``, ``gs://...``, ``https://host/path``...) of
            the packed dataset.
        storage_options: Passed to the fsspec file system (endpoint, credentials, client
            options); fsspec's own configuration applies as usual. :attr:`storage_options` holds
            them with the timeouts added.
        cache_dir: Directory of the local shard cache (URLs only); None streams every shard.
        cache_limit: Most bytes the cache directory may hold; required with ``cache_dir``.
        prefetch: Shards ahead of the reader that are downloaded into the cache in the background.
        chunk_size: Bytes per ranged request.
        readahead: Requests in flight per shard being read.
        retry: How a failing request is repeated.
        timeout: Seconds a request may wait on the server, to connect and for each next piece of
            its answer, before the try fails (and is retried as ``retry`` says): given to the file
            system (:func:`~imgshards.converter.format.remotefs.with_timeouts`; a timeout set in
            ``storage_options`` wins), and bounding every wait of the reader too.

    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        prefetch: int = 2,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        readahead: int = 2,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.remote = is_url(root)
        self.root: str = str(root).rstrip("/") if self.remote else str(local_path(root))
        if (cache_dir is None) != (cache_limit is None):
            raise ConfigError("cache_dir and cache_limit go together: pass both (bytes), or neither")
        if cache_limit is not None and cache_limit < 1:
            raise ConfigError(f"cache_limit must be a positive number of bytes, got {cache_limit}")
        if prefetch < 0 or chunk_size < 1 or readahead < 1:
            raise ConfigError(
                "need prefetch >= 0, chunk_size >= 1 and readahead >= 1; "
                f"got {prefetch}, {chunk_size}, {readahead}"
            )
        if not timeout > 0:
            raise ConfigError(f"timeout must be a positive number of seconds, got {timeout}")
        self.timeout = float(timeout)
        self.storage_options = (
            with_timeouts(self.root, storage_options, self.timeout)
            if self.remote
            else dict(storage_options or {})
        )
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.cache_limit = cache_limit
        self.prefetch = prefetch
        self.chunk_size = chunk_size
        self.readahead = readahead
        self.retry = retry or RetryPolicy()
        self._state: _ProcessState | None = None

    # ---- pickling into workers: no file system, threads or downloads cross ----------------------

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_state": None}

    def _process(self) -> _ProcessState:
        if self._state is None or self._state.pid != os.getpid():
            self._state = _ProcessState(self)
        return self._state

    # ---- naming -------------------------------------------------------------------------------

    def url(self, name: str) -> str:
        """Where shard ``name`` is: its URL, or its local path."""
        return f"{self.root}/{name}" if self.remote else str(Path(self.root) / name)

    # ---- what the dataset uses ----------------------------------------------------------------

    def check(self, shards: Sequence[ShardInfo], split: str) -> dict[str, int | None]:
        """Raise :class:`ManifestError` if a shard is missing; warn if one has another size.

        Returns each shard's size as found (None where the listing gives none; empty where the root
        cannot be listed). Remote: one listing of the root (on HTTP, the links of its index page,
        which give no sizes). Skipped when the root cannot be listed (a missing shard then fails
        when it is read).
        """
        if self.remote:
            listed = self._process().listing()
            if listed is None:
                return {}
            sizes: dict[str, int | None] = dict(listed)
        else:
            found = {s.name: self._local_size(s.name, split) for s in shards}
            sizes = {name: size for name, size in found.items() if size is not None}
        for shard in shards:
            if shard.name not in sizes:
                raise ManifestError(
                    f"shard {shard.name} of split {split!r} is missing from {redact_url(self.root)}: "
                    "copy it back, or re-pack the dataset"
                )
            size = sizes[shard.name]
            if size is not None and size != shard.bytes:
                warnings.warn(
                    f"shard {redact_url(self.url(shard.name))} is {size} bytes, the index says "
                    f"{shard.bytes}: "
                    "truncated or replaced since it was packed; reading it will stop where it breaks",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return {shard.name: sizes[shard.name] for shard in shards}

    def set_read_order(self, shards: Sequence[ShardInfo]) -> None:
        """Tell the source the order this process reads its shards in, for prefetching."""
        if self.remote:
            self._process().set_read_order(shards)

    def open(self, shard: ShardInfo) -> BinaryIO:
        """Open a shard for reading (see the module docstring for where it is read from)."""
        if not self.remote:
            try:  # a regular file inside the root only: never a FIFO, a device or a link out
                f: BinaryIO = open_regular(self.url(shard.name), inside=Path(self.root))
                return f
            except (FileNotFoundError, PermissionError) as e:  # listed, yet gone or refused: a setup error
                fix = "copy the shard back, or re-pack the dataset"
                if isinstance(e, PermissionError):
                    fix = "give this user read access to it"
                raise ShardAccessError(
                    f"cannot read shard {self.url(shard.name)}: {e.strerror or e}; {fix}", shard=shard.name
                ) from e
            except OSError as e:  # goes through on_error, as a remote shard that cannot be read
                out = ResourceLimitError.of(
                    e, path=self.url(shard.name), shard=shard.name
                )  # EMFILE: a setting, not damage
                if out is not None:
                    raise out from e
                raise ShardReadError(
                    f"cannot read shard {self.url(shard.name)}: {e}", shard=shard.name
                ) from e
        return self._process().open(shard)

    def read_range(self, name: str, size: int, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the file ``name`` at the root, ``size`` bytes as the index says.

        How a split's table files are read behind a URL, a shard's entries at a time
        (:class:`~imgshards.converter.format.tablefiles.SplitTables`): one ranged request through
        the same file system, timeouts, retries and version check as a shard's
        (:class:`~.ranges.RangeReader` on :class:`~.objects.RemoteObject`), every range of a file
        from the version its first answer pinned; never the whole file. A local file is read with
        one ``pread``, opened as a shard is (a regular file inside the root).

        Raises:
            ShardAccessError: the file is gone or refused (a setting to fix).
            ShardReadError: it cannot be read (retries spent, or an I/O error).

        """
        if not 0 <= start <= stop <= size:
            raise ValueError(f"bytes {start}..{stop} of a file of {size}")
        if start == stop:
            return b""
        if self.remote:
            return self._process().read_range(name, size, start, stop)
        try:
            with open_regular(self.url(name), inside=Path(self.root)) as f:
                return os.pread(f.fileno(), stop - start, start)
        except (FileNotFoundError, PermissionError) as e:
            raise ShardAccessError(f"cannot read {self.url(name)}: {e.strerror or e}", shard=name) from e
        except OSError as e:
            raise ShardReadError(f"cannot read {self.url(name)}: {e}", shard=name) from e

    def settle(self) -> None:
        """Wait for this process's downloads into the cache to end (before a worker exits)."""
        if self._state is not None and self._state.pid == os.getpid():
            self._state.settle()

    def _local_size(self, name: str, split: str) -> int | None:
        """A local shard's size, None if it is missing; ManifestError if it is not one to open."""
        try:
            with open_regular(self.url(name), inside=Path(self.root)) as f:
                return os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ManifestError(f"shard {name} of split {split!r}: {e}; replace it with the shard") from e


class _ProcessState:
    """A source's file system, cache and downloads in one process."""

    def __init__(self, source: ShardSource) -> None:
        from fsspec.core import url_to_fs  # the loader needs fsspec for URLs only

        self.pid = os.getpid()
        self.source = source
        try:
            self.fs, self.path = url_to_fs(source.root, **source.storage_options)
        except ImportError as e:
            raise ConfigError(f"cannot read {redact_url(source.root)}: {redact_url(str(e))}") from e
        self.path = self.path.rstrip("/")
        self.lock = threading.Lock()
        self.cache: ShardCache | None = None
        self.writes_cache = False  # whether shards are still written into the cache
        if source.cache_dir is not None and source.cache_limit is not None:
            try:
                self.cache = ShardCache(source.cache_dir, source.cache_limit)
                self.writes_cache = True
            except OSError as e:  # cannot create it (a read-only file system, no permission)
                self.cache_failed(e)
        if _in_dataloader_worker():  # its parent (make_loader watches the trainer past a forkserver)
            end_with(os.getppid())
        self.downloads: dict[str, _Download] = {}
        self.files: dict[str, RemoteObject] = {}  # the files read by ranges (tables), each pinned
        self.order: list[ShardInfo] = []
        self.position: dict[str, int] = {}
        self.furthest = -1

    def listing(self) -> dict[str, int | None] | None:
        """Name -> size (None if unknown) of the files at the root, or None if it cannot be listed."""
        try:
            entries = self.fs.ls(self.path, detail=True)
        except Exception as e:  # no listing here (HTTP 403 or 404 for a directory, as nginx gives)
            status = getattr(e, "status", None)  # aiohttp's ClientResponseError is no OSError
            if isinstance(e, (OSError, NotImplementedError, ValueError)) or status in (403, 404, 405):
                return None
            text = " ".join(redact_url(str(e)).split())  # its URL may hold a password
            raise ShardAccessError(
                f"cannot list {redact_url(self.source.root)}: {type(e).__name__}: {text}; check the URL "
                "and the credentials"
            ) from shown_cause(e)
        sizes = {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: e.get("size") for e in entries}
        return sizes if INDEX_NAME in sizes else None  # else not a listing of this dataset's root

    def set_read_order(self, shards: Sequence[ShardInfo]) -> None:
        with self.lock:
            self.order = list(shards)
            self.position = {s.name: i for i, s in reversed(list(enumerate(self.order)))}
            self.furthest = -1

    def open(self, shard: ShardInfo) -> BinaryIO:
        with self.lock:  # forget finished downloads (their readers keep what they need)
            for name in [n for n, d in self.downloads.items() if d.done]:
                del self.downloads[name]
        f = self._open(shard)
        if self.cache is not None and self.source.prefetch:
            self._prefetch_after(shard)
        return f

    def _open(self, shard: ShardInfo) -> BinaryIO:
        if self.cache is not None:
            cached = self.cache.open(shard.name, shard.sha256, shard.bytes)
            if cached is not None:
                return cached
            download = self._download(shard)
            if download is not None:
                # Past the bytes the cache holds, the same object: the version the download pinned.
                restream = lambda: self._stream(download.remote)  # noqa: E731
                return io.BufferedReader(_TailReader(download, restream), _READ_BUFFER)
        return io.BufferedReader(self._stream(self._object(shard)), _READ_BUFFER)

    def _object(self, shard: ShardInfo) -> RemoteObject:
        return self._remote(shard.name, shard.bytes)

    def _remote(self, name: str, size: int) -> RemoteObject:
        deadline = functools.partial(self.source.retry.deadline, self.source.timeout)
        return remote_object(
            self.fs, f"{self.path}/{name}", redact_url(self.source.url(name)), size, deadline
        )

    def _stream(
        self, remote: RemoteObject, *, stop: int | None = None, chunk_size: int | None = None
    ) -> RangeReader:
        return RangeReader(
            remote.fetch,
            remote.size if stop is None else stop,
            name=remote.name,
            chunk_size=chunk_size or self.source.chunk_size,
            readahead=self.source.readahead,
            retry=self.source.retry,
            timeout=self.source.timeout,
            open_whole=None if remote.ranges_only else remote.open_whole,
        )

    def read_range(self, name: str, size: int, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of file ``name`` (see :meth:`ShardSource.read_range`): one request."""
        with self.lock:
            remote = self.files.get(name)
            if remote is None:
                remote = self.files[name] = self._remote(name, size)
        # A reader of the object up to `stop` alone, one chunk of the range: one request, none ahead.
        reader = self._stream(remote, stop=stop, chunk_size=stop - start)
        try:
            reader.seek(start)
            data = reader.read(stop - start)
        finally:
            reader.close()
        if data is None or len(data) != stop - start:  # a RangeReader reads to the full, or raises
            raise ShardReadError(f"{remote.name}: got {len(data or b'')} of bytes {start}-{stop}", shard=name)
        return data

    def cache_failed(self, error: OSError) -> None:
        """Stop writing the cache in this process (it cannot be written), saying so once."""
        with self.lock:
            if self.cache is not None and not self.writes_cache:
                return
            self.writes_cache = False
        warnings.warn(
            f"cannot write the shard cache {self.source.cache_dir} ({error.strerror or error}): this "
            "process streams shards without caching them from now on (cached shards are still read)",
            RuntimeWarning,
            stacklevel=2,
        )

    def _download(self, shard: ShardInfo) -> _Download | None:
        """Return the download of ``shard`` in this process (started now if there is room), or None."""
        assert self.cache is not None
        with self.lock:
            download = self.downloads.get(shard.name)
            if download is not None and (not download.failed or isinstance(download.error, ShardAccessError)):
                return download  # (one that met a setup error raises it to its reader: never tried again)
            if not self.writes_cache:
                return None
            try:
                reservation = self.cache.reserve(shard.name, shard.sha256, shard.bytes)
            except OSError as e:  # read-only, no permission, no inode left: stream it (below)
                failure = e
            else:
                if reservation is None:
                    return None
                remote = self._object(shard)
                download = _Download(self._stream(remote), remote, reservation, shard, self.cache_failed)
                self.downloads[shard.name] = download
                return download
        self.cache_failed(failure)  # out of the lock, which it takes
        return None

    def settle(self) -> None:
        with self.lock:
            downloads = list(self.downloads.values())
        for download in downloads:
            download.wait(download.patience)  # a download whose server stalls ends on its own

    def _prefetch_after(self, shard: ShardInfo) -> None:
        assert self.cache is not None
        with self.lock:
            self.furthest = max(self.furthest, self.position.get(shard.name, -1))
            ahead = self.order[self.furthest + 1 : self.furthest + 1 + self.source.prefetch]
        for nxt in ahead:
            if not self.cache.path(nxt.name, nxt.sha256).exists():
                self._download(nxt)


class _Download:
    """A thread streaming one shard into its cache reservation; readers wait on its progress."""

    def __init__(
        self,
        stream: RangeReader,
        remote: RemoteObject,
        reservation: Reservation,
        shard: ShardInfo,
        on_cache_error: Callable[[OSError], None],
    ) -> None:
        self.shard = shard
        self.remote = remote
        self.size = shard.bytes
        self.path = reservation.partial
        self.written = 0
        self.done = False
        self.error: BaseException | None = None  # the shard cannot be read
        self.cache_error: OSError | None = None  # the cache cannot be written: stream the rest
        self.patience = stream.patience  # longest wait for the next chunk
        self._on_cache_error = on_cache_error
        self._stream = stream
        self._reservation = reservation
        self._cond = threading.Condition()
        self._fd = os.open(reservation.partial, os.O_RDONLY | os.O_CLOEXEC)  # valid after the rename
        threading.Thread(target=self._run, name=f"imgshards-download-{shard.name}", daemon=True).start()

    @property
    def failed(self) -> bool:
        return self.done and self.error is not None

    def _run(self) -> None:
        digest = sha256()
        try:
            for chunk in self._stream.chunks():
                if not self._cached(self._reservation.write, chunk):
                    return
                digest.update(chunk)
                with self._cond:
                    self.written += len(chunk)
                    self._cond.notify_all()
            if digest.hexdigest() == self.shard.sha256:
                self._cached(self._reservation.commit)
            else:
                self._reservation.abort()
                warnings.warn(
                    f"shard {self._stream.name} does not hash as the index says: it changed since it "
                    "was packed; it is read as it is, and not cached",
                    RuntimeWarning,
                    stacklevel=1,
                )
        except BaseException as e:
            self.error = e
            self._reservation.abort()
        finally:
            self._stream.close()
            with self._cond:
                self.done = True
                self._cond.notify_all()

    def _cached(self, write: Callable[..., None], *args: Any) -> bool:
        """Call ``write`` (into the cache); on an error of the disk, end the download. Say if it went."""
        try:
            write(*args)
        except OSError as e:  # the disk is full, the directory went read-only...
            self.cache_error = e
            with contextlib.suppress(OSError):
                self._reservation.abort()
            self._on_cache_error(e)
            return False
        return True

    def wait(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the download to end; say whether it did."""
        with self._cond:
            return self._cond.wait_for(lambda: self.done, timeout)

    def available(self, pos: int) -> int:
        """Wait until byte ``pos`` is written (or the download ended); return the bytes written.

        Raises:
            ShardReadError: the shard cannot be read, or no chunk came for :attr:`patience` seconds.

        """
        with self._cond:
            while self.written <= pos and not self.done:
                written = self.written
                if not self._cond.wait(self.patience) and self.written == written and not self.done:
                    raise ShardReadError(
                        f"shard {self._stream.name}: no bytes after byte {written} in {self.patience:.0f} s",
                        shard=self._stream.name,
                    )
            if self.written <= pos and self.error is not None:
                error = ShardAccessError if isinstance(self.error, ShardAccessError) else ShardReadError
                raise error(str(self.error), shard=self._stream.name) from self.error
            return self.written

    def pread(self, buffer: memoryview, pos: int) -> int:
        return os.preadv(self._fd, [buffer], pos)

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)


class _TailReader(SeekableRawReader):
    """Reads a shard from the partial file its download is writing, waiting for bytes not yet there.

    Past the bytes of a download the cache stopped (a full disk), reads from ``restream()``.
    """

    def __init__(self, download: _Download, restream: Callable[[], RangeReader]) -> None:
        super().__init__(download.size, download.shard.name)
        self._download = download
        self._restream = restream
        self._rest: RangeReader | None = None

    def readinto(self, b: Any) -> int:
        if self._pos >= self._size:
            return 0
        written = self._download.available(self._pos)
        # Past what a download cut short by a full disk wrote, the partial file holds no data (a
        # hole, read as zeros): never read there, and a negative slice would take most of ``b``.
        out = memoryview(b).cast("B")[: max(0, written - self._pos)]
        if out:
            n = self._download.pread(out, self._pos)
            self._pos += n
            return n
        if self._download.cache_error is None:
            return 0  # the download ended short of this byte
        if self._rest is None:
            self._rest = self._restream()
        self._rest.seek(self._pos)
        n = self._rest.readinto(b)
        self._pos += n
        return n

    def close(self) -> None:
        """Close the stream past the cache, if one was opened."""
        if self._rest is not None:
            self._rest.close()
        super().close()


def _in_dataloader_worker() -> bool:
    from torch.utils.data import get_worker_info  # the loader imports torch already

    return get_worker_info() is not None
