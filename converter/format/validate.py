"""What an index may say, and how a dataset's files are opened: a dataset is untrusted input.

People read datasets they did not pack (a colleague's bucket, a public mirror), so everything an
``index.json`` says is checked once, before any of it is used, by :func:`parse_index` (size, text,
depth, JSON) and :func:`check_index` (the schema below), and every local file of a dataset is opened
with :func:`open_regular`. What holds afterwards:

- A shard name is a plain file name: no separator, no ``..``, no scheme (``pipe:``, ``s3:``), no
  control character, no leading dot, not URL-escaped; joined onto the dataset root or a cache
  directory it stays there (:func:`check_name`). The rejects file's name is a relative path of a
  few such names, where a folder may be hidden (``.imgshards/rejects/train.jsonl``) but none is
  ``.`` or ``..`` (:func:`check_relative_path`).
- Counts and sizes are integers (not floats, not booleans) within bounds: a shard holds at most
  ``MAX_SHARD_BYTES`` and at most one sample per ``MIN_SAMPLE_BYTES`` of it; a split's totals and
  per-class counts add up to its shards'. Format 2: a split's table files (``tables``) are plain
  names, each of the size its entries need (4 bytes a sample; the sources, the sum of its shards'
  ``sources_bytes``, each bounded), with a sha256; their entries are checked where they are used
  (:mod:`.tablefiles`). Format 1: a shard's table of sample starts, when it has one, holds one
  start per sample, increasing, inside the shard; its table of class ids, one per sample, each
  below the class count; its tables of keys and sources of the right size (:mod:`.tables`).
- A split's image sizes, when it has them, count at most its samples, and each is two pixel counts
  within ``MAX_SIDE``.
- There is at least one class, class names are distinct strings, and the per-class counts of every
  split line up with them.
- The document is at most ``MAX_INDEX_BYTES`` of UTF-8 JSON (a few hundred bytes a shard),
  holding at most ``MAX_INDEX_VALUES`` values and keys (counted in the bytes before any is built),
  nested at most ``MAX_DEPTH`` deep.
- Only regular files are opened as an index or a shard: never a FIFO (whose open would block), a
  device (``/dev/zero`` never ends) or a directory; a symlinked shard must resolve inside the root.

Each failure is a :class:`~.errors.ManifestError` naming the document and the field
(``splits.train.shards[3].name``) and saying what to do.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from .errors import ManifestError, UnsafeFileError, shown
from .tables import (
    ENTRY_BYTES,
    FIXED_TABLES,
    TABLES,
    keys_problem,
    labels_problem,
    max_sources_bytes,
    offsets_problem,
    sources_problem,
)

__all__ = [
    "MAX_DEPTH",
    "MAX_INDEX_BYTES",
    "MAX_INDEX_VALUES",
    "MAX_SHARD_BYTES",
    "MAX_SIDE",
    "MAX_SPLIT_NAME",
    "MIN_SAMPLE_BYTES",
    "SPLIT_CHARS",
    "check_index",
    "check_name",
    "check_relative_path",
    "open_regular",
    "parse_index",
    "split_name_error",
]

# Format 2's index holds a few hundred bytes a shard (its tables are files): ~800 k shards, 200 TB
# of 256 MB shards. (Format 1's held ~20 bytes a sample too: ~12 M samples.)
MAX_INDEX_BYTES = 256 << 20
# Values and keys json.loads may build: each costs up to ~80 bytes of objects ([{"a":"bc"},...] is 3
# of them in 11 bytes), so they are counted in the bytes first and an index at the size bound costs
# under 2 GB, not tens. A shard entry is 9 or 10 of them: this is ~1.7 M shards.
MAX_INDEX_VALUES = 1 << 24
MAX_DEPTH = 32  # the format nests 6 deep; the pack arguments may nest a little more
MAX_SHARD_BYTES = 1 << 40
# The smallest sample a tar can hold: a header and a data block for the image, and for the label.
MIN_SAMPLE_BYTES = 4 * 512
MAX_NAME_BYTES = 255
MAX_SIDE = (1 << 31) - 1  # the widest a PNG may declare; a JPEG's sides stop at 65535
# The split-name rule, here only. ``pack`` and ``index`` write names of SPLIT_CHARS, at most
# MAX_SPLIT_NAME of them (:func:`split_name_error`); the index check reads those and, of the same
# length, the capitals, '-' and '.' another tool may have written. So whatever a writer accepts, every
# reader does.
SPLIT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
MAX_SPLIT_NAME = 100
_SPLIT_NAME = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MAX_SPLIT_NAME - 1}}}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Separators, a scheme's colon, URL escapes, queries and fragments, and control characters.
_BAD_NAME_CHARS = re.compile(r"[/\\:%?#\x00-\x1f\x7f-\x9f]")


def check_name(name: object, field: str, where: str) -> str:
    """Return ``name`` if it is a plain file name (see the module docstring), else raise ManifestError."""
    if not isinstance(name, str) or not name:
        raise _bad(where, field, name, "a non-empty string")
    if (
        name.startswith(".")
        or _BAD_NAME_CHARS.search(name)
        or len(name.encode("utf-8", "replace")) > MAX_NAME_BYTES
    ):
        raise _bad(
            where,
            field,
            name,
            "a plain file name (no '/', '\\\\', ':', '%', control characters or leading dot, "
            f"at most {MAX_NAME_BYTES} bytes): the dataset may be trying to reach files outside its root",
        )
    return name


def check_relative_path(name: object, field: str, where: str, *, max_parts: int = 4) -> str:
    """Return ``name`` if it is a relative path of plain names inside the root, else raise ManifestError.

    Each part follows :func:`check_name`, except that a folder may start with a dot (``.imgshards``)
    as long as it is not ``.`` or ``..``.
    """
    if not isinstance(name, str) or not name:
        raise _bad(where, field, name, "a non-empty string")
    parts = name.split("/")
    if len(parts) > max_parts or any(p in ("", ".", "..") for p in parts):
        raise _bad(
            where,
            field,
            name,
            f"a relative path of at most {max_parts} plain names ('..', '.' and absolute paths are "
            "not allowed): the dataset may be trying to reach files outside its root",
        )
    for i, part in enumerate(parts):
        hidden_folder = i < len(parts) - 1 and part.startswith(".")
        check_name(part[1:] if hidden_folder else part, field, where)
    return name


def split_name_error(name: object, what: str) -> str | None:
    """Why ``name`` cannot name a split ``pack`` or ``index`` writes (``what`` names it), or None.

    A split name is 1 to :data:`MAX_SPLIT_NAME` lower-case letters, digits and '_': a shard's prefix
    (``train-000000.tar``) and a folder of the destination's state, so a name the index check or the
    file system would refuse is refused before anything is written.
    """
    if isinstance(name, str) and name and len(name) <= MAX_SPLIT_NAME and set(name) <= SPLIT_CHARS:
        return None
    return (
        f"{what} {shown(name, quoted=True)} must be lower-case letters, digits and '_', at most "
        f"{MAX_SPLIT_NAME} of them"
    )


def parse_index(data: bytes, where: str) -> Any:
    """Parse the bytes of an index: bounded in size, UTF-8, strict JSON, bounded in depth.

    Strict: ``NaN``, ``Infinity`` and a number too large for a float (``1e999``), which Python's
    ``json`` reads but other parsers (``jq``, a browser's ``JSON.parse``) refuse, are refused here, so
    what ``info --json`` prints from an index is JSON to every reader.
    """
    if len(data) > MAX_INDEX_BYTES:
        raise ManifestError(f"{where} is over {MAX_INDEX_BYTES >> 20} MiB: not an imgshards index")
    # An upper bound on the values and keys (each but the first follows a comma, a colon or an
    # opening bracket; those inside strings only add to it), counted before json.loads builds any.
    values = 1 + sum(data.count(c) for c in (b",", b":", b"[", b"{"))
    if values > MAX_INDEX_VALUES:
        raise ManifestError(
            f"{where} holds over {MAX_INDEX_VALUES:,} JSON values and keys ({values:,} commas, colons and "
            "brackets): not an imgshards index"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(f"{where} is not UTF-8 text (byte {e.start}); re-pack the dataset") from None
    try:
        document = json.loads(text, parse_constant=_not_finite(where), parse_float=_finite(where))
    except json.JSONDecodeError as e:
        raise ManifestError(f"{where} is not valid JSON ({e}); re-pack the dataset") from None
    except RecursionError:
        raise ManifestError(
            f"{where} is nested deeper than JSON can be read: not an imgshards index"
        ) from None
    _check_depth(document, where)
    return document


def _not_finite(where: str) -> Callable[[str], Any]:
    def refuse(name: str) -> Any:
        raise ManifestError(
            f"{where} holds {name}, which is not JSON (a number must be finite); re-pack the dataset"
        )

    return refuse


def _finite(where: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise ManifestError(
                f"{where} holds the number {shown(text)}, too large for a float; re-pack the dataset"
            )
        return value

    return parse


def _check_depth(document: Any, where: str) -> None:
    """Refuse a document nested over ``MAX_DEPTH`` deep, walking it with one iterator a level.

    The walk holds ``MAX_DEPTH`` iterators at most, never a copy of a list's items.
    """
    if not isinstance(document, (dict, list)):
        return
    stack = [_children(document)]  # stack[-1] iterates a container at depth len(stack)
    while stack:
        for node in stack[-1]:
            if isinstance(node, (dict, list)) and node:
                if len(stack) + 1 >= MAX_DEPTH:  # its children would be deeper than MAX_DEPTH
                    raise ManifestError(f"{where} is nested over {MAX_DEPTH} deep: not an imgshards index")
                stack.append(_children(node))
                break
        else:
            stack.pop()


def _children(node: dict[Any, Any] | list[Any]) -> Iterator[Any]:
    return iter(node.values() if isinstance(node, dict) else node)


def check_index(data: Mapping[str, Any], where: str, *, version: int = 2) -> None:
    """Check the classes and splits of a parsed index of format ``version`` (already checked)."""
    classes = _typed(data, "classes", list, where, "a list of class names")
    if not classes:
        raise ManifestError(f"{where}: classes is empty; a packed dataset has at least one class")
    for i, name in enumerate(classes):
        if not isinstance(name, str) or not name or len(name) > 4096:
            raise _bad(where, f"classes[{i}]", name, "a non-empty string")
    if len(set(classes)) != len(classes):
        raise ManifestError(f"{where}: classes holds a name twice; class names are distinct directories")
    splits = _typed(data, "splits", dict, where, "an object of splits")
    names: set[str] = set()
    for split, body in splits.items():
        if not _SPLIT_NAME.fullmatch(split):
            raise _bad(where, f"splits.{split!r}", split, "a split name (letters, digits, '_', '-', '.')")
        _check_split(body, len(classes), f"splits.{split}", where, names, version)


def _check_split(body: Any, num_classes: int, field: str, where: str, names: set[str], version: int) -> None:
    if not isinstance(body, dict):
        raise _bad(where, field, body, "an object")
    shards = _typed(body, "shards", list, where, "a list of shards", field)
    samples = total = sources_bytes = with_sources = 0
    for i, shard in enumerate(shards):
        at = f"{field}.shards[{i}]"
        if not isinstance(shard, dict):
            raise _bad(where, at, shard, "an object")
        _new_name(shard.get("name"), f"{at}.name", where, names)
        size = _count(shard, "bytes", MAX_SHARD_BYTES, where, at)
        count = _count(shard, "samples", size // MIN_SAMPLE_BYTES, where, at)
        samples += count
        total += size
        if version == 1:
            for table in TABLES:  # each optional
                if table in shard and (
                    problem := _table_problem(table, shard[table], count, size, num_classes)
                ):
                    raise _bad(where, f"{at}.{table}", shard[table], problem)
        else:
            for table in TABLES:
                if table in shard:
                    raise _bad(
                        where, f"{at}.{table}", "a table", "none in a shard of format 2 (split.tables)"
                    )
            if "sources_bytes" in shard:
                sources_bytes += _count(shard, "sources_bytes", max_sources_bytes(count), where, at)
                with_sources += 1
        sha = shard.get("sha256")
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            raise _bad(where, f"{at}.sha256", sha, "64 lower-case hex digits")
    for key, value in (("samples", samples), ("bytes", total)):
        if key in body and (_int(body[key]) is None or body[key] != value):
            raise _bad(where, f"{field}.{key}", body[key], f"{value}, the sum over its shards")
    counts = _typed(body, "class_counts", list, where, "a list of per-class counts", field)
    if len(counts) != num_classes:
        raise _bad(
            where, f"{field}.class_counts", f"{len(counts)} counts", f"one count per class ({num_classes})"
        )
    for i, n in enumerate(counts):
        if _int(n) is None or not 0 <= n <= samples:
            raise _bad(where, f"{field}.class_counts[{i}]", n, f"an integer in 0..{samples}")
    if sum(counts) != samples:
        raise _bad(where, f"{field}.class_counts", f"sum {sum(counts)}", f"the split's {samples} samples")
    if version >= 2:
        _check_tables(
            body.get("tables"), samples, (with_sources, len(shards), sources_bytes), field, where, names
        )
    _check_rejects(body.get("rejects"), f"{field}.rejects", where)
    for key in ("formats", "converted"):  # image extensions, conversion reasons -> samples
        _check_counts(body.get(key), f"{field}.{key}", where)
    _check_labels(body.get("labels"), f"{field}.labels", where)
    _check_sizes(body.get("image_sizes"), samples, f"{field}.image_sizes", where)
    if not isinstance(body.get("pack", {}) or {}, dict):
        raise _bad(where, f"{field}.pack", body.get("pack"), "an object")


def _check_tables(
    tables: Any, samples: int, sources: tuple[int, int, int], field: str, where: str, names: set[str]
) -> None:
    """A split's table files (format 2): plain names, each as large as its entries, a sha256 each."""
    tables = {} if tables is None else tables
    if not isinstance(tables, dict) or not set(tables) <= {*FIXED_TABLES, "sources"}:
        raise _bad(
            where, f"{field}.tables", tables, f"an object of tables ({', '.join((*FIXED_TABLES, 'sources'))})"
        )
    with_sources, shards, sources_bytes = sources
    if with_sources != (shards if "sources" in tables else 0):
        raise _bad(
            where,
            f"{field}.tables.sources",
            tables.get("sources"),
            "a sources table where, and only where, every shard has its sources_bytes",
        )
    for table, entry in tables.items():
        at = f"{field}.tables.{table}"
        if not isinstance(entry, dict):
            raise _bad(where, at, entry, "an object (file, bytes, sha256)")
        _new_name(entry.get("file"), f"{at}.file", where, names)
        size = samples * ENTRY_BYTES if table in FIXED_TABLES else sources_bytes
        if _int(entry.get("bytes")) is None or entry["bytes"] != size:
            raise _bad(where, f"{at}.bytes", entry.get("bytes"), f"{size}, what its {samples} samples need")
        sha = entry.get("sha256")
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            raise _bad(where, f"{at}.sha256", sha, "64 lower-case hex digits")


def _table_problem(table: str, text: Any, samples: int, size: int, num_classes: int) -> str | None:
    """What is wrong with a shard's table ``table`` (:mod:`.tables`); None: nothing."""
    if table == "offsets":
        return offsets_problem(text, samples, size)
    if table == "labels":
        return labels_problem(text, samples, num_classes)
    return keys_problem(text, samples) if table == "keys" else sources_problem(text, samples)


def _check_rejects(rejects: Any, field: str, where: str) -> None:
    if rejects is None:
        return
    if not isinstance(rejects, dict):
        raise _bad(where, field, rejects, "an object")
    _count(rejects, "total", 1 << 48, where, field, required=False)
    _check_counts(rejects.get("by_reason"), f"{field}.by_reason", where)
    if rejects.get("file") is not None:
        check_relative_path(rejects["file"], f"{field}.file", where)


def _check_counts(counts: Any, field: str, where: str) -> None:
    """An optional object of names to non-negative integer counts."""
    if counts is None:
        return
    if not isinstance(counts, dict) or any(_int(v) is None or v < 0 for v in counts.values()):
        raise _bad(where, field, counts, "an object of non-negative counts")


def _check_labels(labels: Any, field: str, where: str) -> None:
    """Where an indexed split's labels are: ``.cls`` or a ``.json`` field (absent: ids in ``.cls``)."""
    if labels is None:
        return
    if not isinstance(labels, dict) or labels.get("member") not in ("cls", "json"):
        raise _bad(where, field, labels, 'an object whose "member" is "cls" or "json"')
    key = labels.get("key")
    wanted = isinstance(key, str) and 0 < len(key) <= 4096 if labels["member"] == "json" else key is None
    if not wanted:
        raise _bad(where, f"{field}.key", key, "the .json field holding the label (none for .cls)")
    if not isinstance(labels.get("names", False), bool):
        raise _bad(where, f"{field}.names", labels.get("names"), "true or false")


def _check_sizes(sizes: Any, samples: int, field: str, where: str) -> None:
    """An optional ``{"images": n, "median": [w, h], "p95": [w, h]}`` (see :mod:`.imagesizes`)."""
    if sizes is None:
        return
    if not isinstance(sizes, dict):
        raise _bad(where, field, sizes, "an object")
    _count(sizes, "images", samples, where, field)
    for key in ("median", "p95"):
        size = sizes.get(key)
        if (
            not isinstance(size, list)
            or len(size) != 2
            or any(_int(n) is None or not 1 <= n <= MAX_SIDE for n in size)
        ):
            raise _bad(where, f"{field}.{key}", size, f"[width, height], each an integer in 1..{MAX_SIDE}")


def _new_name(name: object, field: str, where: str, names: set[str]) -> None:
    """A plain file name (:func:`check_name`) no other shard or table of the index has; added to ``names``."""
    name = check_name(name, field, where)
    if name in names:
        raise _bad(where, field, name, "a name no other shard or table of the index has")
    names.add(name)


def _typed(data: Mapping[str, Any], key: str, kind: type, where: str, what: str, field: str = "") -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise _bad(where, f"{field}.{key}" if field else key, value, what)
    return value


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _count(
    data: Mapping[str, Any], key: str, most: int, where: str, field: str, *, required: bool = True
) -> int:
    value = data.get(key, None if required else 0)
    if _int(value) is None or not 0 <= value <= most:
        raise _bad(where, f"{field}.{key}", value, f"an integer in 0..{most}")
    return int(value)


def _bad(where: str, field: str, value: Any, expected: str) -> ManifestError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return ManifestError(f"{where}: {field} is {shown}, expected {expected}; re-pack the dataset")


def open_regular(path: str | os.PathLike[str], *, inside: Path | None = None) -> BinaryIO:
    """Open ``path`` for reading if it is a regular file (and, with ``inside``, resolves inside it).

    The open itself does not block (``O_NONBLOCK``: a FIFO would wait for a writer), and the file
    is checked after it is opened, so nothing can swap it in between.

    Raises:
        UnsafeFileError: a FIFO, device, directory or socket, or a symlink out of ``inside``.
        OSError: the file cannot be opened (``FileNotFoundError``...).

    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFileError(f"{path} is {_kind(mode)}, not a regular file: refused")
        if inside is not None:
            real = Path(_opened_path(fd, path))
            root = Path(os.path.realpath(inside))
            if real != root and root not in real.parents:
                raise UnsafeFileError(f"{path} resolves to {real}, outside the dataset {root}: refused")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb", buffering=1 << 20)
    except BaseException:
        os.close(fd)
        raise


def _opened_path(fd: int, path: str | os.PathLike[str]) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")  # what was opened, not what the name says now
    except OSError:
        return os.path.realpath(path)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"
