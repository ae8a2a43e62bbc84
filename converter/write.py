"""Write one shard: read its files, check them, append the good ones to a tar, commit atomically.

Runs in a worker process. A shard is first written to a hidden temporary name beside its final one,
fsynced, then renamed, so a shard under its final name is always whole; its record (sample count,
size, SHA-256, per-class counts, rejects) is written the same way after it, and is what marks the
shard as done for a resumed run (the parent writes it, see :mod:`.pack`).
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from .check import Check, Inspection, Reason, inspect_image
from .scan import PathTable, Reject
from .tarwriter import TarWriter

__all__ = ["ShardRecord", "ShardTask", "write_atomic", "write_shard"]

# Files are read a window at a time, in inode order, which on common file systems is close to the
# order of their data on disk (the global shuffle would otherwise turn a cold read of a tree of small
# files into random I/O). While a window is being written out, the kernel is already reading the
# next one (posix_fadvise WILLNEED): I/O overlaps the work with no reading threads, whose fight for
# the GIL cost more than reading a small file.
_WINDOW_FILES = 1 << 14
_WINDOW_BYTES = 64 << 20


@dataclass(frozen=True)
class ShardTask:
    """Everything a worker needs to write one shard."""

    index: int
    name: str
    src: str
    dst: str
    paths: PathTable
    sizes: np.ndarray
    inodes: np.ndarray
    labels: np.ndarray
    keys: np.ndarray
    classes: tuple[str, ...]
    key_width: int
    check: Check
    resize: int | None
    quality: int


@dataclass(frozen=True)
class ShardRecord:
    """What was written to a shard; stored as JSON beside the pack state, then folded into the index."""

    name: str
    samples: int
    bytes: int
    sha256: str
    class_counts: dict[int, int]
    rejects: tuple[Reject, ...]

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form of the record."""
        return {
            "name": self.name,
            "samples": self.samples,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "class_counts": {str(k): v for k, v in sorted(self.class_counts.items())},
            "rejects": [r.to_json() for r in self.rejects],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardRecord:
        """Rebuild a record written by :meth:`to_json`."""
        return cls(
            name=data["name"],
            samples=int(data["samples"]),
            bytes=int(data["bytes"]),
            sha256=data["sha256"],
            class_counts={int(k): int(v) for k, v in data["class_counts"].items()},
            rejects=tuple(Reject(r["path"], Reason(r["reason"]), r["detail"]) for r in data["rejects"]),
        )


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file, fsync and rename."""
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: str, size: int) -> bytes | OSError:
    """Read a whole file whose size the scan saw; three system calls for a small file."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            chunks = [os.read(fd, size + 1)]
            while len(chunks[-1]) and sum(map(len, chunks)) > size:  # it grew since the scan
                chunks.append(os.read(fd, 1 << 20))
        finally:
            os.close(fd)
    except OSError as e:
        return e
    return b"".join(chunks) if len(chunks) > 1 else chunks[0]


def _windows(sizes: list[int]) -> Iterator[range]:
    """Consecutive ranges of at most ``_WINDOW_FILES`` files and about ``_WINDOW_BYTES`` bytes."""
    start = total = 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= _WINDOW_FILES or total + size > _WINDOW_BYTES):
            yield range(start, i)
            start, total = i, 0
        total += size
    if start < len(sizes):
        yield range(start, len(sizes))


def _prefetch(paths: list[str], indices: list[int]) -> None:
    """Ask the kernel to start reading these files into the page cache; returns at once."""
    if not hasattr(os, "posix_fadvise"):
        return
    for i in indices:
        try:
            fd = os.open(paths[i], os.O_RDONLY)
        except OSError:
            continue  # reported when it is read
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)


def _read_ahead(paths: list[str], sizes: list[int], inodes: list[int]) -> Iterator[bytes | OSError]:
    """Yield each file's bytes in the given order, reading a window at a time in inode order."""
    windows = [(w, sorted(w, key=inodes.__getitem__)) for w in _windows(sizes)]
    if windows:
        _prefetch(paths, windows[0][1])
    for k, (window, by_inode) in enumerate(windows):
        data = {i: _read(paths[i], sizes[i]) for i in by_inode}
        if k + 1 < len(windows):
            _prefetch(paths, windows[k + 1][1])
        for i in window:
            yield data.pop(i)


