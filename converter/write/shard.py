"""Read the tree in disk order into per-shard buckets, then write each shard from its buckets.

Both phases run in worker processes.

**Gather.** The plan's global shuffle spreads every shard over the whole tree: read shard by shard,
a cold tree of small files is random I/O, which a disk (worse, a network disk) serves several
times slower than reading the same files in the order they lie on it. So the files are read first
in inode order (on common file systems close to the order of their data on disk), a range of it per
task, and each file's bytes are appended to a bucket of the shard the plan puts it in, tagged with
its position in that shard. Buckets live in the pack's state directory and are read back
sequentially; they hold the split's image bytes once, about the size of the shards to come, and are
deleted as their shard is written.

**Direct.** On a tree already in the page cache (or on storage where random reads cost little) the
gather only writes every byte twice: a shard's files are then read straight from the tree in plan
order by the worker that writes it (``ShardTask.src``). The output is the same bytes either way.

**Write.** A shard's buckets are read into memory (or its files from the tree), the samples put in
plan order, checked, converted to the split's one image format where needed (:mod:`.format.formats`), and
appended to a tar. A shard is first written to a hidden temporary name beside its final one,
fsynced, then renamed, so a shard under its final name is always whole; its record (sample count,
size, SHA-256, per-class counts, formats, conversions, image sizes, rejects) is written the same way
after it, and is what marks the shard as done for a resumed run (the parent writes it, see
:mod:`.pack`).
"""

from __future__ import annotations

import io
import os
import struct
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from PIL import Image

from ..config import Check
from ..engines.pool import add_progress
from ..format.formats import ALWAYS_CONVERTED, convert_image, jpeg_ready, orientation, upright
from ..format.headers import oversized, pixel_excess
from ..format.imageformats import JPEG
from ..format.imagesizes import size_key
from ..format.tables import BLOCK, TABLES, encode_sources, encode_table, key_digest
from ..format.tarwriter import TarWriter
from ..scan.check import Inspection, inspect_image
from ..scan.reasons import Reason
from ..scan.sourcefiles import read_ahead, read_file, reason_of
from ..scan.tree import PathTable, Reject
from .attempts import attempt_path
from .resume import combined_digest, file_digest
from .safefs import create, open_file, remove, write_atomic

if TYPE_CHECKING:  # the plan's (plan.tasks makes each); this stage only reads one
    from ..plan.tasks import ShardTask

__all__ = ["GatherTask", "ShardRecord", "gather", "stored_image", "write_atomic", "write_shard"]

# A bucket record: position in the shard, payload length, errno (0: the payload is the file's bytes;
# otherwise the file could not be read and the payload is the error message).
_RECORD = struct.Struct("<IIi")
_FLUSH_BYTES = 64 << 20  # a gather appends its buffered records to the buckets past this many bytes


@dataclass(frozen=True)
class GatherTask:
    """A run of files to read in the given order and append to the buckets of their shards."""

    src: str
    buckets: str
    paths: PathTable
    sizes: np.ndarray
    shards: np.ndarray
    slots: np.ndarray
    dst: str | None = None  # the destination above ``buckets``: walked from there without links


