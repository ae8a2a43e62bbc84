"""``pack``: scan -> split -> plan -> write shards in parallel -> index. Resumable; accounts for every file.

One run packs one split, or several cut from the one tree (``val_fraction``, ``split_file``: see
:mod:`.splits`), sharing one label index. State of an unfinished split lives in
``DST/.imgshards/<split>/``: ``plan.json`` (the arguments and a fingerprint of the scanned tree) and
one record per finished shard; its rejects file is ``DST/.imgshards/rejects/<split>.jsonl``, under a
hidden folder so that no reader's shard pattern (``train-*``, Hugging Face's ``**/train[-._ 0-9]*``)
picks it up. Re-running the same command
after a crash checks the finished shards against their records, writes the rest, and gives output
byte-identical to an uninterrupted run. The index is written last, under a lock, so several splits
can be packed into one destination.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from tqdm.auto import tqdm

from .check import Check
from .errors import DestinationError, ManifestError, SourceError, SplitFileError
from .failures import explained
from .formats import main_format
from .manifest import INDEX_NAME, TIMM_INFO_NAME, Manifest, ShardInfo, SplitInfo, read_manifest
from .plan import Plan, estimated_sample_bytes, make_plan
from .pool import default_workers, progress, shared_counter, start_pool, worker_state
from .readorder import ReadOrder, choose_read_order
from .resume import changed_shards
from .scan import Reject, ScanResult, scan_tree
from .splits import SPLIT_CHARS, Part, read_split_file, split_by_file, split_stratified, whole
from .verify import hash_file
from .write import GatherTask, ShardRecord, ShardTask, gather, write_atomic, write_shard

__all__ = ["DEFAULT_SHARD_SIZE", "PackConfig", "PackHooks", "PackResult", "pack"]

log = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = 256 * 10**6
STATE_DIR = ".imgshards"
REJECTS_DIR = f"{STATE_DIR}/rejects"
# Gather tasks: runs of the tree in inode order, each read by one worker (see :mod:`.write`).
_BUCKETS = "buckets"
_GATHER_FILES = 1 << 16
_GATHER_BYTES = 256 << 20
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, kw_only=True)
class PackConfig:
    """How to pack a tree. Fields other than workers, read_order, overwrite, progress shape the output.

    Attributes:
        split: Name of the split, the shards' prefix (``train-000000.tar``): lower-case letters,
            digits and underscores. With ``val_fraction``, the split of the rest of the tree.
        shard_size: Shards are closed before they pass this many bytes (at least one sample each).
        seed: Seed of the global shuffle that mixes classes across shards.
        check: ``"header"`` (cheap, catches non-images, empty and truncated files), ``"full"``
            (decodes every image) or ``"none"``. See :mod:`imgshards.converter.check`.
        resize: Re-encode images as RGB JPEGs with the shorter side at most this many pixels
            (never upscaled); ``None`` stores the original bytes.
        quality: JPEG quality of re-encoded images.
        keep_formats: Store every image's own bytes under the extension of its format, instead of
            one format per split (see :mod:`imgshards.converter.formats`).
        val_fraction: Also write a held-out split ``val_split`` of about this share of each class
            (stratified, seeded by ``seed``; see :mod:`imgshards.converter.splits`).
        val_split: Name of the held-out split.
        split_file: A JSON file mapping split names to the tree's paths in them; the splits packed
            are its keys (``split`` is then unused).
        workers: Worker processes writing shards; ``None`` for one per core.
        read_order: ``"disk"`` (gather the tree in inode order first), ``"plan"`` (read each shard's
            files straight from the tree) or ``"auto"`` (``plan`` when the tree is in the page cache).
        overwrite: Replace a split packed into ``dst`` with other arguments or from another tree.
        progress: Show progress bars on stderr.

    """

    split: str = "train"
    shard_size: int = DEFAULT_SHARD_SIZE
    seed: int = 0
    check: Check | str = Check.HEADER
    resize: int | None = None
    quality: int = 90
    keep_formats: bool = False
    val_fraction: float | None = None
    val_split: str = "val"
    split_file: str | os.PathLike[str] | None = None
    workers: int | None = None
    read_order: ReadOrder | str = ReadOrder.AUTO
    overwrite: bool = False
    progress: bool = False

    def __post_init__(self) -> None:
        for name, value in (("split", self.split), ("val_split", self.val_split)):
            if not value or not set(value) <= SPLIT_CHARS:
                raise ValueError(f"{name} must be lower-case letters, digits and '_', got {value!r}")
        if self.val_fraction is not None:
            if not 0 < self.val_fraction < 1:
                raise ValueError(f"val_fraction must be between 0 and 1 (exclusive), got {self.val_fraction}")
            if self.val_split == self.split:
                raise ValueError(f"val_split must differ from split, both are {self.split!r}")
            if self.split_file is not None:
                raise ValueError("give val_fraction or split_file, not both: a split file names every split")
        try:
            object.__setattr__(self, "read_order", ReadOrder(self.read_order))
        except ValueError:
            allowed = ", ".join(r.value for r in ReadOrder)
            raise ValueError(f"read_order must be one of {allowed}; got {self.read_order!r}") from None
        if self.shard_size < 1:
            raise ValueError(f"shard_size must be a positive number of bytes, got {self.shard_size}")
        try:
            object.__setattr__(self, "check", Check(self.check))
        except ValueError:
            allowed = ", ".join(c.value for c in Check)
            raise ValueError(f"check must be one of {allowed}; got {self.check!r}") from None
        if self.resize is not None and self.resize < 1:
            raise ValueError(f"resize must be a positive number of pixels, got {self.resize}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be between 1 and 100, got {self.quality}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")

    def output_args(self, src: Path) -> dict[str, Any]:
        """The arguments that shape the output, as recorded in the index."""
        check = self.check.value if isinstance(self.check, Check) else self.check
        return {
            "source": str(src),
            "seed": self.seed,
            "shard_size": self.shard_size,
            "check": check,
            "resize": self.resize,
            "quality": self.quality if self.resize is not None else None,
            "keep_formats": self.keep_formats,
            "val_fraction": self.val_fraction,
            "val_split": self.val_split if self.val_fraction is not None else None,
            "split_file": str(Path(self.split_file).resolve()) if self.split_file is not None else None,
        }


@dataclass(frozen=True, kw_only=True)
class PackHooks:
    """Where a destination other than the output directory plugs in (see :mod:`.remote`).

    Attributes:
        stored: Asked about a shard recorded as finished whose file is not in the output directory;
            True when it is stored elsewhere (uploaded), so it counts as done without a re-hash.
        on_shard: Called with the path and record of each shard this run writes, once both are
            committed, in the order they finish.

    """

    stored: Callable[[ShardRecord], bool] = lambda record: False
    on_shard: Callable[[Path, ShardRecord], None] = lambda path, record: None


@dataclass(frozen=True)
class PackResult:
    """What a ``pack`` run did (``dst`` is a URL for a remote destination).

    ``split`` is the first split the run packed, ``splits`` all of them (one unless the tree was
    split); ``read_order`` how the tree was read (``disk`` or ``plan``).
    """

    dst: Path | str
    split: str
    manifest: Manifest
    shards_written: int
    shards_reused: int
    seconds: float
    splits: tuple[str, ...] = ()
    read_order: str = ReadOrder.DISK.value

    @property
    def info(self) -> SplitInfo:
        """The (first) packed split, as recorded in the index."""
        return self.manifest.split(self.split)

    @property
    def infos(self) -> list[SplitInfo]:
        """Every split this run packed, as recorded in the index."""
        return [self.manifest.split(name) for name in self.splits or (self.split,)]


def pack(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    config: PackConfig | None = None,
    *,
    hooks: PackHooks | None = None,
) -> PackResult:
    """Pack the ImageFolder tree ``src`` into WebDataset shards and an index in ``dst``.

    ``dst`` is a local directory; :func:`~imgshards.converter.pack_to_url` packs to a URL.

    Raises:
        SourceError: ``src`` is not a usable ImageFolder tree, or a split of it would be empty.
        SplitFileError: ``config.split_file`` is unusable.
        DestinationError: ``dst`` holds a conflicting pack (other arguments, tree or classes), or
            another ``pack`` is writing the same split there.

    """
    config = config or PackConfig()
    started = time.perf_counter()
    src_path, dst_path = Path(src).resolve(), Path(dst).resolve()
    if dst_path == src_path or src_path in dst_path.parents:
        raise DestinationError(f"destination {dst_path} is inside the source tree {src_path}; choose another")
    if not src_path.is_dir():
        raise SourceError(f"source directory {src_path} does not exist or is not a directory")
    listed = read_split_file(config.split_file) if config.split_file is not None else None
    names = _split_names(config, listed)
    try:
        for name in names:
            (dst_path / STATE_DIR / name).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DestinationError(f"cannot create destination {dst_path}: {e.strerror}") from e
    counter = shared_counter()
    planned: list[int] = []  # the shards' estimated bytes, for a disk-full message
    with contextlib.ExitStack() as locks:
        for name in sorted(names):
            busy = f"another `imgshards pack` is writing split {name!r} into {dst_path}"
            locks.enter_context(_locked(dst_path / STATE_DIR / name / "lock", busy))
        locks.enter_context(explained(dst_path, sorted(names), planned))
        workers = config.workers or default_workers()
        pool = start_pool(workers, {"counter": counter})
        written = reused = 0
        done: list[tuple[Part, list[ShardRecord]]] = []
        try:
            scan = _scan(src_path, pool, config.progress)
            log.info("scanned %d files in %.1f s", len(scan), time.perf_counter() - started)
            _check_classes(dst_path, names, scan)
            parts = _split(scan, config, listed)
            order = choose_read_order(ReadOrder(config.read_order), scan)
            log.info("reading the tree in %s order", order.value)
            for part in parts:
                plan = _plan(part, len(scan), config)
                planned.append(int(estimated_sample_bytes(part.scan.sizes).sum()))
                log.info("planned %d shards of split %s", plan.num_shards, part.name)
                state = dst_path / STATE_DIR / part.name
                _prepare(dst_path, state, config, src_path, plan, part.name)
                n_written, n_reused, records = _write_all(
                    pool, workers, part, plan, dst_path, state, config, counter, hooks or PackHooks(), order
                )
                written, reused = written + n_written, reused + n_reused
                done.append((part, records))
        finally:
            pool.shutdown(cancel_futures=True)
        log.info("wrote %d shards, reused %d, at %.1f s", written, reused, time.perf_counter() - started)
        manifest = _finish(dst_path, config, src_path, scan, done)
    return PackResult(
        dst_path,
        names[0],
        manifest,
        written,
        reused,
        time.perf_counter() - started,
        splits=names,
        read_order=order.value,
    )


def _split_names(config: PackConfig, listed: dict[str, list[str]] | None) -> tuple[str, ...]:
    if listed is not None:
        return tuple(listed)
    if config.val_fraction is not None:
        return (config.split, config.val_split)
    return (config.split,)


def _split(scan: ScanResult, config: PackConfig, listed: dict[str, list[str]] | None) -> list[Part]:
    """The parts of the tree to pack, each a split; refuses an empty one."""
    if listed is not None:
        parts = split_by_file(scan, listed, str(config.split_file))
        empty = [p.name for p in parts if not len(p.scan)]
        if empty:
            raise SplitFileError(
                f"split file {config.split_file} lists no image for split(s) {', '.join(empty)}"
            )
        return parts
    if config.val_fraction is None:
        return whole(config.split, scan)
    parts = split_stratified(scan, (config.split, config.val_split), config.val_fraction, config.seed)
    if not len(parts[1].scan):
        raise SourceError(
            f"--val-fraction {config.val_fraction} leaves split {config.val_split!r} empty: every class of "
            f"{scan.root} has a single image (a class needs two to give one to each split)"
        )
    return parts


def _plan(part: Part, tree_size: int, config: PackConfig) -> Plan:
    """The part's plan; its keys are positions in the whole tree, and its fingerprint covers them."""
    plan = make_plan(part.scan, seed=config.seed, shard_size=config.shard_size)
    if part.whole:
        return plan
    h = hashlib.sha256(plan.fingerprint.encode())
    h.update(part.positions.astype("<i8").tobytes())
    return replace(plan, key_width=max(6, len(str(max(tree_size - 1, 0)))), fingerprint=h.hexdigest())


