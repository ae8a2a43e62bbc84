"""Cut one scanned tree into several splits: a seeded stratified held-out part, or a split file.

Both are pure functions of the tree (its paths and labels) and their arguments, so the same tree
gives the same splits on any machine, whatever the number of workers. A sample keeps its position in
the whole tree's ImageFolder order as its key, so keys stay unique across the splits of one run.

``--val-fraction F``: each class with ``n >= 2`` samples gives ``round(n * F)`` of them to the held-
out split, at least 1 and at most ``n - 1``; a class of one sample stays whole in the main split.
Which samples go is decided by a seeded hash of each path: the ``k`` with the smallest hashes. So
adding or removing a file moves no other file from one split to the other unless the class's
held-out count changes.

``--split-file FILE``: a JSON object mapping split names to lists of paths relative to the tree's
root (``{"train": ["cat/1.jpg", ...], "val": [...]}``, the partition dictionary of the classic
PyTorch data-loading tutorial). Every path must be an image the scan found; files of the tree that
the file does not list are reported as rejects (``not_in_split_file``) of the first split.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..format.errors import SplitFileError, shown
from ..format.validate import SPLIT_CHARS, split_name_error
from ..scan.reasons import Reason
from ..scan.tree import Reject, ScanResult

__all__ = ["SPLIT_CHARS", "Part", "read_split_file", "split_by_file", "split_stratified", "whole"]


@dataclass(frozen=True)
class Part:
    """One split of a tree: its samples (a sub-scan), their positions in the whole tree, extra rejects.

    ``positions[i]`` is sample ``i``'s index in the whole tree's ImageFolder order (its key);
    ``rejects`` are files of the tree this split reports (the scan's own rejects go to the first).
    """

    name: str
    scan: ScanResult
    positions: np.ndarray
    rejects: list[Reject] = field(default_factory=list)

    @property
    def whole(self) -> bool:
        """Whether this part is the entire scan (the positions are 0..n-1)."""
        return len(self.positions) == len(self.scan) and bool(
            np.array_equal(self.positions, np.arange(len(self.scan)))
        )


def whole(name: str, scan: ScanResult) -> list[Part]:
    """The whole tree as one split."""
    return [Part(name, scan, np.arange(len(scan), dtype=np.int64), list(scan.rejects))]


def _subset(scan: ScanResult, idx: np.ndarray) -> ScanResult:
    return ScanResult(
        root=scan.root,
        classes=scan.classes,
        paths=scan.paths.take(idx),
        labels=scan.labels[idx],
        sizes=scan.sizes[idx],
        inodes=scan.inodes[idx],
        rejects=[],
    )


def _path_hashes(scan: ScanResult, seed: int) -> np.ndarray:
    salt = f"imgshards-split/{seed}/".encode()
    return np.fromiter(
        (
            int.from_bytes(hashlib.blake2b(salt + os.fsencode(p), digest_size=8).digest(), "little")
            for p in scan.paths
        ),
        dtype=np.uint64,
        count=len(scan),
    )


def held_out_count(n: int, fraction: float) -> int:
    """Samples of a class of ``n`` that go to the held-out split."""
    if n < 2:
        return 0
    return min(max(int(n * fraction + 0.5), 1), n - 1)


def split_stratified(scan: ScanResult, names: tuple[str, str], fraction: float, seed: int) -> list[Part]:
    """Split ``scan`` into ``names[0]`` and a held-out ``names[1]`` of about ``fraction`` per class."""
    hashes = _path_hashes(scan, seed)
    held = np.zeros(len(scan), dtype=bool)
    # The scan is in ImageFolder order: each class's samples are one contiguous run.
    bounds = np.searchsorted(scan.labels, np.arange(len(scan.classes) + 1), side="left")
    for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        k = held_out_count(stop - start, fraction)
        if k:
            chosen = np.argsort(hashes[start:stop], kind="stable")[:k]
            held[start + chosen] = True
    main, out = np.flatnonzero(~held), np.flatnonzero(held)
    return [
        Part(names[0], _subset(scan, main), main, list(scan.rejects)),
        Part(names[1], _subset(scan, out), out),
    ]


def read_split_file(path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """Read and check a split file (see the module docstring).

    Raises:
        SplitFileError: unreadable, not JSON, not an object of lists of strings, a bad split name,
            or a path listed twice.

    """
    path = Path(path)
    where = shown(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise SplitFileError(f"cannot read split file {where}: {e.strerror}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SplitFileError(f"split file {where} is not JSON ({e})") from e
    example = '{"train": ["cat/1.jpg", ...], "val": ["dog/7.jpg", ...]}'
    if not isinstance(data, dict) or not data:
        raise SplitFileError(
            f"split file {where} must be a JSON object of split name -> paths, like {example}"
        )
    seen: dict[str, str] = {}
    splits: dict[str, list[str]] = {}
    for name, paths in data.items():
        if (problem := split_name_error(name, "split name")) is not None:
            raise SplitFileError(f"split file {where}: {problem}")
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise SplitFileError(f"split file {where}: {name!r} must be a list of paths, like {example}")
        normal = [p.removeprefix("./") for p in paths]
        for p in normal:
            if p in seen:
                raise SplitFileError(
                    f"split file {where}: {shown(p, quoted=True)} is listed in {seen[p]!r} and again in "
                    f"{name!r}"
                )
            seen[p] = name
        splits[name] = normal
    return splits


def split_by_file(scan: ScanResult, splits: dict[str, list[str]], where: str) -> list[Part]:
    """The parts a split file names; the tree's files it does not list become rejects of the first.

    Raises:
        SplitFileError: a listed path is not an image the scan found.

    """
    position = {p: i for i, p in enumerate(scan.paths)}
    unknown = [p for paths in splits.values() for p in paths if p not in position]
    if unknown:
        some = ", ".join(shown(p, quoted=True) for p in unknown[:5]) + (
            f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        )
        raise SplitFileError(
            f"{len(unknown)} path(s) in split file {shown(where)} are not images of {shown(scan.root)}: "
            f"{some}. "
            "Paths are relative to the tree's root, like 'cat/1.jpg'"
        )
    listed = np.zeros(len(scan), dtype=bool)
    parts = []
    for name, paths in splits.items():
        idx = np.sort(np.fromiter((position[p] for p in paths), dtype=np.int64, count=len(paths)))
        listed[idx] = True
        parts.append(Part(name, _subset(scan, idx), idx))
    left = [
        Reject(scan.paths[int(i)], Reason.NOT_IN_SPLIT_FILE, f"not listed in {where}")
        for i in np.flatnonzero(~listed)
    ]
    first = parts[0]
    parts[0] = Part(first.name, first.scan, first.positions, [*scan.rejects, *left])
    return parts
