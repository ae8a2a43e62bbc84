"""Read a remote shard as consecutive byte ranges, a few requests ahead, resuming where a request broke.

A shard is fetched in chunks, one ranged GET each (``fs.cat_file(path, start, end)``), with
``readahead`` of them in flight: the first sample is read as soon as the first chunk is in, long
before the whole shard has arrived, and the latency of each request hides behind the reading of the
chunks before it. Any fsspec file system that serves byte ranges works (S3, GCS, HTTP, Azure...).

A request that fails with a transient error (connection reset or cut short, timeout, HTTP 5xx, 408
or 429) is repeated for the same range after a backoff, so the stream resumes at the first byte it
does not hold: bytes already handed to the reader are never fetched or handed out again, so a broken
connection neither restarts the shard nor repeats a sample. A range that still fails after
:attr:`RetryPolicy.attempts` tries raises :class:`~imgshards.loader.errors.ShardReadError` naming
the shard, the byte range and the last error (the pass skips and counts the rest of the shard). An
error of the setup (no credentials, 401, 403, 404: :func:`access_error`) raises
:class:`~imgshards.loader.errors.ShardAccessError` at once, never retried nor skipped; another error
retrying cannot fix (416, another 4xx) raises :class:`~imgshards.loader.errors.ShardReadError` at once.

A server that ignores ``Range`` (it answers with the whole object: :class:`RangesIgnored`) is read
from the start of the object instead, in one streamed GET that the reader reads forward, dropping
the bytes before the position it needs (``open_whole``).

A request that stalls is such a transient error: the file system's own connect and read timeouts
(``timeout`` seconds, given to it as storage options: see
:func:`imgshards.converter.format.remotefs.with_timeouts`) end a try whose server stops answering. A server
that trickles (a byte now and then, each one resetting the read timeout) is ended by the request's
deadline, :meth:`RetryPolicy.deadline`: ``2 x timeout`` plus its bytes at :data:`MIN_RATE` (HTTP and
S3: :mod:`.objects`). Every wait on a request is bounded here as well, so a file system that ignores
those options cannot hang a reader either: a range whose tries have not ended after
:meth:`RetryPolicy.patience` seconds raises :class:`~imgshards.loader.errors.ShardReadError` (its
fetch thread is left to end on its own). A redirect off HTTP(S) (to ``file://``...) is an error of
the setup (:func:`access_error`), never retried.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Protocol

from imgshards.converter.format.locate import redact_url, shown_cause
from imgshards.converter.format.protocols import DENIED_HINT, NO_CREDENTIALS_ERRORS, for_url
from imgshards.converter.format.remotefs import DEFAULT_TIMEOUT

from ..errors import ShardAccessError, ShardReadError

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_TIMEOUT",
    "MIN_RATE",
    "AnswerTooSlow",
    "Fetch",
    "RangeReader",
    "RangesIgnored",
    "RetryPolicy",
    "SeekableRawReader",
    "WholeStream",
    "access_error",
    "is_transient",
]

log = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 8 << 20
MIN_RATE = 64 << 10
"""The floor speed, bytes per second: a request may take ``2 x timeout`` plus its bytes at this rate."""
# Fetch threads per process, shared by every open stream of that process (a DataLoader worker reads
# up to 16 shards at once while it interleaves them).
_FETCH_THREADS = 16
# Most bytes one read of a whole-object answer asks for (what is dropped before a range is read in
# pieces of this size, never held at once).
_SKIP_PIECE = 1 << 20

Fetch = Callable[[int, int], bytes]
"""``fetch(start, end)`` returns bytes ``[start, end)`` of one object."""


class WholeStream(Protocol):
    """One answer holding a whole object, read forward: ``read(n)`` gives up to ``n`` bytes, b"" past it."""

    def read(self, n: int) -> bytes: ...  # noqa: D102

    def close(self) -> None: ...  # noqa: D102


class AnswerTooSlow(Exception):  # transient: retried as a stall is
    """A request's answer did not end within its deadline (:meth:`RetryPolicy.deadline`).

    Not a ``TimeoutError``: fsspec's ``sync`` would turn it into an ``FSTimeoutError`` without its text.
    """


class RangesIgnored(Exception):  # a signal from a fetch to its reader, never raised to the user
    """A ranged request was answered with the whole object: the server does not honour ``Range``."""


# Errors that retrying cannot fix. Everything else (OSError, timeouts, the HTTP client's payload and
# connection errors, 5xx responses) counts as transient.
_PERMANENT: tuple[type[BaseException], ...] = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    ShardReadError,
    TypeError,
    ValueError,
)
_RETRYABLE_STATUS = frozenset({408, 429})
# aiohttp's errors (by name: it is optional) for a redirect off HTTP(S), or to no URL at all.
_BAD_REDIRECT = frozenset({"NonHttpUrlRedirectClientError", "InvalidUrlRedirectClientError"})


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How often and how patiently a failing byte range is fetched again.

    Attributes:
        attempts: Tries per range, the first included, before the shard counts as unreadable.
        backoff: Seconds before the first retry; doubled before each next one.
        max_backoff: Longest wait between two tries.

    """

    attempts: int = 6
    backoff: float = 0.25
    max_backoff: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError(f"backoff times must be >= 0, got {self.backoff}, {self.max_backoff}")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failed try."""
        return min(self.max_backoff, self.backoff * 2.0 ** (failures - 1))

    def deadline(self, timeout: float, size: int) -> float:
        """Seconds one request for ``size`` bytes may take in all: ``2 x timeout``, plus ``size`` at MIN_RATE.

        ``2 x timeout``: to connect, then to wait for the answer; the bytes at the floor speed, so an
        answer that keeps coming too slowly (each byte resetting the read timeout) ends too.
        """
        return 2 * timeout + size / MIN_RATE

    def patience(self, timeout: float, size: int) -> float:
        """Longest wait for a range of ``size`` bytes: every try (each within its deadline) and backoff."""
        per_try = self.deadline(timeout, size)
        return self.attempts * per_try + sum(self.delay(i) for i in range(1, self.attempts))


def access_error(error: BaseException, name: str) -> ShardAccessError | None:
    """The error to raise at once for ``error`` met reading shard ``name``, if it is one of the setup.

    No credentials, 401/403 or a PermissionError, 404/410 or a FileNotFoundError: the settings (or the
    dataset) are wrong, and neither retrying nor skipping the shard mends that. None for the rest.
    """
    status = getattr(error, "status", None)  # aiohttp.ClientResponseError
    if type(error).__name__ in NO_CREDENTIALS_ERRORS:
        cause = "no credentials for the object store"
        fix = (
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (or the key and secret "
            "in storage_options)"
        )
    elif isinstance(error, PermissionError) or status in (401, 403):
        cause = "access denied"
        protocol = for_url(name)  # each file system asks for its credentials its own way
        fix = protocol.denied_hint if protocol is not None else DENIED_HINT
    elif isinstance(error, FileNotFoundError) or status in (404, 410):
        cause = "not found, though the index lists it"
        fix = "copy the shard back, or re-pack the dataset"
    elif _BAD_REDIRECT.intersection(c.__name__ for c in type(error).__mro__):
        cause = "the server redirects it off HTTP(S): refused"
        fix = "check the URL, or what the server redirects to"
    else:
        return None
    return ShardAccessError(f"shard {name}: {cause} ({_one_line(error)}); {fix}", shard=name)


def is_transient(error: BaseException) -> bool:
    """Whether fetching the same range again may succeed."""
    status = getattr(error, "status", None)  # aiohttp.ClientResponseError
    if isinstance(status, int) and 400 <= status < 500:
        return status in _RETRYABLE_STATUS
    return not isinstance(error, _PERMANENT)


class SeekableRawReader(io.RawIOBase):
    """A read-only raw stream over ``size`` bytes with a read position; subclasses fill ``readinto``.

    Seeking only moves the position (never past the end of what can be read: a later read there gives
    nothing); a negative position is a ``ValueError``, as for a file.
    """

    def __init__(self, size: int, name: str) -> None:
        super().__init__()
        self._size = size
        self._pos = 0
        self.name = name

    def readable(self) -> bool:
        """Return True."""
        return True

    def seekable(self) -> bool:
        """Return True: a seek costs nothing until the next read."""
        return True

    def tell(self) -> int:
        """Return the read position."""
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move the read position."""
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset} in {self.name}")
        self._pos = base + offset
        return self._pos