@contextlib.contextmanager
def _locked(path: Path, busy: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path``; the kernel drops it if the process dies."""
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DestinationError(busy) from None
        yield


def _scan(src: Path, pool: ProcessPoolExecutor, progress: bool) -> ScanResult:
    with tqdm(desc="scan", unit=" classes", disable=not progress, leave=False) as bar:
        files = 0

        def start(classes: int) -> None:
            bar.total = classes
            bar.refresh()

        def advance(_: str, count: int) -> None:
            nonlocal files
            files += count
            bar.set_postfix(files=files, refresh=False)
            bar.update()

        scan = scan_tree(src, executor=pool, on_class=advance, on_classes=start)
        bar.refresh()  # the last count, which tqdm's rate limit may have skipped
        return scan


def _check_classes(dst: Path, splits: tuple[str, ...], scan: ScanResult) -> None:
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


def _prepare(dst: Path, state: Path, config: PackConfig, src: Path, plan: Plan, split: str) -> None:
    """Start a fresh split, continue an interrupted one, or refuse to mix two different ones."""
    wanted = {"args": config.output_args(src), "fingerprint": plan.fingerprint, "shards": plan.num_shards}
    plan_file = state / "plan.json"
    previous = json.loads(plan_file.read_text()) if plan_file.exists() else None
    leftovers = sorted(p.name for p in dst.glob(f"{split}-*.tar"))
    if previous == wanted or (previous is None and not leftovers and not _in_index(dst, split)):
        pass
    elif config.overwrite:
        _clear_split(dst, state, split)
    else:
        raise DestinationError(_conflict(dst, split, previous, wanted, leftovers))
    for stale in dst.glob(f".{split}-*.partial"):
        stale.unlink()
    write_atomic(plan_file, (json.dumps(wanted, indent=1, sort_keys=True) + "\n").encode())


def _in_index(dst: Path, split: str) -> bool:
    try:
        return split in read_manifest(dst).splits
    except ManifestError:
        return False


def _conflict(dst: Path, split: str, previous: dict | None, wanted: dict, leftovers: list[str]) -> str:
    if previous is None:
        what = f"{len(leftovers)} shards of split {split!r} not made by an interrupted run of this command"
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


def _clear_split(dst: Path, state: Path, split: str) -> None:
    for path in [*dst.glob(f"{split}-*.tar"), dst / _rejects_name(split), dst / f"{split}-rejects.jsonl"]:
        path.unlink(missing_ok=True)  # the last: where rejects were written before 0.1.1
    for path in state.iterdir():
        if path.name != "lock":
            path.unlink() if path.is_file() else shutil.rmtree(path)
    if (dst / INDEX_NAME).exists():
        with _locked(dst / STATE_DIR / "index.lock", "another pack is updating the index; retry"):
            manifest = read_manifest(dst)
            splits = {k: v for k, v in manifest.splits.items() if k != split}
            _write_index(dst, Manifest(manifest.classes, splits))


def _shard_name(split: str, i: int) -> str:
    return f"{split}-{i:06d}.tar"


def _rejects_name(split: str) -> str:
    return f"{REJECTS_DIR}/{split}.jsonl"


def _recorded(state: Path, name: str) -> ShardRecord | None:
    """The record of a shard finished by an earlier run, if there is one."""
    record_file = state / f"{name}.json"
    if not record_file.exists():
        return None
    return ShardRecord.from_json(json.loads(record_file.read_text()))


def _write_all(
    pool: ProcessPoolExecutor,
    workers: int,
    part: Part,
    plan: Plan,
    dst: Path,
    state: Path,
    config: PackConfig,
    counter: Any,
    hooks: PackHooks,
    order: ReadOrder,
) -> tuple[int, int, list[ShardRecord]]:
    """Write every shard not already done; check the done ones; return counts and all records."""
    scan, split = part.scan, part.name
    records = _check_done(pool, plan, dst, state, split, hooks)
    for i in changed_shards(pool, scan, plan, records):
        log.warning("files of %s changed since it was packed: writing it again", _shard_name(split, i))
        del records[i]
    todo = [i for i in range(plan.num_shards) if i not in records]
    reused = len(records)
    direct = order is ReadOrder.PLAN
    started = time.perf_counter()
    buckets = {} if direct else _gather(pool, workers, scan, plan, todo, state, split, config, counter)
    if not direct:
        log.info("gathered the files of %d shards in %.1f s", len(todo), time.perf_counter() - started)
    image_format = None if config.keep_formats or config.resize is not None else main_format(scan.paths)

    def make_task(i: int) -> ShardTask:
        idx = plan.shard(i)
        return ShardTask(
            index=i,
            name=_shard_name(split, i),
            dst=str(dst),
            buckets=tuple(sorted(buckets.get(i, ()))),
            paths=scan.paths.take(idx),
            labels=scan.labels[idx],
            keys=part.positions[idx],
            classes=scan.classes,
            key_width=plan.key_width,
            check=Check(config.check),
            resize=config.resize,
            quality=config.quality,
            image_format=image_format,
            src=str(scan.root) if direct else None,
            sizes=scan.sizes[idx] if direct else None,
        )

    tasks = (make_task(i) for i in todo)
    bar = _Bar(f"pack {split}", sum(len(plan.shard(i)) for i in todo), config.progress)
    for task, record in _run(pool, workers, _write_in_worker, tasks, counter, bar):
        write_atomic(state / f"{record.name}.json", json.dumps(record.to_json()).encode())
        records[task.index] = record
        hooks.on_shard(dst / record.name, record)
    shutil.rmtree(state / _BUCKETS, ignore_errors=True)
    return len(todo), reused, [records[i] for i in range(plan.num_shards)]


def _gather(
    pool: ProcessPoolExecutor,
    workers: int,
    scan: ScanResult,
    plan: Plan,
    todo: list[int],
    state: Path,
    split: str,
    config: PackConfig,
    counter: Any,
) -> dict[int, list[str]]:
    """Read the files of the shards in ``todo`` in inode order into buckets; return each shard's."""
    bucket_dir = state / _BUCKETS
    shutil.rmtree(bucket_dir, ignore_errors=True)  # an interrupted run's: its shards are redone whole
    bucket_dir.mkdir()
    if not todo:
        return {}
    shard_of = np.full(len(scan), -1, dtype=np.int64)
    slot_of = np.zeros(len(scan), dtype=np.int64)
    for i in todo:
        idx = plan.shard(i)
        shard_of[idx] = i
        slot_of[idx] = np.arange(len(idx))
    wanted = np.flatnonzero(shard_of >= 0)
    wanted = wanted[np.argsort(scan.inodes[wanted], kind="stable")]
    ends = np.cumsum(scan.sizes[wanted])
    cuts, start = [0], 0
    while start < len(wanted):  # runs of at most _GATHER_FILES files and about _GATHER_BYTES bytes
        base = ends[start - 1] if start else 0
        stop = int(np.searchsorted(ends, base + _GATHER_BYTES, side="right"))
        start = min(max(stop, start + 1), start + _GATHER_FILES, len(wanted))
        cuts.append(start)
    tasks = (
        GatherTask(
            src=str(scan.root),
            buckets=str(bucket_dir),
            paths=scan.paths.take(run),
            sizes=scan.sizes[run],
            shards=shard_of[run],
            slots=slot_of[run],
        )
        for run in (wanted[lo:hi] for lo, hi in itertools.pairwise(cuts))
    )
    buckets: dict[int, list[str]] = {}
    bar = _Bar(f"read {split}", len(wanted), config.progress)
    for _, written in _run(pool, workers, _gather_in_worker, tasks, counter, bar):
        for shard, path in written.items():
            if path not in buckets.setdefault(shard, []):
                buckets[shard].append(path)
    return buckets


@dataclass(frozen=True)
class _Bar:
    desc: str
    total: int
    enabled: bool


def _run(
    pool: ProcessPoolExecutor,
    workers: int,
    fn: Callable[[T], R],
    tasks: Iterator[T],
    counter: Any,
    bar: _Bar,
) -> Iterator[tuple[T, R]]:
    """Run ``fn`` over ``tasks`` in the pool and yield each task with its result as they finish.

    Only a few tasks per worker are queued at a time (each holds its paths). The progress bar shows
    the files the workers count in ``counter``.
    """
    counter.get_obj().value = 0  # no worker is running a task yet
    in_flight: dict[Future[R], T] = {}
    with tqdm(total=bar.total, desc=bar.desc, unit=" img", disable=not bar.enabled, smoothing=0.1) as shown:
        while True:
            for task in tasks:
                in_flight[pool.submit(fn, task)] = task
                if len(in_flight) >= 2 * workers:
                    break
            if not in_flight:
                break
            done, _ = wait(in_flight, timeout=0.25, return_when=FIRST_COMPLETED)
            shown.n = progress(counter)
            shown.refresh()
            for future in done:
                yield in_flight.pop(future), future.result()


def _check_done(
    pool: ProcessPoolExecutor, plan: Plan, dst: Path, state: Path, split: str, hooks: PackHooks
) -> dict[int, ShardRecord]:
    """Records of the shards an earlier run finished that still hash as recorded (or are stored)."""
    pending: dict[Future[str], tuple[int, ShardRecord]] = {}
    done: dict[int, ShardRecord] = {}
    for i in range(plan.num_shards):
        record = _recorded(state, _shard_name(split, i))
        if record is None:
            continue
        if (dst / record.name).exists():
            pending[pool.submit(hash_file, str(dst / record.name))] = (i, record)
        elif hooks.stored(record):
            done[i] = record
    done.update({i: record for future, (i, record) in pending.items() if future.result() == record.sha256})
    return done


def _write_in_worker(task: ShardTask) -> ShardRecord:
    return write_shard(task, worker_state().get("counter"))


def _gather_in_worker(task: GatherTask) -> dict[int, str]:
    return gather(task, worker_state().get("counter"))


def _finish(
    dst: Path, config: PackConfig, src: Path, scan: ScanResult, done: list[tuple[Part, list[ShardRecord]]]
) -> Manifest:
    """Write each split's rejects file, then fold the splits into the index (written last)."""
    (dst / REJECTS_DIR).mkdir(parents=True, exist_ok=True)
    infos: dict[str, SplitInfo] = {}
    for part, records in done:
        rejects: list[Reject] = sorted(
            [*part.rejects, *(r for rec in records for r in rec.rejects)], key=lambda r: r.path
        )
        rejects_name = _rejects_name(part.name)
        lines = "".join(json.dumps(r.to_json(), sort_keys=True) + "\n" for r in rejects)
        write_atomic(dst / rejects_name, lines.encode())
        counts = [0] * len(scan.classes)
        formats: Counter[str] = Counter()
        converted: Counter[str] = Counter()
        for record in records:
            for label, n in record.class_counts.items():
                counts[label] += n
            formats.update(record.formats)
            converted.update(record.converted)
        infos[part.name] = SplitInfo(
            name=part.name,
            shards=tuple(ShardInfo(r.name, r.samples, r.bytes, r.sha256) for r in records),
            class_counts=tuple(counts),
            rejects_total=len(rejects),
            rejects_by_reason=dict(sorted(Counter(r.reason.value for r in rejects).items())),
            rejects_file=rejects_name,
            pack_args=config.output_args(src),
            formats=dict(sorted(formats.items())),
            converted=dict(sorted(converted.items())),
        )
    with _locked(dst / STATE_DIR / "index.lock", "another pack is updating the index; retry"):
        _check_classes(dst, tuple(infos), scan)  # another split may have landed meanwhile
        splits = dict(read_manifest(dst).splits) if (dst / INDEX_NAME).exists() else {}
        splits.update(infos)
        manifest = Manifest(scan.classes, splits)
        _write_index(dst, manifest)
    return manifest


def _write_index(dst: Path, manifest: Manifest) -> None:
    write_atomic(dst / INDEX_NAME, manifest.dumps().encode())
    write_atomic(dst / TIMM_INFO_NAME, (json.dumps(manifest.timm_info(), indent=1) + "\n").encode())
