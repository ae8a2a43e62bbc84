"""``pack``: scan -> split -> plan -> write shards in parallel -> index. Resumable; accounts for every file.

One run packs one split, or several cut from the one tree (``val_fraction``, ``split_file``: see
:mod:`.plan.splits`), sharing one label index. The state of an unfinished split is kept in the
destination (:mod:`.write.destination`). Re-running the same command after a crash checks the finished
shards against their records (and their files against what they were packed from, :mod:`.write.resume`),
writes the rest, and gives output byte-identical to an uninterrupted run. The index is written
last, under a lock, so several splits can be packed into one destination. The arguments are a
:class:`~.config.PackConfig`; the tasks run on an :mod:`.engines.engine` (the local pool, or Ray across
machines), which only runs them: the plan, records, rejects and index stay here, in the driver.
Each split's image sizes, counted in its shards' records, go into the index; a split of large
photos packed as they are also gets a measured estimate of what ``--resize`` would save
(:mod:`.plan.resizehint`, in :attr:`PackResult.hints`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from .config import DEFAULT_SHARD_SIZE, PackConfig
from .engines.engine import Engine, make_engine
from .engines.pool import Progress
from .format.formats import main_format
from .format.imagesizes import SizeStats, size_stats
from .format.manifest import Manifest, ShardInfo, SplitInfo
from .format.tables import TABLES
from .plan.resizehint import ResizeHint, resize_hint
from .plan.shards import Plan, estimated_sample_bytes, shard_name
from .plan.splits import Part, read_split_file
from .plan.tasks import plan_part, shard_task, split_names, split_parts
from .scan.readorder import ReadOrder, choose_read_order
from .scan.tree import Reject, ScanResult, check_source, scan_tree
from .shards.verify import hash_file
from .write.attempts import cut_off
from .write.destination import (
    REJECTS_DIR,
    STATE_DIR,
    check_classes,
    claim,
    prepare,
    recorded,
    rejects_name,
    update_index,
)
from .write.failures import explained
from .write.resume import changed_shards
from .write.safefs import is_regular, make_dirs, remove, write_atomic
from .write.shard import GatherTask, ShardRecord, gather, stored_image, write_shard

__all__ = ["DEFAULT_SHARD_SIZE", "PackConfig", "PackHooks", "PackResult", "check_source", "pack"]

log = logging.getLogger(__name__)

# Gather tasks: runs of the tree in inode order, each read by one worker (see :mod:`.write.shard`).
_BUCKETS = "buckets"
_GATHER_FILES = 1 << 16
_GATHER_BYTES = 256 << 20


@dataclass(frozen=True, kw_only=True)
class PackHooks:
    """Where a destination other than the output directory plugs in (see :mod:`.remote.upload`).

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
    split); ``read_order`` how the tree was read (``disk`` or ``plan``). ``hints`` holds, for each
    split of images much larger than training uses, what ``--resize`` would save (:mod:`.plan.resizehint`).
    """

    dst: Path | str
    split: str
    manifest: Manifest
    shards_written: int
    shards_reused: int
    seconds: float
    splits: tuple[str, ...] = ()
    read_order: str = ReadOrder.DISK.value
    engine: str = "pool"
    nodes: dict[str, int] = field(default_factory=dict)
    retried: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    hints: dict[str, ResizeHint] = field(default_factory=dict)

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
        SourceError: ``src`` is not a usable ImageFolder tree, or a split of it would be empty, or
            its class folders are all split names (:func:`~.scan.tree.split_tree_error`, unless
            ``config.allow_split_names``), or (``config.strict``) it looks like the wrong folder
            (:func:`~.scan.tree.tree_warnings`).
        SplitFileError: ``config.split_file`` is unusable.
        DestinationError: ``dst`` holds a conflicting pack (other arguments, tree or classes), or
            another ``pack`` is writing the same split there.

    """
    config = config or PackConfig()
    started = time.perf_counter()
    suspicious = check_source(src, dst, config)
    src_path, dst_path = Path(src).resolve(), Path(dst).resolve()
    listed = read_split_file(config.split_file) if config.split_file is not None else None
    names = split_names(config, listed)
    planned: list[int] = []  # the shards' estimated bytes, for a disk-full message
    with contextlib.ExitStack() as locks:
        locks.enter_context(explained(dst_path, sorted(names), planned))
        locks.enter_context(claim(dst_path, names))  # a refused run leaves no lock behind
        engine = make_engine(config.engine, workers=config.workers, ray_address=config.ray_address)
        written = reused = 0
        done: list[tuple[Part, list[ShardRecord]]] = []
        nodes: Counter[str] = Counter()
        retried: list[str] = []
        try:
            scan = _scan(src_path, engine.executor(), config.progress)
            log.info("scanned %d files in %.1f s", len(scan), time.perf_counter() - started)
            check_classes(dst_path, names, scan)
            parts = split_parts(scan, config, listed)
            # The disk-order gather reads the tree on one host: on a cluster each task reads its files.
            wanted = ReadOrder(config.read_order) if engine.gathers else ReadOrder.PLAN
            order = choose_read_order(wanted, scan)
            log.info("reading the tree in %s order", order.value)
            for part in parts:
                plan = plan_part(part, len(scan), config)
                planned.append(int(estimated_sample_bytes(part.scan.sizes).sum()))
                log.info("planned %d shards of split %s", plan.num_shards, part.name)
                state = dst_path / STATE_DIR / part.name
                prepare(dst_path, state, config.output_args(src_path), config.overwrite, plan, part.name)
                n_written, n_reused, records = _write_all(
                    engine, part, plan, dst_path, state, config, hooks or PackHooks(), order, nodes
                )
                written, reused = written + n_written, reused + n_reused
                retried += cut_off(dst_path, part.name)
                done.append((part, records))
            hints = _hints(config, done, engine.executor())
        finally:
            engine.close()
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
        warnings=suspicious,
        engine=engine.name,
        nodes=dict(sorted(nodes.items())),
        retried=tuple(retried),
        hints=hints,
    )