class RangeReader(SeekableRawReader):
    """A read-only, seekable raw stream over one object of known size, fetched in ranged requests.

    Wrap it in :class:`io.BufferedReader` for small reads. Seeking past the chunks in flight drops
    them and starts fetching at the new position, so skipping most of a shard costs no transfer.
    When ``fetch`` raises :class:`RangesIgnored`, the reader reads the rest from ``open_whole()``
    instead, one range at a time (with it None, that is a :class:`ShardReadError`).

    Args:
        fetch: Returns bytes ``[start, end)`` of the object (called from fetch threads).
        size: The object's size in bytes (from the index: no request is spent on it).
        name: The shard as named in errors (its URL).
        chunk_size: Bytes per request.
        readahead: Requests in flight ahead of the read position.
        retry: How a failing request is repeated.
        timeout: Seconds the file system behind ``fetch`` is told a request may wait on the server;
            bounds every wait here too (:meth:`RetryPolicy.patience`).
        open_whole: Opens the object for reading from its first byte, for a server that ignores
            ``Range``.

    """

    def __init__(
        self,
        fetch: Fetch,
        size: int,
        *,
        name: str,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        readahead: int = 2,
        retry: RetryPolicy | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        open_whole: Callable[[], WholeStream] | None = None,
    ) -> None:
        super().__init__(size, name)
        if chunk_size < 1 or readahead < 1:
            raise ValueError(f"chunk_size and readahead must be >= 1, got {chunk_size}, {readahead}")
        if timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        self._fetch = fetch
        self._open_whole = open_whole
        self._from_start: _FromStart | None = None  # set once the server is seen to ignore Range
        self._chunk_size = chunk_size
        self._readahead = readahead
        self._retry = retry or RetryPolicy()
        self.patience = self._retry.patience(timeout, chunk_size)
        self._buf = memoryview(b"")
        self._buf_start = 0
        self._pending: deque[tuple[int, int, Future[bytes]]] = deque()
        self._next = 0  # first byte not yet requested
        self.retries = 0  # failed tries that were repeated, over the life of the stream

    def readinto(self, b: Any) -> int:
        """Read into ``b`` until it is full or the object ends, waiting for chunks as needed."""
        out = memoryview(b).cast("B")
        n = 0
        while n < len(out) and self._pos < self._size:
            chunk = self._chunk_at(self._pos)
            offset = self._pos - self._buf_start
            take = min(len(out) - n, len(chunk) - offset)
            out[n : n + take] = chunk[offset : offset + take]
            n += take
            self._pos += take
        return n

    def close(self) -> None:
        """Drop the requests in flight (those already running finish in their threads)."""
        for _, _, future in self._pending:
            future.cancel()
        self._pending.clear()
        self._buf = memoryview(b"")
        if self._from_start is not None:
            self._from_start.close()
        super().close()

    # ---- whole chunks, for writing a shard into the cache -------------------------------------

    def chunks(self) -> Iterator[memoryview]:
        """Yield the rest of the object from the current position, one fetched chunk at a time."""
        while self._pos < self._size:
            chunk = self._chunk_at(self._pos)
            piece = chunk[self._pos - self._buf_start :]
            self._pos += len(piece)
            yield piece

    # ---- fetching -----------------------------------------------------------------------------

    def _chunk_at(self, pos: int) -> memoryview:
        """The fetched chunk holding byte ``pos`` (which is below the size)."""
        if self._buf_start <= pos < self._buf_start + len(self._buf):
            return self._buf
        while self._pending and self._pending[0][1] <= pos:  # chunks seeked past
            self._pending.popleft()[2].cancel()
        if not self._pending or self._pending[0][0] > pos:  # a seek outside what is in flight
            for _, _, future in self._pending:
                future.cancel()
            self._pending.clear()
            self._next = pos
        self._request()
        start, end, future = self._pending.popleft()
        if self._from_start is None:
            self._request()  # keep `readahead` requests in flight while this one is read
        try:
            data = future.result(timeout=self.patience)
        except FutureTimeout:
            future.cancel()
            raise ShardReadError(
                f"shard {self.name}: no answer for bytes {start}-{end} in {self.patience:.0f} s "
                "(the server stalls, and its file system ignores the timeout it was given)",
                shard=self.name,
            ) from None
        except RangesIgnored as e:
            if self._open_whole is None or self._from_start is not None:
                raise ShardReadError(
                    f"asked for bytes {start}-{end} of shard {self.name}, got another answer ({e}): "
                    "the server does not honour range requests",
                    shard=self.name,
                ) from None
            self._read_from_start()
            return self._chunk_at(pos)
        self._buf, self._buf_start = memoryview(data), start
        return self._buf

    def _read_from_start(self) -> None:
        """From now on, fetch each range from one answer holding the whole object (read forward)."""
        assert self._open_whole is not None
        log.info("%s: the server ignores Range; reading it from its start in one GET", self.name)
        for _, _, future in self._pending:
            future.cancel()
        self._pending.clear()
        self._from_start = _FromStart(self._open_whole)
        self._fetch = self._from_start
        self._readahead = 1  # one answer read in order: a range at a time

    def _request(self) -> None:
        while len(self._pending) < self._readahead and self._next < self._size:
            start, end = self._next, min(self._next + self._chunk_size, self._size)
            self._pending.append((start, end, _pool().submit(self._fetch_range, start, end)))
            self._next = end

    def _fetch_range(self, start: int, end: int) -> bytes:
        failures = 0
        while True:
            try:
                data = self._fetch(start, end)
            except (RangesIgnored, ShardAccessError):
                raise  # for the reader (a server that ignores Range), or for the user at once
            except Exception as e:
                fatal = access_error(e, self.name)
                if fatal is not None:
                    raise fatal from shown_cause(e)
                if not is_transient(e):
                    raise ShardReadError(
                        f"cannot read bytes {start}-{end} of shard {self.name}: {_describe(e)}",
                        shard=self.name,
                    ) from shown_cause(e)
                error: BaseException = e
            else:
                if len(data) == end - start:
                    return data
                if len(data) > end - start:
                    raise RangesIgnored(f"{len(data)} bytes")
                error = EOFError(f"got {len(data)} of {end - start} bytes")
            failures += 1
            if failures >= self._retry.attempts:
                raise ShardReadError(
                    f"shard {self.name}: reading bytes {start}-{end} failed {failures} times; last "
                    f"error: {_describe(error)}",
                    shard=self.name,
                ) from shown_cause(error)
            self.retries += 1
            # A stall is worth a line where logging is not set up (Python prints warnings then): the
            # reader waited a whole timeout, with nothing to show for it.
            level = logging.WARNING if _is_timeout(error) else logging.INFO
            log.log(level, "retrying bytes %d-%d of %s after %s", start, end, self.name, _describe(error))
            time.sleep(self._retry.delay(failures))