@dataclass(frozen=True)
class ShardRecord:
    """What was written to a shard; stored as JSON beside the pack state, then folded into the index."""

    name: str
    samples: int
    bytes: int
    sha256: str
    class_counts: dict[int, int]
    rejects: tuple[Reject, ...]
    formats: dict[str, int] = field(default_factory=dict)
    converted: dict[str, int] = field(default_factory=dict)
    content: str = ""  # digest of the files' bytes as gathered (see .resume)
    # The shard's tables in the index's form (.tables); None in a record from before the table.
    offsets: str | None = None
    labels: str | None = None
    keys: str | None = None
    sources: str | None = None
    # Images stored per size ("4032x3024": n, see .imagesizes); None in a record from before sizes.
    sizes: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form of the record."""
        return {
            "name": self.name,
            "samples": self.samples,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "class_counts": {str(k): v for k, v in sorted(self.class_counts.items())},
            "rejects": [r.to_json() for r in self.rejects],
            "formats": dict(sorted(self.formats.items())),
            "converted": dict(sorted(self.converted.items())),
            "content": self.content,
            **{table: getattr(self, table) for table in TABLES if getattr(self, table) is not None},
            **({} if self.sizes is None else {"sizes": dict(sorted(self.sizes.items()))}),
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
            formats={str(k): int(v) for k, v in data.get("formats", {}).items()},
            converted={str(k): int(v) for k, v in data.get("converted", {}).items()},
            content=str(data.get("content", "")),
            **{table: data.get(table) for table in TABLES},
            sizes=None if "sizes" not in data else {str(k): int(v) for k, v in data["sizes"].items()},
        )


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def gather(task: GatherTask, counter: Any = None) -> dict[int, str]:
    """Read the task's files in order into the buckets of their shards; return the buckets written.

    Bucket files are named after the shard and this process, so tasks running at once never write
    the same file; a process appends to its own buckets from task to task.

    Args:
        task: The files to read.
        counter: A shared ``multiprocessing.Value`` bumped by the number of files read, for the
            parent's progress bar; ``None`` for no progress.

    """
    buffers: dict[int, bytearray] = {}
    written: dict[int, str] = {}

    def flush() -> None:
        for shard, buffer in buffers.items():
            path = written.setdefault(shard, os.path.join(task.buckets, f"{shard:06d}-{os.getpid()}.bin"))
            with open_file(path, root=root, append=True) as f:  # a link at its name is refused
                f.write(buffer)
        buffers.clear()

    buffered = 0
    root = None if task.dst is None else Path(task.dst)
    shards, slots = task.shards.tolist(), task.slots.tolist()
    full_paths = [os.path.join(task.src, p) for p in task.paths]
    for i, data in enumerate(read_ahead(full_paths, task.sizes.tolist())):
        if isinstance(data, OSError):
            payload, error = (data.strerror or str(data)).encode(), data.errno or -1
        else:
            payload, error = data, 0
        buffer = buffers.setdefault(shards[i], bytearray())
        buffer += _RECORD.pack(slots[i], len(payload), error)
        buffer += payload
        buffered += len(payload)
        if buffered >= _FLUSH_BYTES:
            flush()
            buffered = 0
        if counter is not None and i % 256 == 255:
            add_progress(counter, 256)
    flush()
    if counter is not None:
        add_progress(counter, len(full_paths) % 256)
    return written


def _load_buckets(buckets: tuple[str, ...], count: int, shard: str, root: Path) -> list[bytes | OSError]:
    """The bytes (or read error) of each of a shard's ``count`` files, in plan order."""
    files: list[bytes | OSError | None] = [None] * count
    for path in buckets:
        with open_file(path, root=root, buffering=1 << 20) as f:
            while header := f.read(_RECORD.size):
                slot, length, error = _RECORD.unpack(header)
                payload = f.read(length)
                files[slot] = payload if error == 0 else OSError(error, payload.decode())
    missing = files.count(None)
    if missing:  # a bug, not bad input: every planned file is gathered, readable or not
        raise RuntimeError(f"{missing} of the {count} files of {shard} are missing from its buckets")
    return cast(list[bytes | OSError], files)


