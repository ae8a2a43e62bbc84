"""Where a dataset is (a local path or a URL), and what to say when it is not there.

A user names a dataset by its directory or URL; a mistyped path, a shard given for its dataset,
shards without an index, an unfinished pack and a URL with a slash missing each get a message naming
the command to run next. Standard library only, as :mod:`.manifest`, which reads the index.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["INDEX_NAME", "is_url", "local_path", "no_index", "not_a_dataset", "url_typo"]

INDEX_NAME = "index.json"


def is_url(root: object) -> bool:
    """Whether ``root`` is a URL read through fsspec (``s3://``, ``gs://``, ``https://``...), not a path.

    ``file://`` URLs count as local paths.
    """
    return isinstance(root, str) and "://" in root and not root.startswith("file://")


# Schemes of fsspec's common file systems, to catch a URL with a slash missing (``s3:/bucket``).
_SCHEMES = frozenset(
    {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "http", "https", "hf", "file", "ftp"}
    | {"sftp", "ssh", "hdfs", "webhdfs", "oci", "oss", "r2", "memory", "github", "dbfs"}
)


def url_typo(root: object) -> str | None:
    """If ``root`` reads as a URL with a slash missing (``s3:/bucket/x``, ``gs:bucket``), the URL meant.

    Such a string is a valid local path (``./s3:/bucket/x``), so without this check ``pack`` would
    write into a local folder named ``s3:``.
    """
    if not isinstance(root, (str, os.PathLike)):
        return None
    text = os.fspath(root)
    if not isinstance(text, str) or "://" in text:
        return None
    scheme, colon, rest = text.partition(":")
    if not colon or scheme.lower() not in _SCHEMES:
        return None
    return f"{scheme}://{rest.lstrip('/')}"


def local_path(root: str | os.PathLike[str]) -> Path:
    """A local path, ``file://`` prefix removed."""
    text = os.fspath(root)
    return Path(text[len("file://") :] if text.startswith("file://") else text)


def not_a_dataset(path: Path) -> str:
    """The message for a file given where a dataset's directory (or its index) was expected."""
    what = "a shard" if path.suffix == ".tar" else "a file"
    return (
        f"{path} is {what}, not a packed dataset: give the dataset's directory, the one that holds "
        f"{INDEX_NAME} (here probably {path.parent})"
    )


def no_index(path: Path) -> str:
    """Why a local dataset has no index, and the command to run next."""
    folder = path.parent
    if path.name != INDEX_NAME or not folder.is_dir():  # an index file named outright, or a race
        return f"{path} does not exist: check the path"
    if (folder / ".imgshards").is_dir():
        return (
            f"no {INDEX_NAME} in {folder}: `imgshards pack` has not finished there; run the same pack "
            "command again, it resumes from the shards already written"
        )
    with contextlib.suppress(OSError):
        shards = sum(1 for p in folder.glob("*.tar") if p.is_file())
        if shards:
            return (
                f"no {INDEX_NAME} in {folder}, which holds {shards} .tar file{'s' if shards != 1 else ''}: "
                f"if another tool wrote these shards, run `imgshards index {folder}` once (per split: "
                "--split NAME --shards 'GLOB') to read them as a dataset"
            )
    return f"no {INDEX_NAME} in {folder}: not a packed dataset; make one with `imgshards pack SRC {folder}`"