def _scan(src: Path, pool: Executor, progress: bool) -> ScanResult:
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


def _write_all(
    engine: Engine,
    part: Part,
    plan: Plan,
    dst: Path,
    state: Path,
    config: PackConfig,
    hooks: PackHooks,
    order: ReadOrder,
    nodes: Counter[str],
) -> tuple[int, int, list[ShardRecord]]:
    """Write every shard not already done; check the done ones; return counts and all records.

    ``nodes`` is counted up by the shards each node writes.
    """
    scan, split = part.scan, part.name
    records = _check_done(engine.executor(), plan, dst, state, split, hooks)
    for i in changed_shards(engine.executor(), scan, plan, records):
        log.warning("files of %s changed since it was packed: writing it again", shard_name(split, i))
        del records[i]
    todo = [i for i in range(plan.num_shards) if i not in records]
    reused = len(records)
    direct = order is ReadOrder.PLAN
    started = time.perf_counter()
    buckets = {} if direct else _gather(engine, scan, plan, todo, state, split, config)
    if not direct:
        log.info("gathered the files of %d shards in %.1f s", len(todo), time.perf_counter() - started)
    image_format = _image_format(config, scan)

    tasks = (
        shard_task(part, plan, i, dst, config, image_format, None if direct else buckets.get(i, []))
        for i in todo
    )
    bar = Progress(f"pack {split}", sum(len(plan.shard(i)) for i in todo), config.progress)
    recoded = config.resize is not None or image_format is not None  # bytes that depend on the codecs
    for task, record, node in engine.map(write_shard, tasks, bar, same_codecs=recoded):
        write_atomic(state / f"{record.name}.json", json.dumps(record.to_json()).encode(), root=dst)
        records[task.index] = record
        nodes[node] += 1
        hooks.on_shard(dst / record.name, record)
    remove(state / _BUCKETS, root=dst)
    return len(todo), reused, [records[i] for i in range(plan.num_shards)]


def _image_format(config: PackConfig, scan: ScanResult) -> str | None:
    """The split's one image format; ``None``: each image keeps its own (or ``--resize`` makes JPEGs)."""
    return None if config.keep_formats or config.resize is not None else main_format(scan.paths)


def _sizes(records: list[ShardRecord]) -> SizeStats | None:
    """The split's image sizes from its shards' records; unknown where a record is from before sizes."""
    counts = [record.sizes for record in records]
    return None if None in counts else size_stats(c for c in counts if c is not None)


