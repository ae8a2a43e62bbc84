"""The destination's own state: locks, the record of each split's plan and finished shards, the index.

``DST/.imgshards/<split>/`` holds ``plan.json`` (the arguments and a fingerprint of the scanned tree)
and one record per finished shard; ``DST/.imgshards/rejects/<split>.jsonl`` the split's rejects,
under a hidden folder so that no reader's shard pattern (``train-*``, Hugging Face's
``**/train[-._ 0-9]*``) picks it up. A run continues the plan it finds, or refuses to mix two.
Everything here is written, read and removed through :mod:`.write.safefs`: never through a link planted
under the destination.

The index has one writer at a time: every command that writes a local ``index.json`` (``pack``,
``pack --overwrite`` clearing a split, ``imgshards index``, ``imgshards index --upgrade``) goes
through :func:`update_index`, which holds ``DST/.imgshards/index.lock`` while it re-reads the index,
merges into it, writes the table files and the index, and removes the table files no longer named.
So two writers of one dataset, each adding its split, both land: the second merges into what the
first wrote.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..format.errors import DestinationError, ManifestError
from ..format.manifest import INDEX_NAME, TIMM_INFO_NAME, Manifest, read_manifest
from ..plan.shards import Plan
from ..plan.splits import SPLIT_CHARS
from ..scan.tree import ScanResult
from .safefs import clear_dir, locked_fd, make_dirs, read_bytes, remove, write_atomic
from .shard import ShardRecord
from .tablefiles import index_to_write, remove_stale_tables

__all__ = [
    "INDEX_LOCK",
    "INDEX_LOCK_WAIT",
    "REJECTS_DIR",
    "STATE_DIR",
    "check_classes",
    "claim",
    "clear_split",
    "locked",
    "prepare",
    "recorded",
    "rejects_name",
    "update_index",
    "write_index",
]

STATE_DIR = ".imgshards"
REJECTS_DIR = f"{STATE_DIR}/rejects"
INDEX_LOCK = f"{STATE_DIR}/index.lock"
# How long a writer of the index waits for another to finish with it (re-read, merge, write the
# tables and the index: seconds for millions of samples) before it gives up.
INDEX_LOCK_WAIT = 600.0
_LOCK_POLL = 0.05


@contextlib.contextmanager
def locked(dst: Path, path: Path, busy: str, *, wait: float = 0.0) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (below ``dst``); the kernel drops it if the process dies.

    The lock file is opened without following a link (:mod:`.write.safefs`). It may be removed by its
    holder (:func:`claim`); a process that opened it just before then holds a lock on a file no
    longer there, so it checks, after locking, that the file it locked is still the one under
    ``path``, and opens it anew if not. ``wait``: seconds to wait for another holder to let go
    (0: refuse at once) before :class:`DestinationError` ``busy``.
    """
    deadline = time.monotonic() + wait
    while True:
        with locked_fd(path, root=dst) as fd:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise DestinationError(busy) from None
                    time.sleep(_LOCK_POLL)  # flock has no timeout of its own
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


def check_classes(
    dst: Path, splits: tuple[str, ...], scan: ScanResult, existing: Manifest | None = None
) -> None:
    """Refuse splits whose classes differ from those of the other splits in ``dst``'s index.

    ``existing``: that index, already read (under the index lock); None reads it.
    """
    if existing is None:
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
    previous = None if text is None else _plan_of(text)
    leftovers = sorted(p.name for p in dst.glob(f"{split}-*.tar"))
    if previous == wanted or (text is None and not leftovers and not in_index(dst, split)):
        pass
    elif overwrite:
        clear_split(dst, state, split)
    elif previous is None and text is not None:
        raise DestinationError(
            f"{plan_file} is damaged (not the plan this command writes), so the run that wrote split "
            f"{split!r} cannot be continued: pass --overwrite to pack it anew, or choose another destination"
        )
    else:
        raise DestinationError(conflict(dst, split, previous, wanted, leftovers))
    for stale in dst.glob(f".{split}-*.partial"):
        remove(stale, root=dst)  # a link is removed, not followed; a directory in the way too
    write_atomic(plan_file, (json.dumps(wanted, indent=1, sort_keys=True) + "\n").encode(), root=dst)


