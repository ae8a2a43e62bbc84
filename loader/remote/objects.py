"""One shard on a server, read in byte ranges that all come from one version of it.

A shard replaced on the server while a pass reads it (re-packed or re-uploaded meanwhile) would hand
the tar reader the bytes of two versions: samples lost, others read twice, nothing to say why. So the
first answer for a shard pins its version, and every later answer must carry the same one, else the
read raises :class:`~imgshards.loader.errors.ShardAccessError` ("changed on the server during the
pass"), which ends the epoch: never a mix of two versions. Per file system (its entry's ``version``
in the protocol table, :mod:`imgshards.converter.format.protocols`)::

    HTTP(S)  GET with Range; the version is the answer's ETag (else its Last-Modified) and the
             object's size (the total of Content-Range, or Content-Length for a whole answer)
    S3       GetObject with Range and IfMatch on the ETag of the first answer (412: it changed),
             and the ETag and size of each answer compared as well
    other    fs.cat_file, unchecked (gs://, az://...: their fsspec calls return no version)

A server that answers a ranged GET with the whole object (a plain ``python -m http.server``) makes
:meth:`RemoteObject.fetch` raise :class:`~.ranges.RangesIgnored`; the reader then reads the object
from its start in one streamed GET (:meth:`RemoteObject.open_whole`), its version checked the same
way. Local shards are plain files and never come here.

On HTTP and S3 every request has a deadline besides the file system's idle timeout: with
``deadline`` given, a GET whose answer has not ended after ``deadline(bytes)`` seconds (see
:meth:`~.ranges.RetryPolicy.deadline`) is cancelled and raises :class:`~.ranges.AnswerTooSlow`, so
a server trickling a byte at a time cannot hold a reader past it. It costs one task per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from imgshards.converter.format.protocols import Version as VersionCheck
from imgshards.converter.format.protocols import for_fs

from ..errors import ShardAccessError
from .ranges import AnswerTooSlow, RangesIgnored, WholeStream

__all__ = ["RemoteObject", "remote_object"]

Version = tuple[str | None, int | None]
"""An object's ETag (or Last-Modified) and its size in bytes, as one answer tells them."""

Deadline = Callable[[int], float]
"""``deadline(n)``: the seconds a request for ``n`` bytes may take in all."""

T = TypeVar("T")


async def _within(seconds: float | None, call: Awaitable[T], what: str) -> T:
    """Await ``call``, cancelling it past ``seconds`` (None: no deadline) with :class:`AnswerTooSlow`.

    ``asyncio.wait`` rather than ``wait_for``: a timeout of the file system inside ``call`` stays
    what it is (a stall), and only the deadline says it was one.
    """
    if seconds is None:
        return await call
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise AnswerTooSlow(f"{what} did not end within its deadline of {seconds:.1f} s")
    return task.result()