def _hints(
    config: PackConfig, done: list[tuple[Part, list[ShardRecord]]], pool: Executor
) -> dict[str, ResizeHint]:
    """What ``--resize`` would save, measured on each split of large images (see :mod:`.plan.resizehint`)."""
    hints = {}
    for part, records in done:
        started = time.perf_counter()
        hint = resize_hint(
            part.scan,
            _sizes(records),
            store=stored_image,  # the writer's re-encode: what --resize would store
            resize=config.resize,
            image_format=_image_format(config, part.scan),
            max_pixels=config.max_pixels,
            executor=pool,
        )
        if hint is not None:
            log.info("timed --resize on %d images in %.1f s", hint.sampled, time.perf_counter() - started)
            hints[part.name] = hint
    return hints


def _gather(
    engine: Engine,
    scan: ScanResult,
    plan: Plan,
    todo: list[int],
    state: Path,
    split: str,
    config: PackConfig,
) -> dict[int, list[str]]:
    """Read the files of the shards in ``todo`` in inode order into buckets; return each shard's."""
    bucket_dir = state / _BUCKETS
    dst = state.parent.parent
    remove(bucket_dir, root=dst)  # an interrupted run's: its shards are redone whole
    make_dirs(dst, bucket_dir.relative_to(dst))
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
            dst=str(dst),
        )
        for run in (wanted[lo:hi] for lo, hi in itertools.pairwise(cuts))
    )
    buckets: dict[int, list[str]] = {}
    bar = Progress(f"read {split}", len(wanted), config.progress)
    for _, written, _node in engine.map(gather, tasks, bar):
        for shard, path in written.items():
            if path not in buckets.setdefault(shard, []):
                buckets[shard].append(path)
    return buckets


def _check_done(
    pool: Executor, plan: Plan, dst: Path, state: Path, split: str, hooks: PackHooks
) -> dict[int, ShardRecord]:
    """Records of the shards an earlier run finished that still hash as recorded (or are stored)."""
    pending: dict[Future[str], tuple[int, ShardRecord]] = {}
    done: dict[int, ShardRecord] = {}
    for i in range(plan.num_shards):
        record = recorded(dst, state, shard_name(split, i))
        if record is None:
            continue
        if is_regular(dst / record.name):  # a link planted at a shard's name is not a finished shard
            pending[pool.submit(hash_file, str(dst / record.name))] = (i, record)
        elif hooks.stored(record):
            done[i] = record
    done.update({i: record for future, (i, record) in pending.items() if future.result() == record.sha256})
    return done


def _finish(
    dst: Path, config: PackConfig, src: Path, scan: ScanResult, done: list[tuple[Part, list[ShardRecord]]]
) -> Manifest:
    """Write each split's rejects file, then fold the splits into the index (written last)."""
    make_dirs(dst, REJECTS_DIR)
    infos: dict[str, SplitInfo] = {}
    for part, records in done:
        rejects: list[Reject] = sorted(
            [*part.rejects, *(r for rec in records for r in rec.rejects)], key=lambda r: r.path
        )
        rejects_file = rejects_name(part.name)
        lines = "".join(json.dumps(r.to_json(), sort_keys=True) + "\n" for r in rejects)
        write_atomic(dst / rejects_file, lines.encode(), root=dst)
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
            shards=tuple(_shard_info(r) for r in records),  # its tables as files: update_index
            class_counts=tuple(counts),
            rejects_total=len(rejects),
            rejects_by_reason=dict(sorted(Counter(r.reason.value for r in rejects).items())),
            rejects_file=rejects_file,
            pack_args=config.output_args(src),
            formats=dict(sorted(formats.items())),
            converted=dict(sorted(converted.items())),
            image_sizes=_sizes(records),
        )

    def merged(current: Manifest | None) -> Manifest:
        check_classes(dst, tuple(infos), scan, current)  # another split may have landed meanwhile
        return Manifest(scan.classes, {**(current.splits if current else {}), **infos})

    manifest = update_index(dst, merged)
    assert manifest is not None  # merged always gives one
    return manifest


def _shard_info(record: ShardRecord) -> ShardInfo:
    """A shard's index entry from its record: its counts, digest and tables."""
    tables = {table: getattr(record, table) for table in TABLES}
    return ShardInfo(record.name, record.samples, record.bytes, record.sha256, **tables)
