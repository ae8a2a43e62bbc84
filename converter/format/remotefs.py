"""The file system of a URL destination: its root, atomic uploads, retried calls, and a first check.

The check, before a pack to a URL: can its bucket be reached and used? A pack's own calls retry for
many seconds (botocore's and s3fs's retries), then fail with the file system's own error; the check
looks the bucket up once, on S3 with a short connect timeout and no retries, and says in one line
which it is: the endpoint cannot be reached, the bucket does not exist, no credentials were found,
or access is denied.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from .errors import DestinationError
from .locate import redact_url, shown_cause
from .protocols import for_names, for_url

__all__ = ["DEFAULT_TIMEOUT", "Remote", "check_bucket", "no_credentials", "one_line", "with_timeouts"]

DEFAULT_TIMEOUT = 20.0
"""Seconds a remote request may wait for the server: to connect, and for each next piece of its answer."""

_UPLOAD_ATTEMPTS = 4
T = TypeVar("T")


def check_bucket(
    url: str, bucket: str, protocols: frozenset[str], storage_options: Mapping[str, Any]
) -> None:
    """Look up ``bucket`` of the object store at ``url`` once, failing fast.

    Raises:
        DestinationError: the endpoint is unreachable, the bucket is missing, no credentials were
            found, or access is denied; the message says which, and what to do.

    """
    from fsspec.core import url_to_fs

    options = dict(storage_options)
    protocol = for_names(sorted(protocols))
    if protocol is not None and protocol.fast_check is not None:
        for key, fast in protocol.fast_check.items():
            options[key] = {**(options.get(key) or {}), **fast}
    endpoint = options.get("endpoint_url")
    at = f" at {endpoint}" if endpoint else ""
    try:
        fs, _ = url_to_fs(url, **options)
        fs.info(bucket)
    except FileNotFoundError:
        raise DestinationError(
            f"bucket {bucket!r} of {redact_url(url)} does not exist{at}: create it first, or fix the URL"
        ) from None
    except PermissionError as e:
        raise DestinationError(
            f"access to bucket {bucket!r} of {redact_url(url)} is denied{at} ({one_line(e)}): check the "
            "credentials and their permissions on the bucket"
        ) from None
    except Exception as e:  # the file system's own errors: botocore, aiohttp, google.auth...
        raise DestinationError(
            no_credentials(url, e)
            or f"cannot reach {redact_url(url)}{at}: {type(e).__name__}: {one_line(e)}; check the network "
            "and the endpoint (storage option endpoint_url; imgshards: -o endpoint_url=URL)"
        ) from None


def no_credentials(url: str, e: BaseException) -> str | None:
    """What to set, when ``e`` is the file system finding no credentials for ``url``; else None.

    botocore's ``NoCredentialsError`` and ``PartialCredentialsError``, google.auth's
    ``DefaultCredentialsError``: told by name, their packages are not imported here.
    """
    if "Credentials" not in type(e).__name__:
        return None
    return (
        f"no credentials for {redact_url(url)}: set them as the cloud SDK reads them (for S3: "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or ~/.aws/credentials), or pass them as storage "
        "options (imgshards: -o key=... -o secret=...)"
    )


def with_timeouts(url: str, storage_options: Mapping[str, Any] | None, timeout: float) -> dict[str, Any]:
    """``storage_options`` plus a connect and a read timeout of ``timeout`` seconds for ``url``'s file system.

    Without them a server that stalls mid-answer hangs a read for minutes (aiohttp's default total
    timeout is 5 minutes; botocore's read timeout 60 s, retried). A timeout the options already set
    wins. How each file system takes them is its :attr:`~.protocols.Protocol.timeouts`: HTTP
    (aiohttp): ``client_kwargs={"timeout": ClientTimeout(sock_connect=..., sock_read=...)}``, no total
    (a slow answer that keeps coming is not a stall); S3 (botocore): ``config_kwargs``'s
    ``connect_timeout`` and ``read_timeout``. Other file systems get no option: the loader bounds its
    own waits on them (:mod:`imgshards.loader.remote.ranges`).
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    options = dict(storage_options or {})
    protocol = for_url(url)
    if protocol is not None and protocol.timeouts is not None:
        protocol.timeouts(options, timeout)
    return options


def one_line(e: BaseException) -> str:
    """An exception's message on one line, cut to a readable length (a cloud error can be a page).

    Credentials in a URL it quotes are hidden (:func:`~.locate.redact_url`).
    """
    return " ".join(redact_url(str(e)).split())[:300]


class Remote:
    """The destination's file system and root, with atomic uploads and retried calls."""

    def __init__(self, url: str, storage_options: Mapping[str, Any]) -> None:
        from fsspec.core import url_to_fs

        self.url = url.rstrip("/")
        self.shown = redact_url(self.url)  # the URL as messages show it
        self.storage_options = dict(storage_options)
        try:
            self.fs, root = url_to_fs(self.url, **storage_options)
        except ImportError as e:  # fsspec names the package the protocol needs
            raise DestinationError(f"cannot use {redact_url(url)}: {one_line(e)}") from shown_cause(e)
        except Exception as e:  # an unknown protocol (a typo), an option the file system refuses
            raise DestinationError(
                f"cannot use {redact_url(url)}: {type(e).__name__}: {one_line(e)}"
            ) from shown_cause(e)
        self.root = root.rstrip("/")
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        self.protocols = frozenset(protocols)
        protocol = for_names(protocols)
        # An object store: a PUT is atomic (a partial object never appears under the final name).
        self.atomic_put = protocol is not None and protocol.object_store

    def check(self) -> None:
        """Fail in one line, within seconds, if the bucket cannot be reached or used: :func:`check_bucket`."""
        if self.atomic_put:  # an object store: its bucket is the URL's first part
            check_bucket(self.url, self.root.split("/", 1)[0], self.protocols, self.storage_options)

    def path(self, name: str) -> str:
        """The path of ``name`` (relative to the root) on the file system."""
        return f"{self.root}/{name}"

    def sizes(self, folder: str = "") -> dict[str, int]:
        """Name -> size of the files directly in ``folder`` (relative to the root); {} if none."""
        path = self.path(folder).rstrip("/")
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return {}
        return {
            str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0)
            for e in entries
            if e.get("type") != "directory"
        }

    def read(self, name: str) -> bytes | None:
        """The bytes of ``name``, or None if there is no such file (other errors retried)."""
        try:
            return bytes(self._retry(f"read {name}", lambda: self.fs.cat_file(self.path(name))))
        except FileNotFoundError:
            return None

    def put_file(self, local: Path, name: str) -> None:
        """Upload ``local`` to ``name`` so that no partial file ever shows under that name."""
        final = self.path(name)
        if self.atomic_put:
            self._retry(f"upload {name}", lambda: self.fs.put_file(str(local), final))
            return
        folder, _, base = name.rpartition("/")
        tmp = self.path(f"{folder}/.{base}.partial" if folder else f".{base}.partial")
        try:
            self._retry(f"upload {name}", lambda: self.fs.put_file(str(local), tmp))
            self._retry(f"rename {name}", lambda: self.fs.mv(tmp, final))
        except BaseException:  # a full disk, Ctrl-C: no temporary file stays (where it can be removed)
            with contextlib.suppress(Exception):
                self.fs.rm_file(tmp)
            raise

    def put_bytes(self, name: str, data: bytes) -> None:
        """Upload ``data`` to ``name``, as :meth:`put_file`."""
        with tempfile.NamedTemporaryFile(prefix="imgshards-upload-") as f:
            f.write(data)
            f.flush()
            self.put_file(Path(f.name), name)

    def remove(self, names: list[str]) -> None:
        """Remove the files ``names`` (relative to the root)."""
        if names:
            self._retry("remove", lambda: self.fs.rm([self.path(n) for n in names]))

    def _retry(self, what: str, call: Callable[[], T]) -> T:
        for attempt in range(1, _UPLOAD_ATTEMPTS + 1):
            try:
                return call()
            except (FileNotFoundError, PermissionError):
                raise
            except Exception as e:  # the file system's own errors (botocore, aiohttp...): retried
                if attempt == _UPLOAD_ATTEMPTS:
                    raise DestinationError(
                        f"cannot {what} at {self.shown} after {attempt} tries: {type(e).__name__}: "
                        f"{one_line(e)}"
                    ) from shown_cause(e)
                time.sleep(0.5 * 2 ** (attempt - 1))
        raise AssertionError("unreachable")
