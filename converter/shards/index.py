"""``index``: write ``index.json`` for WebDataset shards made by another tool, so imgshards reads them.

Shards written by ``webdataset.ShardWriter``, ``tarp``, img2dataset or ``tar`` have no index: this
reads each shard once (locally in worker processes, from a URL in threads), never writes to it, and
records what the loader, ``verify``, ``info`` and ``bench`` need::

    list SRC/GLOB -> per shard: SHA-256, size, samples (members grouped as webdataset groups them),
    label values -> under the index lock, the index as it is now -> labels: ids or names, classes
    given / kept from the index / derived -> mixing check -> the split's tables as files (index
    format 2), _info.json, then index.json (the shards are untouched)

A sample is one image member (an extension of :data:`~.format.manifest.IMAGE_EXTENSIONS`) plus its label:
the ``.cls`` member, or a field of the ``.json`` member. A label is a class id when every value is an
integer, else a class name. Class names come from ``classes`` (id = position), else from the splits
already in the index, else are derived: ids ``0..max`` named ``"0"...``, names sorted as ImageFolder
sorts its folders. Any sample without exactly one image and a label stops the run with the list of
such samples: the loader reads samples by position, so none can be left out silently.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..format.errors import DestinationError, SourceError, UnreadableSamplesError
from ..format.locate import redact_url
from ..format.manifest import INDEX_NAME, LabelSource, Manifest, SplitInfo
from ..format.tables import encode_table
from ..format.validate import split_name_error
from .read import ShardScan, ShardStore, Value

__all__ = ["MADE_BY", "IndexConfig", "IndexResult", "index", "read_classes"]

MADE_BY = "imgshards index"
_MAX_DERIVED_CLASSES = 1_000_000
_ALL_CLASSES = f"remove {INDEX_NAME} and index every split with --classes FILE naming every class"


@dataclass(frozen=True, kw_only=True)
class IndexConfig:
    """What to index and how to read labels.

    Attributes:
        split: Name of the split the shards become: lower-case letters, digits and underscores, at
            most 100 (:func:`~.format.validate.split_name_error`).
        shards: Glob of the shards' file names directly under the source (``train-*.tar``).
        label_field: Read labels from this field of each sample's ``.json``; None: from ``.cls``.
        classes: Class names, a label id being a position in it; None: kept or derived (see module).
        overwrite: Replace a split of the same name that ``imgshards pack`` made.
        workers: Processes (local) or threads (URL) reading shards; None for one per core.
        progress: Show a progress bar on stderr.

    """

    split: str = "train"
    shards: str = "*.tar"
    label_field: str | None = None
    classes: tuple[str, ...] | None = None
    overwrite: bool = False
    workers: int | None = None
    progress: bool = False

    def __post_init__(self) -> None:
        if (problem := split_name_error(self.split, "split")) is not None:
            raise ValueError(problem)
        if not self.shards or "/" in self.shards or self.shards.startswith("."):
            raise ValueError(
                f"shards is a glob of file names in the source, like '*.tar'; got {self.shards!r}"
            )
        if self.label_field is not None and not self.label_field:
            raise ValueError("label_field names a field of the .json member; got ''")
        if self.classes is not None:
            dupes = sorted(n for n, k in Counter(self.classes).items() if k > 1)
            if not self.classes or dupes or not all(self.classes):
                raise ValueError(f"classes must be distinct non-empty names; repeated: {dupes[:5]}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")


@dataclass(frozen=True)
class IndexResult:
    """What ``index`` wrote, and what it found about how the shards mix classes."""

    root: Path | str
    manifest: Manifest
    split: str
    classes_from: str  # "given", "index" (the splits already there) or "derived"
    classes_per_shard: float
    shuffled_classes_per_shard: float
    warnings: tuple[str, ...]

    @property
    def info(self) -> SplitInfo:
        """The indexed split, as recorded in the index."""
        return self.manifest.split(self.split)


def read_classes(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """Class names from a file: a JSON list, or one name a line (blank lines ignored); id = position.

    Raises:
        SourceError: the file cannot be read or holds no names.

    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"cannot read the class names in {path}: {e}") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
    if isinstance(data, list):
        names = tuple(str(n) for n in data)
    else:
        names = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not names:
        raise SourceError(f"{path} holds no class names; write one a line, the line number being its id")
    return names


