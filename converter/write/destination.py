"""The destination's own state: locks, the record of each split's plan and finished shards, the index.

``DST/.imgshards/<split>/`` holds ``plan.json`` (the arguments and a fingerprint of the scanned tree)
and one record per finished shard; ``DST/.imgshards/rejects/<split>.jsonl`` the split's rejects,
under a hidden folder so that no reader's shard pattern (``train-*``, Hugging Face's
``**/train[-._ 0-9]*``) picks it up. A run continues the plan it finds, or refuses to mix two.
Everything here is written, read and removed through :mod:`.write.safefs`: never through a link planted
under the destination.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..format.errors import DestinationError, ManifestError
from ..format.manifest import INDEX_NAME, TIMM_INFO_NAME, Manifest, read_manifest
from ..plan.shards import Plan
from ..plan.splits import SPLIT_CHARS
from ..scan.tree import ScanResult
from .safefs import clear_dir, locked_fd, make_dirs, read_bytes, remove, write_atomic
from .shard import ShardRecord

__all__ = [
    "REJECTS_DIR",
    "STATE_DIR",
    "check_classes",
    "claim",
    "clear_split",
    "locked",
    "prepare",
    "recorded",
    "rejects_name",
    "write_index",
]

STATE_DIR = ".imgshards"
REJECTS_DIR = f"{STATE_DIR}/rejects"


@contextlib.contextmanager
def locked(dst: Path, path: Path, busy: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (below ``dst``); the kernel drops it if the process dies.

    The lock file is opened without following a link (:mod:`.write.safefs`). It may be removed by its
    holder (:func:`claim`); a process that opened it just before then holds a lock on a file no
    longer there, so it checks, after locking, that the file it locked is still the one under
    ``path``, and opens it anew if not.
    """
    while True:
        with locked_fd(path, root=dst) as fd:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DestinationError(busy) from None
            try:
                current = os.lstat(path).st_ino
            except FileNotFoundError:
                continue
            if current != os.fstat(fd).st_ino:
                continue
            yield
            return


@contextlib.contextmanager
def claim(dst: Path, splits: Sequence[str]) -> Iterator[None]:
    """Create the state folders of ``splits`` in ``dst`` and lock each for this run.

    A run that fails before it planned a split (a refusal: a conflicting destination, a bad source)
    leaves ``dst`` as it found it: no lock file, and no folder it created (``dst`` included). Every
    folder below ``dst`` is made and every lock opened without following a link (:mod:`.write.safefs`).

    Raises:
        DestinationError: ``dst`` cannot be created, or another ``pack`` is writing one of ``splits``.

    """
    states = [dst / STATE_DIR / name for name in sorted(splits)]
    fresh = [p for p in (dst, dst / STATE_DIR, *states) if not p.exists()]
    try:
        dst.mkdir(parents=True, exist_ok=True)
        for state in states:
            make_dirs(dst, state.relative_to(dst))
    except OSError as e:
        raise DestinationError(f"cannot create destination {dst}: {e.strerror}") from e
    try:
        with contextlib.ExitStack() as locks:
            for state in states:
                busy = f"another `imgshards pack` is writing split {state.name!r} into {dst}"
                locks.enter_context(locked(dst, state / "lock", busy))
            try:
                yield
            except BaseException:
                for state in states:  # still holding its lock: see locked()
                    if [p.name for p in state.iterdir()] == ["lock"]:
                        remove(state / "lock", root=dst)
                raise
    except BaseException:
        for folder in reversed(fresh):
            with contextlib.suppress(OSError):  # not empty: this run wrote something worth keeping
                folder.rmdir()
        raise


def check_classes(dst: Path, splits: tuple[str, ...], scan: ScanResult) -> None:
    """Refuse splits whose classes differ from those of the other splits already in ``dst``."""
    if not (dst / INDEX_NAME).exists():
        return
    existing = read_manifest(dst)
    others = sorted(s for s in existing.splits if s not in splits)
    if others and existing.classes != scan.classes:
        extra = sorted(set(scan.classes) - set(existing.classes))
        missing = sorted(set(existing.classes) - set(scan.classes))
        raise DestinationError(
            f"the classes of {scan.root} differ from those of split(s) {', '.join(others)} in {dst} "
            f"(new: {extra[:5] or 'none'}, missing: {missing[:5] or 'none'}); splits of one dataset "
            "share one label index: pack into another destination, or fix the class directories"
        )


