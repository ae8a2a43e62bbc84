"""The index file that describes a packed dataset: ``index.json`` at the root of the output directory.

The index is the heart of the packed format (:mod:`imgshards.converter.format`), the one contract
between the converter and the loader: the loader imports nothing else of the converter, and this
package imports nothing but itself.

Layout of ``index.json`` (``version`` 2)::

    {
      "format": "imgshards",
      "version": 2,
      "classes": ["cat", "dog"],                  # class id = position, exactly ImageFolder's
      "splits": {
        "train": {
          "samples": 1281167, "bytes": 140e9,
          "class_counts": [1300, 1300],           # aligned with "classes"
          "shards": [{"name": "train-000000.tar", "samples": 2501, "bytes": 268e6, "sha256": "...",
                      "sources_bytes": 15310}],   # its stream in the sources table
          "tables": {                              # one file a table (converter/format/tablefiles.py)
            "starts": {"file": "train=starts.0f3c...u32", "bytes": 5124668, "sha256": "..."},
            "labels": {...}, "keys": {...}, "sources": {"file": "train=sources.9a1e...zlib", ...}},
          "rejects": {"total": 3, "by_reason": {"truncated": 2, "empty": 1},
                      "file": ".imgshards/rejects/train.jsonl"},
          "pack": {...},                           # the arguments the split was packed with
          "formats": {"jpg": 1281167},             # image members per extension
          "converted": {"png_to_jpg": 12},         # images re-encoded into the split's format, by reason
          "image_sizes": {"images": 1281167, "median": [500, 375], "p95": [500, 500]},  # as stored
          "labels": {"member": "json", "key": "label", "names": true}  # only where not ids in .cls
        }
      }
    }

So the index grows with the shards (a few hundred bytes each), not with the samples: every
process parses it whole, and maps the tables it uses. Version 1 (written before 0.2) held each
shard's tables inside its entry, as base64 (``"offsets"``, ``"labels"``, ``"keys"``, ``"sources"``:
:mod:`.tables`); it is still read (:class:`ShardInfo` keeps them, :class:`~.tablefiles.SplitTables`
reads both), and ``imgshards index --upgrade`` rewrites it as version 2 without touching a shard.

Each sample in a shard is standard WebDataset: ``<key>.<ext>`` (the image, ``ext`` one of
:data:`IMAGE_EXTENSIONS`), ``<key>.cls`` (the integer label as ASCII) and ``<key>.json``
(``{"class": ..., "path": ...}``, the original path relative to the source tree). Shards that
another tool wrote and ``imgshards index`` indexed may hold the label in a ``.json`` field instead,
as a class id or a class name (:class:`LabelSource`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import ManifestError
from .imageformats import IMAGE_EXTENSIONS  # re-exported: the image members of a sample
from .imagesizes import SizeStats
from .labels import label_value
from .locate import (
    INDEX_NAME,
    is_url,
    local_path,
    missing_path,
    no_index,
    not_a_dataset,
    redact_url,
    shown_cause,
)
from .remotefs import no_credentials, one_line
from .tables import FIXED_TABLES, TABLES, TableFile
from .validate import (
    MAX_INDEX_BYTES,
    check_index,
    check_name,
    open_regular,
    parse_index,
)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "IMAGE_EXTENSIONS",
    "INDEX_NAME",
    "READ_VERSIONS",
    "TIMM_INFO_NAME",
    "LabelSource",
    "Manifest",
    "ShardInfo",
    "SplitInfo",
    "TableFile",
    "check_name",
    "is_url",
    "local_path",
    "open_regular",
    "read_manifest",
    "split_member_name",
]

FORMAT_NAME = "imgshards"
FORMAT_VERSION = 2  # what this version writes
READ_VERSIONS = (1, 2)  # what it reads
TIMM_INFO_NAME = "_info.json"


@dataclass(frozen=True)
class ShardInfo:
    """One tar shard of a split: its name, sample count, size and sha256.

    ``sources_bytes`` (format 2): the size of its stream in the split's sources table. The four
    tables of format 1 (:mod:`.tables`), as that index held them; ``None`` where it has none, and
    ``""`` for a shard of no samples. A shard of format 2 has none of them: its split's
    :attr:`SplitInfo.tables` holds every sample's entries.
    """

    name: str
    samples: int
    bytes: int
    sha256: str
    offsets: str | None = None  # format 1: where each sample starts
    labels: str | None = None  # format 1: each sample's class id
    keys: str | None = None  # format 1: each sample key's CRC-32
    sources: str | None = None  # format 1: each sample's source path
    sources_bytes: int | None = None  # format 2: its stream in the sources table

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form written into the index (format 2: no inline tables)."""
        if any(getattr(self, table) is not None for table in TABLES):
            raise ValueError(f"shard {self.name} holds format-1 tables: write them as files first")
        data: dict[str, Any] = {"name": self.name, "samples": self.samples, "bytes": self.bytes}
        data["sha256"] = self.sha256
        if self.sources_bytes is not None:
            data["sources_bytes"] = self.sources_bytes
        return data

    def table(self, name: str) -> str | None:
        """Format-1 table ``name`` (:data:`~.tables.TABLES`); ``""`` for a shard of no samples."""
        return "" if self.samples == 0 else getattr(self, name)

    def without_tables(self) -> ShardInfo:
        """The shard's entry without format-1 tables."""
        return replace(self, offsets=None, labels=None, keys=None, sources=None)