def _reencode(data: bytes, resize: int, quality: int) -> tuple[bytes, Inspection]:
    """Return RGB JPEG bytes with the shorter side at most ``resize`` (never upscaled)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # palette-with-transparency notices and the like
        with Image.open(io.BytesIO(data)) as im:
            if im.format == "JPEG" and im.mode == "RGB" and min(im.size) <= resize:
                # Already what we would write: spare it a second generation of loss.
                return data, Inspection(ext="jpg", width=im.width, height=im.height)
            scale = min(1.0, resize / min(im.size))
            size = (max(1, round(im.width * scale)), max(1, round(im.height * scale)))
            if im.format == "JPEG":
                im.draft("RGB", size)  # let libjpeg decode at 1/2, 1/4 or 1/8 scale when it can
            rgb = im.convert("RGB")
    if rgb.size != size:
        rgb = rgb.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=quality)
    return out.getvalue(), Inspection(ext="jpg", width=size[0], height=size[1])


def write_shard(task: ShardTask, counter: Any = None) -> ShardRecord:
    """Write the shard described by ``task`` under its final name; return its record.

    Args:
        task: The shard to write.
        counter: A shared ``multiprocessing.Value`` bumped by the number of files handled, for the
            parent's progress bar; ``None`` for no progress.

    """
    dst = Path(task.dst)
    final = dst / task.name
    tmp = dst / f".{task.name}.partial"
    rejects: list[Reject] = []
    class_counts: dict[int, int] = {}
    samples = done = 0
    class_json = [encode_basestring_ascii(name) for name in task.classes]
    rel_paths = list(task.paths)
    with open(tmp, "wb", buffering=1 << 20) as f:
        tar = TarWriter(f)
        full_paths = [os.path.join(task.src, p) for p in rel_paths]
        for i, data in enumerate(_read_ahead(full_paths, task.sizes.tolist(), task.inodes.tolist())):
            rel = rel_paths[i]
            outcome = _inspect(rel, data, task)
            if isinstance(outcome, Reject):
                rejects.append(outcome)
            else:
                image, verdict = outcome
                label = int(task.labels[i])
                key = f"{int(task.keys[i]):0{task.key_width}d}"
                # The JSON by hand, keys sorted as json.dumps(sort_keys=True) would: this runs per file.
                size = f',"height":{verdict.height}' if verdict.width else ""
                meta = f'{{"class":{class_json[label]}{size},"path":{encode_basestring_ascii(rel)}'
                meta += f',"width":{verdict.width}}}' if verdict.width else "}"
                tar.add_many(
                    [
                        (f"{key}.{verdict.ext}", image),
                        (f"{key}.cls", b"%d" % label),
                        (f"{key}.json", meta.encode()),
                    ]
                )
                class_counts[label] = class_counts.get(label, 0) + 1
                samples += 1
            done += 1
            if counter is not None and done % 256 == 0:
                with counter.get_lock():
                    counter.value += 256
        sha256 = tar.close()
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(dst)
    if counter is not None:
        with counter.get_lock():
            counter.value += done % 256
    return ShardRecord(task.name, samples, tar.size, sha256, class_counts, tuple(rejects))


def _inspect(rel: str, data: bytes | OSError, task: ShardTask) -> Reject | tuple[bytes, Inspection]:
    """Return the bytes to store and their verdict, or the reason the file is rejected."""
    if isinstance(data, OSError):
        return Reject(rel, Reason.UNREADABLE, data.strerror or str(data))
    verdict = inspect_image(data, os.path.splitext(rel)[1].lower(), task.check)
    if verdict.reason is not None:
        return Reject(rel, verdict.reason, verdict.detail)
    if task.resize is None:
        return data, verdict
    try:
        return _reencode(data, task.resize, task.quality)
    except Exception as e:  # any decode failure while re-encoding is this file's verdict
        return Reject(rel, Reason.UNDECODABLE, f"{type(e).__name__}: {e}")