def _plan_of(text: bytes) -> dict[str, Any] | None:
    """The plan a run wrote (``prepare``), or None for bytes that are not one: damaged, or not ours."""
    try:
        plan = json.loads(text)
    except ValueError:  # not JSON, or not UTF-8
        return None
    return plan if isinstance(plan, dict) and isinstance(plan.get("args"), dict) else None


def in_index(dst: Path, split: str) -> bool:
    try:
        return split in read_manifest(dst).splits
    except ManifestError:
        return False


def conflict(
    dst: Path, split: str, previous: dict[str, Any] | None, wanted: dict[str, Any], leftovers: list[str]
) -> str:
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

        def without(current: Manifest | None) -> Manifest | None:
            if current is None:
                return None
            return Manifest(current.classes, {k: v for k, v in current.splits.items() if k != split})

        update_index(dst, without)


def rejects_name(split: str) -> str:
    """The rejects file of ``split``, relative to the destination."""
    return f"{REJECTS_DIR}/{split}.jsonl"


def recorded(dst: Path, state: Path, name: str) -> ShardRecord | None:
    """The record of shard ``name`` finished by an earlier run, if there is one (``state`` is below ``dst``).

    A record that does not parse, or that names another file, is no record: that shard is packed
    again (a record's name is the file hashed and kept; one naming another could point anywhere).
    """
    text = read_bytes(state / f"{name}.json", root=dst)
    if text is None:
        return None
    try:
        record = ShardRecord.from_json(json.loads(text))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return record if record.name == name else None


def update_index(dst: Path, change: Callable[[Manifest | None], Manifest | None]) -> Manifest | None:
    """Re-read ``dst``'s index, write what ``change`` makes of it, holding the index lock throughout.

    The one way a local index is written (see the module docstring). ``change`` gets the index as
    it is now (None: there is none) and returns the index to write, or None to leave it as it is;
    its splits may hold format-1 tables (a pack's records, the splits of a format-1 index), which
    are written as files first (:func:`~.tablefiles.as_format2`). Once the index is in place, the
    table files it no longer names are removed; if it cannot be written, those just written are.
    Returns the index as it is left.

    Raises:
        SourceError: the index would be refused by its readers (too large): nothing was written.
        DestinationError: another writer held the lock for :data:`INDEX_LOCK_WAIT` seconds.
        ManifestError: the index there cannot be read.

    """
    make_dirs(dst, STATE_DIR)
    busy = f"another command has been writing the index of {dst} for {INDEX_LOCK_WAIT:.0f} s; retry"
    with locked(dst, dst / INDEX_LOCK, busy, wait=INDEX_LOCK_WAIT):
        current = read_manifest(dst) if os.path.lexists(dst / INDEX_NAME) else None
        wanted = change(current)
        if wanted is None:
            return current
        try:
            manifest = index_to_write(dst, wanted, f"the index of {dst}", safe_root=dst)
            del wanted  # its format-1 tables, if any: no longer needed
            write_index(dst, manifest)
        except BaseException:
            # The tables this call wrote, unless its index got in place after all (an interrupt
            # between its rename and the return): those the index in place does not name.
            with contextlib.suppress(Exception):
                in_place = read_manifest(dst) if os.path.lexists(dst / INDEX_NAME) else Manifest((), {})
                remove_stale_tables(dst, in_place)
            raise
        remove_stale_tables(dst, manifest)
    return manifest


def write_index(dst: Path, manifest: Manifest) -> None:
    """Write timm's ``_info.json``, then the index, each atomically (call it holding the index lock)."""
    write_atomic(dst / TIMM_INFO_NAME, (json.dumps(manifest.timm_info(), indent=1) + "\n").encode(), root=dst)
    write_atomic(dst / INDEX_NAME, manifest.dumps().encode(), root=dst)