def _reencode(
    data: bytes, resize: int, quality: int, max_pixels: int | None = None
) -> tuple[bytes, Inspection]:
    """Return RGB JPEG bytes with the shorter side at most ``resize`` (never upscaled).

    Raises:
        ValueError: the image opens with more pixels than the bound (before any is decoded).

    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # palette-with-transparency notices and the like
        with Image.open(io.BytesIO(data)) as im:
            if excess := pixel_excess(*im.size, max_pixels):  # a format no header walker reads
                raise ValueError(excess)
            if im.format == JPEG.pillow and im.mode == "RGB" and min(im.size) <= resize:
                # Already what we would write: spare it a second generation of loss.
                return data, Inspection(ext="jpg", width=im.width, height=im.height)
            scale = min(1.0, resize / min(im.size))
            size = (max(1, round(im.width * scale)), max(1, round(im.height * scale)))
            if im.format == JPEG.pillow:
                im.draft("RGB", size)  # let libjpeg decode at 1/2, 1/4 or 1/8 scale when it can
            turn = orientation(im)  # applied: the new file has no orientation tag (formats.py)
            rgb = upright(jpeg_ready(im).convert("RGB"), turn)  # as the conversion: on white, 8 bits
            size = size[::-1] if turn in (5, 6, 7, 8) else size  # width and height trade places
    if rgb.size != size:
        rgb = rgb.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
    out = io.BytesIO()
    rgb.save(out, format=JPEG.pillow, quality=quality)
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
    tmp = attempt_path(dst, task.name)  # unique: a retried task and a straggler never share it
    rejects: list[Reject] = []
    class_counts: dict[int, int] = {}
    formats: dict[str, int] = {}
    converted: dict[str, int] = {}
    sizes: dict[str, int] = {}  # as stored, from the headers read (none with check none)
    digests: list[bytes] = []  # of the files as read, for a resumed run's content check (see .resume)
    # The shard's tables (.tables): where each sample starts (in blocks), its class id, key, source.
    starts: list[int] = []
    ids: list[int] = []
    keys: list[int] = []
    sources: list[str] = []
    samples = done = 0
    class_json = [encode_basestring_ascii(name) for name in task.classes]
    rel_paths = list(task.paths)
    files: Iterable[bytes | OSError]
    if task.src is None:
        files = _load_buckets(task.buckets, len(rel_paths), task.name, dst)
    else:
        assert task.sizes is not None, "a direct task carries the sizes of its files"
        files = map(read_file, (os.path.join(task.src, p) for p in rel_paths), task.sizes.tolist())
    with create(tmp, buffering=1 << 20) as f:  # O_EXCL | O_NOFOLLOW: never written through a link
        tar = TarWriter(f)
        for i, data in enumerate(files):
            digests.append(file_digest(data))
            rel = rel_paths[i]
            outcome = _inspect(rel, data, task)
            if isinstance(outcome, Reject):
                rejects.append(outcome)
            else:
                image, verdict, reasons = outcome
                formats[str(verdict.ext)] = formats.get(str(verdict.ext), 0) + 1
                for reason in reasons:
                    converted[reason] = converted.get(reason, 0) + 1
                if verdict.width and verdict.height:
                    stored = size_key(verdict.width, verdict.height)
                    sizes[stored] = sizes.get(stored, 0) + 1
                label = int(task.labels[i])
                key = f"{int(task.keys[i]):0{task.key_width}d}"
                # The JSON by hand, keys sorted as json.dumps(sort_keys=True) would: this runs per file.
                size = f',"height":{verdict.height}' if verdict.width else ""
                meta = f'{{"class":{class_json[label]}{size},"path":{encode_basestring_ascii(rel)}'
                meta += f',"width":{verdict.width}}}' if verdict.width else "}"
                starts.append(tar.size // BLOCK)
                ids.append(label)
                keys.append(key_digest(key))
                sources.append(rel)
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
                add_progress(counter, 256)
        sha256 = tar.close()
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(dst)
    for bucket in task.buckets:
        remove(Path(bucket), root=dst)
    if counter is not None:
        add_progress(counter, done % 256)
    content = combined_digest(digests)  # what a resumed run checks the tree against (see .resume)
    return ShardRecord(
        task.name,
        samples,
        tar.size,
        sha256,
        class_counts,
        tuple(rejects),
        formats,
        converted,
        content,
        sizes=sizes,
        offsets=encode_table(starts),
        labels=encode_table(ids),
        keys=encode_table(keys),
        sources=encode_sources(sources),
    )


def _inspect(
    rel: str, data: bytes | OSError, task: ShardTask
) -> Reject | tuple[bytes, Inspection, tuple[str, ...]]:
    """Return the bytes to store, their verdict and why they were converted; or why it is rejected."""
    if isinstance(data, OSError):
        return Reject(rel, reason_of(data), data.strerror or str(data))
    return stored_image(
        rel,
        data,
        check=task.check,
        max_pixels=task.max_pixels,
        resize=task.resize,
        quality=task.quality,
        image_format=task.image_format,
    )


def stored_image(
    rel: str,
    data: bytes,
    *,
    check: Check,
    max_pixels: int | None,
    resize: int | None,
    quality: int,
    image_format: str | None,
) -> Reject | tuple[bytes, Inspection, tuple[str, ...]]:
    """The bytes a shard stores for the file ``rel`` holding ``data``, their verdict and conversions.

    Or why the file is rejected. :mod:`.plan.resizehint` asks it too, for what ``--resize`` would store.
    """
    verdict = inspect_image(data, os.path.splitext(rel)[1].lower(), check, max_pixels)
    if verdict.reason is not None:
        return Reject(rel, verdict.reason, verdict.detail)
    # HEIC and AVIF are converted even where formats are kept: no shard reader decodes them.
    target = image_format or ("jpg" if verdict.ext in ALWAYS_CONVERTED else None)
    decoded = resize is not None or (target is not None and verdict.ext != target)
    if decoded and (excess := oversized(data, max_pixels)):  # the pixel bound, --check none too
        return Reject(rel, Reason.TOO_MANY_PIXELS, excess)
    try:
        if resize is not None:
            return (*_reencode(data, resize, quality, max_pixels), ())
        if target is None or verdict.ext == target:
            return data, verdict, ()
        image = convert_image(data, str(verdict.ext), target)
    except Exception as e:  # any decode failure while re-encoding is this file's verdict
        return Reject(rel, Reason.UNDECODABLE, f"{type(e).__name__}: {e}")
    return (
        image.data,
        Inspection(ext=target, width=image.width, height=image.height),
        image.reasons,
    )