def index(
    src: str | os.PathLike[str],
    config: IndexConfig | None = None,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> IndexResult:
    """Write ``index.json`` and ``_info.json`` for the WebDataset shards in ``src`` (a directory or URL).

    The shards are only read. Other splits already in the index are kept (those of a format-1
    index written as format 2); the classes of all splits are one list. Locally the index is
    re-read and merged under the lock every writer of it takes (:func:`~..write.destination.update_index`),
    so a split that another ``index`` or ``pack`` wrote while the shards were read is kept.

    Raises:
        SourceError: no shards match, or a shard cannot be opened.
        UnreadableSamplesError: a sample has no image or no label, or a shard is not a whole tar.
        DestinationError: ``src`` is a URL that cannot be used (no credentials, no bucket: the
            check ``pack`` makes), or holds an index of another tool, a split ``pack`` made (without
            ``overwrite``), a split sharing shards with this one, or splits with other classes;
            or the index cannot be written.

    """
    config = config or IndexConfig()
    store = ShardStore(src, storage_options or {})
    existing = store.existing_index()
    names = store.list_shards(config.shards)
    shown = redact_url(str(src))  # in messages
    _check_existing(existing, config, names, shown)
    scans = store.scan(names, config.label_field, workers=config.workers, progress=config.progress)
    _raise_problems(scans, shown)
    made: list[_Indexed] = []

    def merged(current: Manifest | None) -> Manifest:
        # The index as it is now, under the lock: another split may have landed since the start.
        _check_existing(current, config, names, shown)
        made.append(_indexed(scans, config, current, shown))
        others = {k: v for k, v in (current.splits if current else {}).items() if k != config.split}
        return Manifest(classes=made[-1].classes, splits={**others, config.split: made[-1].split})

    manifest = store.update(merged)
    indexed = made[-1]
    return IndexResult(
        root=store.root,
        manifest=manifest,
        split=config.split,
        classes_from=indexed.classes_from,
        classes_per_shard=indexed.observed,
        shuffled_classes_per_shard=indexed.shuffled,
        warnings=indexed.warnings,
    )


@dataclass(frozen=True)
class _Indexed:
    """The split ``index`` makes of its shards under one index: its entry, classes and mixing."""

    split: SplitInfo  # its tables inline (format 1's form), written as files by the store
    classes: tuple[str, ...]
    classes_from: str
    observed: float
    shuffled: float
    warnings: tuple[str, ...]


def _indexed(scans: list[ShardScan], config: IndexConfig, existing: Manifest | None, shown: str) -> _Indexed:
    """The split of ``scans``, its labels read against ``existing`` (the index it joins)."""
    labels, classes, classes_from, ids = _labels(scans, config, existing, shown)
    per_shard = []
    for scan in scans:  # summed: two values may name one class
        shard_counts = Counter[int]()
        for value, n in scan.values.items():
            shard_counts[ids[value]] += n
        per_shard.append(shard_counts)
    counts = Counter[int]()
    for c in per_shard:
        counts.update(c)
    observed, shuffled = _mixing(per_shard, [s.info.samples for s in scans])
    warnings = []
    if shuffled >= 2 and observed < shuffled / 2:
        warnings.append(
            f"shards look class-sorted: a shard holds {observed:.1f} of {len(classes)} classes on average "
            f"({shuffled:.1f} if shuffled). A loader worker mixes the few dozen shards it reads at a time "
            "and its shuffle buffer, so a batch holds fewer classes than shuffled shards would give it "
            f"(a batch sees all {len(classes)} only from ~{math.ceil(len(classes) / max(observed, 1))} "
            "shards read at once; docs/foreign-shards.md has measured figures). "
            "`imgshards pack` shuffles globally."
        )
    split = SplitInfo(
        name=config.split,
        shards=tuple(replace(s.info, labels=encode_table([ids[v] for v in s.labels])) for s in scans),
        class_counts=tuple(counts.get(i, 0) for i in range(len(classes))),
        pack_args={
            "made_by": MADE_BY,
            "shards": config.shards,
            "labels": f".json:{config.label_field}" if config.label_field else ".cls",
            "classes": classes_from,
            "classes_per_shard": round(observed, 2),
            "shuffled_classes_per_shard": round(shuffled, 2),
        },
        labels=labels,
    )
    return _Indexed(split, classes, classes_from, observed, shuffled, tuple(warnings))


def _raise_problems(scans: list[ShardScan], src: str) -> None:
    """Refuse to index when any sample cannot be read: the loader reads samples by position."""
    bad = [s for s in scans if s.bad]
    if not bad:
        return
    first = "; ".join([f"{s.info.name}: {p}" for s in bad for p in s.problems][:2])
    raise UnreadableSamplesError(
        f"{sum(s.bad for s in bad):,} sample(s) in {len(bad)} of {len(scans)} shards of {src} cannot be "
        f"read, e.g. {first}. Fix those shards (or the label field named), or leave them out with "
        "another --shards glob"
    )


# ---- labels and classes -----------------------------------------------------------------------


def _labels(
    scans: list[ShardScan], config: IndexConfig, existing: Manifest | None, src: str
) -> tuple[LabelSource, tuple[str, ...], str, dict[Value, int]]:
    """How labels are read, the class names, where they came from, and label value -> class id."""
    values = {v for s in scans for v in s.values}
    if not values:
        raise SourceError(f"the shards of {src} matching {config.shards!r} hold no samples")
    others = sorted(s for s in (existing.splits if existing else {}) if s != config.split)
    given, kept = config.classes, existing.classes if existing and others else None
    if given and kept is not None and given != kept:
        raise DestinationError(
            f"the classes given differ from those of split(s) {others} in {src}; the splits of one "
            f"dataset share one class list: give the same classes, or remove {INDEX_NAME} and index "
            "every split with the same --classes FILE"
        )
    kinds = {type(v) for v in values}  # label_value read each: an int is a class id, a str a name
    if len(kinds) > 1:
        sample = sorted(values, key=str)[:4]
        where = f".json field {config.label_field!r}" if config.label_field else ".cls members"
        raise UnreadableSamplesError(
            f"the {where} in {src} holds both class ids and names (e.g. {sample}): it must hold one kind "
            "(a class id is ASCII digits only)"
        )
    names = kinds == {str}
    ids: dict[Value, int] = {} if names else {v: int(v) for v in values}
    classes_from = "given" if given else "index" if kept else "derived"
    if names:
        classes = given or kept or tuple(sorted(str(v) for v in values))
        position = {name: i for i, name in enumerate(classes)}
        unknown = sorted(str(v) for v in values if v not in position)
        if unknown:
            where = "the classes given" if given else f"the classes of split(s) {others}"
            raise (SourceError if given else DestinationError)(
                f"{len(unknown)} label(s) of split {config.split!r} are not among {where}: {unknown[:5]}; "
                f"{_ALL_CLASSES}"
            )
        ids = {v: position[str(v)] for v in values}
    else:
        low, high = min(ids.values(), default=0), max(ids.values(), default=-1)
        if low < 0:
            raise SourceError(f"a label in {src} is the class id {low}: ids start at 0")
        if given or kept:
            classes = given or kept or ()
            if high >= len(classes):
                where = "classes given" if given else f"classes in split(s) {others}"
                raise (SourceError if given else DestinationError)(
                    f"a label of split {config.split!r} is the class id {high}, but there are "
                    f"{len(classes)} {where}; {_ALL_CLASSES}"
                )
        elif high >= _MAX_DERIVED_CLASSES:
            raise SourceError(
                f"a label in {src} is the class id {high}: too large to name the classes 0..{high}; "
                "give the class names (--classes FILE)"
            )
        else:
            classes = tuple(str(i) for i in range(high + 1))
    member = "json" if config.label_field else "cls"
    return LabelSource(member, config.label_field, names), classes, classes_from, ids


def _mixing(per_shard: list[Counter[int]], sizes: list[int]) -> tuple[float, float]:
    """Classes a shard holds on average, and what shards of the same sizes would hold if shuffled."""
    totals = Counter[int]()
    for c in per_shard:
        totals.update(c)
    n = sum(sizes)
    if not per_shard or not n:
        return 0.0, 0.0
    p = np.array([k / n for k in totals.values()])
    expected = {size: float(np.sum(1 - (1 - p) ** size)) for size in set(sizes)}
    observed = sum(len(c) for c in per_shard) / len(per_shard)
    return observed, sum(expected[s] for s in sizes) / len(sizes)


def _check_existing(existing: Manifest | None, config: IndexConfig, names: list[str], src: str) -> None:
    if existing is None:
        return
    ours = set(names)
    for other in existing.splits.values():
        if other.name == config.split:
            if other.pack_args.get("made_by") != MADE_BY and not config.overwrite:
                raise DestinationError(
                    f"split {config.split!r} in {src} was made by `imgshards pack`; indexing would "
                    "drop its pack state: choose another split name, or pass --overwrite"
                )
            continue
        shared = sorted(ours & {s.name for s in other.shards})
        if shared:
            raise DestinationError(
                f"{len(shared)} of these shards are already in split {other.name!r} ({', '.join(shared[:3])}"
                f"{', ...' if len(shared) > 3 else ''}): a shard belongs to one split; choose this split's "
                "shards with --shards GLOB"
            )