def split_member_name(name: str) -> tuple[str, str] | None:
    """A tar member's sample key and extension as webdataset groups them, or None for no extension.

    The key is the name up to the first dot of its last path part (``a.v2/x.jpg`` -> ``a.v2/x``,
    ``jpg``); the extension is lower-cased.
    """
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    return None if dot < 0 else (name[:dot], name[dot + 1 :].lower())


@dataclass(frozen=True)
class LabelSource:
    """Where a sample's label is: its ``.cls`` member (what ``pack`` writes) or a field of its ``.json``.

    With ``names`` the value is a class name, looked up in the index's ``classes``; else a class id.
    Written into a split of the index only when it is not the default (``.cls`` holding ids).
    """

    member: str = "cls"
    key: str | None = None
    names: bool = False

    def __post_init__(self) -> None:
        if self.member not in ("cls", "json") or (self.member == "json") != bool(self.key):
            raise ValueError(
                f"labels from member {self.member!r} field {self.key!r}: expected .cls, or .json with a field"
            )

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form written into the index."""
        return {"member": self.member, "key": self.key, "names": self.names}

    @classmethod
    def from_json(cls, data: Any) -> LabelSource:
        """Build from the ``labels`` entry of a split (absent: the default)."""
        if data is None:
            return cls()
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("key"), (str, type(None)))
            or not isinstance(data.get("names", False), bool)
        ):
            raise ValueError(f"labels is {data!r}")
        return cls(str(data.get("member")), data.get("key"), data.get("names", False))

    def parse(self, data: bytes | bytearray, class_to_idx: Mapping[str, int]) -> int:
        """Return the class id held in a sample's label member (its bytes), read by :func:`label_value`.

        Raises:
            ValueError: the member holds no usable label; the message says what it has
                ("a .cls that is not a label: ...").

        """
        raw = data if type(data) is bytes else bytes(data)
        return self.class_id(label_value(raw, self.member, self.key), class_to_idx, raw)

    def class_id(self, value: int | str, class_to_idx: Mapping[str, int], raw: bytes = b"") -> int:
        """The class id of a label value (:func:`label_value`'s) under this split's labels.

        Raises:
            ValueError: a name where ids are expected, an id where names are, an unknown name.

        """
        if self.names:
            if isinstance(value, str) and value in class_to_idx:
                return class_to_idx[value]
            raise ValueError(f"label {str(value)[:80]!r}, not one of the index's classes")
        if isinstance(value, int):
            return value
        if self.member == "cls":
            raise ValueError(f"a .cls that is not a label: {raw[:24]!r}")
        raise ValueError(f"a .json field {self.key!r} of {value[:80]!r}, not a class id")


@dataclass(frozen=True)
class SplitInfo:
    """One split (``train``, ``val``...) of a packed dataset."""

    name: str
    shards: tuple[ShardInfo, ...]
    class_counts: tuple[int, ...]
    rejects_total: int = 0
    rejects_by_reason: Mapping[str, int] = field(default_factory=dict)
    rejects_file: str | None = None
    pack_args: Mapping[str, Any] = field(default_factory=dict)
    formats: Mapping[str, int] = field(default_factory=dict)
    converted: Mapping[str, int] = field(default_factory=dict)
    labels: LabelSource = LabelSource()
    image_sizes: SizeStats | None = None  # as stored (.imagesizes); None: not read, or an older index
    tables: Mapping[str, TableFile] = field(default_factory=dict)  # format 2's table files, by table

    @property
    def samples(self) -> int:
        """Number of samples in the split."""
        return sum(s.samples for s in self.shards)

    @property
    def bytes(self) -> int:
        """Total size of the split's shards in bytes."""
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form written into the index."""
        labels = {} if self.labels == LabelSource() else {"labels": self.labels.to_json()}
        sizes = {} if self.image_sizes is None else {"image_sizes": self.image_sizes.to_json()}
        return {
            "samples": self.samples,
            "bytes": self.bytes,
            "class_counts": list(self.class_counts),
            "shards": [s.to_json() for s in self.shards],
            **(
                {
                    "tables": {
                        name: self.tables[name].to_json() for name in _TABLE_ORDER if name in self.tables
                    }
                }
                if self.tables
                else {}
            ),
            "rejects": {
                "total": self.rejects_total,
                "by_reason": dict(sorted(self.rejects_by_reason.items())),
                "file": self.rejects_file,
            },
            "pack": dict(self.pack_args),
            "formats": dict(sorted(self.formats.items())),
            "converted": dict(sorted(self.converted.items())),
            **sizes,
            **labels,
        }

    @property
    def table_names(self) -> list[str]:
        """The file names of its tables (format 2), in the index's order."""
        return [self.tables[name].name for name in _TABLE_ORDER if name in self.tables]


_TABLE_ORDER = (*FIXED_TABLES, "sources")


@dataclass(frozen=True)
class Manifest:
    """A packed dataset: its classes (ids as ImageFolder assigns them) and its splits.

    ``version``: the format of the index it was read from (what is written is always
    :data:`FORMAT_VERSION`; a split read from version 1 must have its tables written as files first).
    """

    classes: tuple[str, ...]
    splits: Mapping[str, SplitInfo]
    version: int = FORMAT_VERSION

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to id, the same mapping as ``torchvision.datasets.ImageFolder.class_to_idx``."""
        return {name: i for i, name in enumerate(self.classes)}

    def split(self, name: str) -> SplitInfo:
        """Return split ``name``, or raise :class:`ManifestError` listing the splits there are."""
        try:
            return self.splits[name]
        except KeyError:
            raise ManifestError(
                f"no split {name!r} in this dataset; it has {sorted(self.splits) or 'no splits'}"
            ) from None

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form of the whole index."""
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "classes": list(self.classes),
            "splits": {name: self.splits[name].to_json() for name in sorted(self.splits)},
        }

    def dumps(self) -> str:
        """Serialize to the exact text written to ``index.json`` (deterministic)."""
        return json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n"

    def check_readable(self, where: str) -> None:
        """Raise :class:`ManifestError` unless a reader would accept this index as written.

        A writer's last check (``pack``, ``imgshards index``): the text :meth:`dumps` gives goes
        through what :func:`read_manifest` runs on the file, its bounds included, so an index too
        large to read is never committed after hours of packing.
        """
        data = self.dumps().encode()
        if len(data) > MAX_INDEX_BYTES:
            shards = sum(len(split.shards) for split in self.splits.values())
            raise ManifestError(
                f"{where} would be {len(data) / 2**20:,.0f} MiB for {shards:,} "
                f"shard{'s' if shards != 1 else ''}, over the {MAX_INDEX_BYTES >> 20} MiB a reader "
                "accepts; pack with larger shards (--shard-size)"
            )
        Manifest.from_json(parse_index(data, where), where=where)

    def timm_info(self) -> dict[str, Any]:
        """Return the ``_info.json`` that timm's webdataset reader (``ReaderWds``) reads."""
        return {
            "name": FORMAT_NAME,
            "num_classes": len(self.classes),
            "splits": {
                name: {
                    "name": name,
                    "num_samples": split.samples,
                    "filenames": [s.name for s in split.shards],
                    "shard_lengths": [s.samples for s in split.shards],
                }
                for name, split in sorted(self.splits.items())
            },
        }

    @classmethod
    def from_json(cls, data: Any, *, where: str = INDEX_NAME) -> Manifest:
        """Build from the parsed JSON of an index; ``where`` names it in error messages."""
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise ManifestError(f'{where} is not an imgshards index (no "format": "{FORMAT_NAME}")')
        version = data.get("version")
        if version not in READ_VERSIONS:
            newer = isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION
            raise ManifestError(
                f"{where} has format version {version!r}; this imgshards reads versions "
                f"{', '.join(map(str, READ_VERSIONS))}: "
                + ("upgrade imgshards (pip install -U imgshards)" if newer else "re-pack the dataset")
            )
        check_index(data, where, version=version)  # untrusted: every name, count and size, before use
        classes = tuple(data["classes"])
        splits = {name: _split_from_json(name, s, version) for name, s in data["splits"].items()}
        return cls(classes=classes, splits=splits, version=version)