class RemoteObject:
    """Ranged reads of one object through any fsspec file system, unchecked (see the module docstring).

    Args:
        fs: The file system.
        path: The object's path in ``fs``.
        name: The shard as named in errors (its URL, credentials hidden).
        size: The object's size as the index says.
        deadline: Seconds a request for so many bytes may take in all (HTTP and S3); None, no limit
            but the file system's own timeouts.

    """

    def __init__(self, fs: Any, path: str, name: str, size: int, deadline: Deadline | None = None) -> None:
        self.fs, self.path, self.name, self.size = fs, path, name, size
        self.deadline = deadline
        self._version: Version | None = None
        self._lock = threading.Lock()

    @staticmethod
    def serves(fs: Any) -> bool:
        """Whether this reader can read objects of ``fs``."""
        return True

    def fetch(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the object."""
        return bytes(self.fs.cat_file(self.path, start=start, end=end))

    ranges_only = True
    """Whether the object's servers always honour ``Range`` (else :meth:`open_whole` is the way out)."""

    def open_whole(self) -> WholeStream:
        """The object from its first byte in one streamed answer (where ``ranges_only`` is False).

        A reader of byte ranges only is never asked (the ranged reader gets no ``open_whole`` then).
        """
        raise AssertionError(f"{type(self).__name__} reads byte ranges only: it is never opened whole")

    def check(self, version: Version) -> None:
        """Pin ``version`` at the first answer; raise :class:`ShardAccessError` on a later other one."""
        with self._lock:
            if self._version is None:
                self._version = version
                return
            pinned = self._version
        if version != pinned:
            raise self.changed(f"{_show(pinned)} at the first read, {_show(version)} now")

    def within(self, size: int) -> float | None:
        """The deadline of a request for ``size`` bytes, or None."""
        return None if self.deadline is None else self.deadline(size)

    def changed(self, how: str) -> ShardAccessError:
        """The error for an object that is not the version the pass began to read."""
        return ShardAccessError(
            f"shard {self.name} changed on the server during the pass ({how}): it was re-packed or "
            "re-uploaded while being read; run again once the upload has finished",
            shard=self.name,
        )


class _HttpObject(RemoteObject):
    """An object behind fsspec's HTTP file system, read with aiohttp to see each answer's headers."""

    ranges_only = False

    def fetch(self, start: int, end: int) -> bytes:
        from fsspec.asyn import sync

        what = f"the answer for bytes {start}-{end}"
        return bytes(sync(self.fs.loop, _within, self.within(end - start), self._get(start, end), what))

    async def _get(self, start: int, end: int) -> bytes:
        session = await self.fs.set_session()
        kwargs = dict(self.fs.kwargs)
        headers = {**(kwargs.pop("headers", None) or {}), "Range": f"bytes={start}-{end - 1}"}
        async with session.get(self.fs.encode_url(self.path), headers=headers, **kwargs) as r:
            self.fs._raise_not_found_for_status(r, self.path)
            ranged = r.status == 206
            if not ranged and (start, end) != (0, self.size):
                raise RangesIgnored(f"HTTP {r.status} with the whole object, not the range asked for")
            self.check(_http_version(r.headers, ranged))
            return bytes(await r.read())

    def open_whole(self) -> WholeStream:
        return _HttpStream(self)


class _HttpStream:
    """One GET of a whole HTTP object, read forward (see :class:`~.ranges.WholeStream`)."""

    def __init__(self, obj: _HttpObject) -> None:
        from fsspec.asyn import sync

        self._sync, self._obj, self._loop = sync, obj, obj.fs.loop
        self._r = sync(self._loop, _within, obj.within(0), self._open(), "the answer's headers")

    async def _open(self) -> Any:
        fs = self._obj.fs
        session = await fs.set_session()
        r = await session.get(fs.encode_url(self._obj.path), **fs.kwargs).__aenter__()
        try:
            fs._raise_not_found_for_status(r, self._obj.path)
            self._obj.check(_http_version(r.headers, r.status == 206))
        except BaseException:
            r.close()
            raise
        return r

    def read(self, n: int) -> bytes:
        what = f"a read of {n} bytes"
        return bytes(self._sync(self._loop, _within, self._obj.within(n), self._r.content.read(n), what))

    def close(self) -> None:
        async def close() -> None:
            self._r.close()

        self._sync(self._loop, close)


def _http_version(headers: Any, ranged: bool) -> Version:
    tag = headers.get("ETag") or headers.get("Last-Modified")
    if ranged:
        total = headers.get("Content-Range", "").rpartition("/")[2]
    else:
        total = headers.get("Content-Length", "")
    return tag, int(total) if total.isdigit() else None


class _S3Object(RemoteObject):
    """An object in S3 (s3fs), each GetObject conditional on the ETag its first answer gave."""

    @staticmethod
    def serves(fs: Any) -> bool:
        """Whether ``fs`` is s3fs's, whose calls this reader makes itself."""
        return hasattr(fs, "_call_s3")

    def fetch(self, start: int, end: int) -> bytes:
        from fsspec.asyn import sync

        what = f"the answer for bytes {start}-{end}"
        return bytes(sync(self.fs.loop, _within, self.within(end - start), self._get(start, end), what))

    async def _get(self, start: int, end: int) -> bytes:
        bucket, key, version_id = self.fs.split_path(self.path)
        kwargs: dict[str, Any] = {"Range": f"bytes={start}-{end - 1}"}
        if version_id:
            kwargs["VersionId"] = version_id
        with self._lock:
            if self._version is not None and self._version[0] is not None:
                kwargs["IfMatch"] = self._version[0]
        try:
            resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=key, **kwargs)
        except Exception as e:
            if _precondition_failed(e):
                raise self.changed(f"its ETag is no longer {kwargs['IfMatch']}") from e
            raise
        try:
            data = await resp["Body"].read()
        finally:
            resp["Body"].close()
        total = str(resp.get("ContentRange", "")).rpartition("/")[2]
        self.check((resp.get("ETag"), int(total) if total.isdigit() else None))
        return bytes(data)


def _precondition_failed(error: BaseException) -> bool:
    """Whether ``error`` (or what it was translated from) is S3's 412 PreconditionFailed."""
    seen: BaseException | None = error
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "PreconditionFailed" or status == 412:
                return True
        seen = seen.__cause__ or seen.__context__
    return False


# The reader of each way to pin a version (the protocol table's Version).
_READERS: dict[VersionCheck, type[RemoteObject]] = {
    VersionCheck.ANSWER_HEADERS: _HttpObject,
    VersionCheck.IF_MATCH: _S3Object,
}


def _show(version: Version) -> str:
    tag, size = version
    return f"{tag or 'no ETag'}, {size if size is not None else '?'} bytes"


def remote_object(fs: Any, path: str, name: str, size: int, deadline: Deadline | None = None) -> RemoteObject:
    """The reader of one object for ``fs``: checked (and each request held to ``deadline``) on HTTP and S3.

    Which reader is the :attr:`~imgshards.converter.format.protocols.Protocol.version` of ``fs``'s protocol.
    """
    protocol = for_fs(fs)
    kind = _READERS.get(protocol.version, RemoteObject) if protocol is not None else RemoteObject
    if not kind.serves(fs):
        kind = RemoteObject
    return kind(fs, path, name, size, deadline)