def prepare(dst: Path, state: Path, args: dict[str, Any], overwrite: bool, plan: Plan, split: str) -> None:
    """Start a fresh split, continue an interrupted one, or refuse to mix two different ones."""
    wanted = {"args": args, "fingerprint": plan.fingerprint, "shards": plan.num_shards}
    plan_file = state / "plan.json"
    text = read_bytes(plan_file, root=dst)
    previous = json.loads(text) if text is not None else None
    leftovers = sorted(p.name for p in dst.glob(f"{split}-*.tar"))
    if previous == wanted or (previous is None and not leftovers and not in_index(dst, split)):
        pass
    elif overwrite:
        clear_split(dst, state, split)
    else:
        raise DestinationError(conflict(dst, split, previous, wanted, leftovers))
    for stale in dst.glob(f".{split}-*.partial"):
        remove(stale, root=dst)  # a link is removed, not followed; a directory in the way too
    write_atomic(plan_file, (json.dumps(wanted, indent=1, sort_keys=True) + "\n").encode(), root=dst)


def in_index(dst: Path, split: str) -> bool:
    try:
        return split in read_manifest(dst).splits
    except ManifestError:
        return False


def conflict(dst: Path, split: str, previous: dict | None, wanted: dict, leftovers: list[str]) -> str:
    if previous is None and leftovers:
        n = len(leftovers)
        return (
            f"{dst} already holds {n} shard{'s' if n != 1 else ''} of split {split!r} not made by an "
            f"interrupted run of this command: to read them as a dataset, run `imgshards index {dst}`; "
            "to pack, choose another destination (--overwrite would delete them)"
        )
    if previous is None:
        what = f"split {split!r}, not made by an interrupted run of this command"
    elif previous["args"].get("source") != wanted["args"].get("source"):
        # Another tree into a split already there: most likely the next split of the dataset
        # (`pack photos/val DST` after `pack photos/train DST`), packed without --split.
        source = Path(str(wanted["args"].get("source")))
        name = (
            source.name if source.name and set(source.name) <= SPLIT_CHARS and source.name != split else None
        )
        return (
            f"{dst} already holds split {split!r}, packed from {previous['args'].get('source')}; to pack "
            f"{source} as another split beside it, pass {f'--split {name}' if name else '--split NAME'} "
            f"(--overwrite would replace split {split!r} with it)"
        )
    elif previous["args"] != wanted["args"]:
        diff = [
            f"{k} {previous['args'].get(k)!r} -> {v!r}"
            for k, v in wanted["args"].items()
            if previous["args"].get(k) != v
        ]
        what = f"split {split!r} packed with other arguments ({'; '.join(diff)})"
    else:
        what = f"split {split!r} packed from a different tree (files were added, removed or changed since)"
    return f"{dst} already holds {what}; pass --overwrite to replace it, or choose another destination"


def clear_split(dst: Path, state: Path, split: str) -> None:
    """Remove a split from ``dst``: its shards, rejects, records and its entry in the index."""
    for path in [*dst.glob(f"{split}-*.tar"), dst / rejects_name(split), dst / f"{split}-rejects.jsonl"]:
        remove(path, root=dst)  # the last: where rejects were written before 0.1.1
    clear_dir(state, root=dst, keep=frozenset({"lock"}))
    if (dst / INDEX_NAME).exists():
        with locked(dst, dst / STATE_DIR / "index.lock", "another pack is updating the index; retry"):
            manifest = read_manifest(dst)
            splits = {k: v for k, v in manifest.splits.items() if k != split}
            write_index(dst, Manifest(manifest.classes, splits))


def rejects_name(split: str) -> str:
    """The rejects file of ``split``, relative to the destination."""
    return f"{REJECTS_DIR}/{split}.jsonl"


def recorded(dst: Path, state: Path, name: str) -> ShardRecord | None:
    """The record of a shard finished by an earlier run, if there is one (``state`` is below ``dst``)."""
    text = read_bytes(state / f"{name}.json", root=dst)
    return None if text is None else ShardRecord.from_json(json.loads(text))


def write_index(dst: Path, manifest: Manifest) -> None:
    """Write the index and timm's ``_info.json`` atomically (call it holding the index lock)."""
    write_atomic(dst / INDEX_NAME, manifest.dumps().encode(), root=dst)
    write_atomic(dst / TIMM_INFO_NAME, (json.dumps(manifest.timm_info(), indent=1) + "\n").encode(), root=dst)