def _is_timeout(error: BaseException) -> bool:
    """Whether ``error`` is a try that timed out (asyncio's and aiohttp's, botocore's ReadTimeoutError...)."""
    timeouts = (TimeoutError, asyncio.TimeoutError, AnswerTooSlow)
    return isinstance(error, timeouts) or "Timeout" in type(error).__name__


def _describe(error: BaseException) -> str:
    text = redact_url(str(error))  # a file system's error may quote the URL whole, password and all
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _one_line(error: BaseException) -> str:
    return " ".join(_describe(error).split())


class _FromStart:
    """``fetch(start, end)`` from one answer holding the whole object, for a server that ignores Range.

    Reads forward, dropping the bytes before ``start``; a range behind what was read (a seek back, or
    a retry after the answer broke) opens a new answer from the first byte. The reader asks for one
    range at a time; the lock keeps a range still running after a seek from reading meanwhile.
    """

    def __init__(self, open_whole: Callable[[], WholeStream]) -> None:
        self._open = open_whole
        self._stream: WholeStream | None = None
        self._pos = 0
        self._lock = threading.Lock()

    def __call__(self, start: int, end: int) -> bytes:
        with self._lock:
            try:
                return self._read(start, end)
            except BaseException:
                self._close()  # the answer is broken or behind: the next range opens another
                raise

    def _read(self, start: int, end: int) -> bytes:
        if self._stream is None or start < self._pos:
            self._close()
            self._stream = self._open()
            self._pos = 0
        parts = []
        while self._pos < end:
            piece = self._stream.read(min(end, self._pos + _SKIP_PIECE) - self._pos)
            if not piece:
                break
            if self._pos + len(piece) > start:
                parts.append(piece[max(0, start - self._pos) :])
            self._pos += len(piece)
        return b"".join(parts)

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()
            except Exception as e:  # closing a broken answer: nothing left to read from it anyway
                log.debug("closing an answer: %s", _describe(e))


class _FetchPool:
    """Daemon threads that run fetches (daemons: a process exits without waiting for a stalled GET)."""

    def __init__(self, threads: int) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        for i in range(threads):
            threading.Thread(target=self._work, name=f"imgshards-fetch-{i}", daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((future, fn, args))
        return future

    def _work(self) -> None:
        while True:
            future, fn, args = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:
                future.set_exception(e)


_pools: dict[int, _FetchPool] = {}
_pools_lock = threading.Lock()


def _after_fork() -> None:
    global _pools_lock
    _pools.clear()
    _pools_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork)


def _pool() -> _FetchPool:
    """Return this process's fetch pool (a forked DataLoader worker makes its own: threads do not fork)."""
    pid = os.getpid()
    with _pools_lock:
        if pid not in _pools:
            _pools.clear()
            _pools[pid] = _FetchPool(_FETCH_THREADS)
        return _pools[pid]