def _split_from_json(name: str, data: Mapping[str, Any], version: int) -> SplitInfo:
    rejects = data.get("rejects") or {}
    tables = data.get("tables") or {} if version >= 2 else {}
    return SplitInfo(
        name=name,
        shards=tuple(
            ShardInfo(
                name=str(s["name"]),
                samples=int(s["samples"]),
                bytes=int(s["bytes"]),
                sha256=str(s["sha256"]),
                **(  # checked: a string each, where present (format 1); a count (format 2)
                    {table: s.get(table) for table in TABLES}
                    if version == 1
                    else {"sources_bytes": s.get("sources_bytes")}
                ),
            )
            for s in data["shards"]
        ),
        tables={t: TableFile(str(v["file"]), int(v["bytes"]), str(v["sha256"])) for t, v in tables.items()},
        class_counts=tuple(int(c) for c in data["class_counts"]),
        rejects_total=int(rejects.get("total", 0)),
        rejects_by_reason={str(k): int(v) for k, v in (rejects.get("by_reason") or {}).items()},
        rejects_file=rejects.get("file"),
        pack_args=dict(data.get("pack") or {}),
        formats={str(k): int(v) for k, v in (data.get("formats") or {}).items()},
        converted={str(k): int(v) for k, v in (data.get("converted") or {}).items()},
        labels=LabelSource.from_json(data.get("labels")),
        image_sizes=SizeStats.from_json(data.get("image_sizes")),
    )


