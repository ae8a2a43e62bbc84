"""Command-line pieces for URL destinations: a path-or-URL argument and ``--storage-option``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from imgshards.converter.format.locate import INDEX_NAME, is_url, url_typo
from imgshards.converter.format.remotefs import DEFAULT_TIMEOUT

__all__ = ["PathOrURL", "dataset_dir", "join", "storage_option", "timeout_option"]

F = TypeVar("F", bound=Callable[..., Any])


if TYPE_CHECKING:  # click's ParamType is generic from 8.4: the floor, 8.1, cannot subscript it
    _PathParam = click.ParamType[Path | str]
else:
    _PathParam = click.ParamType


class PathOrURL(_PathParam):
    """A local directory (as ``click.Path``) or an fsspec URL, kept as a string.

    With ``file_okay``, a file passes too, for the command to say what it is (``info`` on a shard
    asks for the dataset's directory); an ``index.json`` stands for its directory.
    """

    name = "path_or_url"

    def __init__(self, *, file_okay: bool = False) -> None:
        self._path = click.Path(path_type=Path, file_okay=file_okay)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path | str:
        """Return a URL as it is (``click.Path`` would fold its ``//``), a path as a ``Path``."""
        if isinstance(value, str) and is_url(value):
            return value.rstrip("/")
        meant = url_typo(value)
        if meant is not None:
            self.fail(f"{value!r} is a URL with a slash missing; write {meant}", param, ctx)
        path = self._path.convert(value, param, ctx)
        return dataset_dir(path) if isinstance(path, Path) else path


def dataset_dir(path: Path) -> Path:
    """``shards/index.json`` -> ``shards``: the dataset's directory, which commands read shards beside."""
    return path.parent if path.name == INDEX_NAME and path.is_file() else path


def join(root: Path | str, name: str) -> Path | str:
    """``root / name`` for a path or a URL."""
    return f"{root}/{name}" if isinstance(root, str) else root / name


def storage_option(command: F) -> F:
    """Add ``-o/--storage-option KEY=VALUE`` (repeatable), parsed into ``storage_options``."""
    return click.option(
        "-o",
        "--storage-option",
        "storage_options",
        multiple=True,
        metavar="KEY=VALUE",
        callback=_parse,
        help="Option of the URL's fsspec file system, e.g. endpoint_url=http://127.0.0.1:9000 "
        "(repeatable; VALUE is JSON if it parses, else a string; a.b=VALUE nests). Credentials come "
        "from fsspec's and the cloud SDK's usual configuration.",
    )(command)


def timeout_option(command: F) -> F:
    """Add ``--timeout SECONDS``: how long a request to a URL may wait for the server."""
    return click.option(
        "--timeout",
        type=click.FloatRange(min=0, min_open=True),
        default=DEFAULT_TIMEOUT,
        show_default=True,
        metavar="SECONDS",
        help="For a URL: seconds a request may wait for the server (to connect, or for more of its "
        "answer) before the command gives up.",
    )(command)


def _parse(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", ctx, param)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        *parents, leaf = key.split(".")
        node = options
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise click.BadParameter(f"{key!r} nests under a key that has a value", ctx, param)
        node[leaf] = value
    return options
