"""The storage protocols imgshards knows: one table, read by the converter and the loader alike.

A dataset or a destination named by a URL is opened through fsspec (``url_to_fs``), whatever its
scheme; what differs between file systems is written here, one :class:`Protocol` per file system:

- ``schemes``: the URL schemes (and fsspec protocol names) it answers to;
- ``extra``: the imgshards extra that installs its fsspec file system (``pip install -e ".[s3]"``);
- ``object_store``: a PUT is atomic (no partial object under the final name) and the URL's first
  part is a bucket (:class:`~.remotefs.Remote`);
- ``timeouts``: how a connect and a read timeout are set in its storage options
  (:func:`~.remotefs.with_timeouts`); ``fast_check``: the options that make the bucket check before
  a pack fail in seconds (:func:`~.remotefs.check_bucket`);
- ``version``: how the loader tells one version of an object from another while it reads it
  (:class:`Version`; :mod:`imgshards.loader.remote.objects`);
- ``denied_hint``: what to do when the server denies access to a shard
  (:func:`imgshards.loader.remote.ranges.access_error`).

Adding a backend is one entry here (and its tests). Nothing outside this module names a scheme:
``tests/test_layout.py`` checks that. Standard library only (aiohttp is imported when an HTTP
timeout is set): :mod:`.locate` reads the scheme names.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DENIED_HINT",
    "FILE_PREFIX",
    "NO_CREDENTIALS_ERRORS",
    "PROTOCOLS",
    "SCHEMES",
    "Protocol",
    "Version",
    "for_fs",
    "for_names",
    "for_url",
    "scheme",
]


class Version(enum.Enum):
    """How the loader pins the version of an object it reads in ranges (never a mix of two)."""

    NONE = "none"
    """``fs.cat_file``, unchecked: the file system's calls return no version."""
    ANSWER_HEADERS = "answer headers"
    """Each answer's ETag (else its Last-Modified) and the object's size (Content-Range's total, or
    Content-Length) must be those of the first answer; a server that ignores Range is read whole."""
    IF_MATCH = "if-match"
    """Each ranged GET is conditional on the ETag of the first answer (412: it changed); the ETag and
    size of each answer are compared as well."""


DENIED_HINT = "check that the credentials given (storage_options, the environment) may read it"
"""What to do when access to a shard is denied, where the protocol says nothing more particular."""


@dataclass(frozen=True, kw_only=True)
class Protocol:
    """One file system: its schemes and how imgshards treats it (see the module docstring)."""

    name: str
    """What the docs call it."""
    schemes: tuple[str, ...]
    extra: str | None = None
    object_store: bool = False
    timeouts: Callable[[dict[str, Any], float], None] | None = None
    """Sets a connect and a read timeout of so many seconds in the options, unless they set one."""
    fast_check: Mapping[str, Mapping[str, Any]] | None = None
    """Options merged into the storage options (each a dict of its own) for the bucket check."""
    version: Version = Version.NONE
    denied_hint: str = DENIED_HINT


def _http_timeouts(options: dict[str, Any], timeout: float) -> None:
    # aiohttp: a connect and a read timeout, no total (a slow answer that keeps coming is not a stall).
    try:
        import aiohttp  # fsspec's HTTP file system needs it anyway
    except ImportError:
        return  # fsspec says which package to install when the file system is made
    client = dict(options.get("client_kwargs") or {})
    client.setdefault("timeout", aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout))
    options["client_kwargs"] = client


def _s3_timeouts(options: dict[str, Any], timeout: float) -> None:
    # botocore: config_kwargs's connect_timeout and read_timeout.
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("connect_timeout", timeout)
    config.setdefault("read_timeout", timeout)
    options["config_kwargs"] = config


# botocore's configuration for the bucket check: a dead endpoint fails in seconds, not after retries.
_FAST_S3 = {"connect_timeout": 3, "read_timeout": 15, "retries": {"max_attempts": 1, "mode": "standard"}}

PROTOCOLS: tuple[Protocol, ...] = (
    Protocol(
        name="S3",
        schemes=("s3", "s3a"),
        extra="s3",
        object_store=True,
        timeouts=_s3_timeouts,
        fast_check={"config_kwargs": _FAST_S3},
        version=Version.IF_MATCH,
        denied_hint=(
            "check that the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID, storage_options) may read it"
        ),
    ),
    Protocol(name="Google Cloud Storage", schemes=("gs", "gcs", "gcsfs"), extra="gcs", object_store=True),
    Protocol(name="Azure", schemes=("az", "abfs", "abfss", "adl"), object_store=True),
    Protocol(
        name="HTTP(S)",
        schemes=("http", "https"),
        extra="http",
        timeouts=_http_timeouts,
        version=Version.ANSWER_HEADERS,
        denied_hint=(
            "pass what the server asks for in storage_options (headers=, or client_kwargs={'auth': ...})"
        ),
    ),
    Protocol(name="local files", schemes=("file",)),
    # Known, so that a URL with a slash missing (``hf:/org/x``) is caught; treated as fsspec treats them.
    Protocol(name="Hugging Face", schemes=("hf",)),
    Protocol(name="FTP", schemes=("ftp",)),
    Protocol(name="SFTP", schemes=("sftp", "ssh")),
    Protocol(name="HDFS", schemes=("hdfs", "webhdfs")),
    Protocol(name="Oracle Cloud", schemes=("oci",)),
    Protocol(name="Alibaba OSS", schemes=("oss",)),
    Protocol(name="Cloudflare R2", schemes=("r2",)),
    Protocol(name="memory", schemes=("memory",)),
    Protocol(name="GitHub", schemes=("github",)),
    Protocol(name="Databricks", schemes=("dbfs",)),
)

_BY_SCHEME = {s: p for p in PROTOCOLS for s in p.schemes}
SCHEMES = frozenset(_BY_SCHEME)
"""Every scheme of the table."""

FILE_PREFIX = "file://"
"""A ``file://`` URL names a local path."""

NO_CREDENTIALS_ERRORS = frozenset(
    {
        "NoCredentialsError",  # botocore
        "PartialCredentialsError",
        "CredentialRetrievalError",
        "DefaultCredentialsError",  # google.auth
    }
)
"""Names of the exception classes (their packages are optional) that say the client has no credentials."""


def scheme(url: str) -> str:
    """The scheme of ``url``, lower case (``S3://b`` -> ``s3``); "" for a path."""
    return url.partition("://")[0].lower() if "://" in url else ""


def for_url(url: str) -> Protocol | None:
    """The protocol of ``url``'s scheme, or None (a path, or a scheme the table does not know)."""
    return _BY_SCHEME.get(scheme(url))


def for_fs(fs: Any) -> Protocol | None:
    """The protocol of the fsspec file system ``fs`` (its first protocol name the table knows), or None."""
    return for_names(fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def for_names(names: Iterable[str]) -> Protocol | None:
    """The protocol of the first of the fsspec protocol ``names`` the table knows, or None."""
    return next((_BY_SCHEME[n] for n in names if n in _BY_SCHEME), None)