def read_manifest(
    root: str | os.PathLike[str], *, storage_options: Mapping[str, Any] | None = None
) -> Manifest:
    """Read ``index.json`` from a packed dataset directory or URL (or the index file itself).

    A URL (``s3://bucket/prefix``, ``https://host/path``...) is read through fsspec, with
    ``storage_options`` for its file system (fsspec is imported only then).

    Raises:
        ManifestError: the index is missing, unreadable, malformed, or of another format version.

    """
    if is_url(root):
        return _read_manifest_url(str(root), storage_options or {})
    path = local_path(root)
    if not os.path.lexists(path):
        raise ManifestError(
            f"{path} does not exist: {missing_path(path)} (a dataset is the directory `imgshards pack` wrote)"
        )
    if path.is_dir():
        path = path / INDEX_NAME
    elif path.is_file() and path.suffix != ".json":
        raise ManifestError(not_a_dataset(path))
    try:
        with open_regular(path) as f:  # not a FIFO (would block) or a device (would not end)
            raw = f.read(MAX_INDEX_BYTES + 1)
    except FileNotFoundError:
        raise ManifestError(no_index(path)) from None
    except OSError as e:
        raise ManifestError(f"cannot read {path}: {e.strerror or e}") from e
    return Manifest.from_json(parse_index(raw, str(path)), where=str(path))


def _read_manifest_url(url: str, storage_options: Mapping[str, Any]) -> Manifest:
    from fsspec.core import url_to_fs  # only for URLs: the converter needs no fsspec otherwise

    if url.rstrip("/").endswith(".tar"):
        shard = redact_url(url.rstrip("/"))
        raise ManifestError(
            f"{shard} is a shard, not a packed dataset: give the dataset's URL, the one that holds "
            f"{INDEX_NAME} (here probably {shard.rsplit('/', 1)[0]})"
        )
    index_url = url if url.endswith(".json") else f"{url.rstrip('/')}/{INDEX_NAME}"
    shown = redact_url(index_url)
    try:
        fs, path = url_to_fs(index_url, **storage_options)
        raw = fs.cat_file(path, start=0, end=MAX_INDEX_BYTES + 1)
    except FileNotFoundError:
        base = shown.rsplit("/", 1)[0]
        raise ManifestError(
            f"no {INDEX_NAME} at {shown}: not a packed dataset, or `imgshards pack` has not "
            f"finished there (run it again: it resumes); for shards another tool wrote, run "
            f"`imgshards index {base}`"
        ) from None
    except ImportError as e:  # fsspec names the package its protocol needs
        raise ManifestError(f"cannot read {shown}: {e}") from e
    except Exception as e:  # the file system's own errors (aiohttp, botocore...), not importable here
        raise ManifestError(
            no_credentials(redact_url(url), e) or f"cannot read {shown}: {type(e).__name__}: {one_line(e)}"
        ) from shown_cause(e)
    return Manifest.from_json(parse_index(raw, shown), where=shown)
