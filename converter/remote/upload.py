"""Pack to a URL and verify a dataset at a URL (``s3://``, ``gs://``, any fsspec file system).

``pack_to_url`` runs the ordinary :func:`~.pack.pack` into a local *staging* directory and uploads
each shard as soon as it is committed there (then deletes the local copy: staging holds the split's
images once, read from the tree in disk order, then only the shards in flight). The remote layout
is the local one, the pack state included::

    URL/index.json  URL/_info.json  URL/{split}-000000.tar ...  URL/.imgshards/rejects/{split}.jsonl
    URL/.imgshards/{split}/plan.json  URL/.imgshards/{split}/{split}-000000.tar.json ...

Order of the writes, so that no reader ever follows the index to a shard that is not whole:

1. ``plan.json`` (after removing the records of a different, earlier plan);
2. each shard as it is committed locally, then its record: a record on the remote marks its shard
   as uploaded whole;
3. once every shard is up: shards of the split that the plan no longer names are removed, then the
   rejects file, the split's table files (index format 2; those of other splits of a format-1
   index too, written from that index), ``_info.json``, and ``index.json`` last; then the table
   files the index no longer names are removed (:func:`~..write.indexurl.put_index`).

Uploads are atomic: an object store (S3, GCS, Azure) makes a PUT (multipart included) visible whole
under its name or not at all; on other file systems a file is uploaded under a hidden temporary
name, then moved.

Resume: a re-run first copies the remote ``index.json``, plan and records into staging, so ``pack``
sees the earlier run's state: a shard with a remote record and an object of the recorded size is
done (neither re-written nor re-uploaded); one written to a kept staging directory but not
uploaded is hashed there and uploaded. Pack splits into one URL one after the other: there is no
lock on a remote destination (the last index written would drop a split packed meanwhile, except
that the index is re-read and merged just before it is written). fsspec is imported by these
functions only; ``import imgshards.converter`` does not need it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

from ..config import PackConfig
from ..format.errors import DestinationError, ImgshardsError, ManifestError, SourceError
from ..format.locate import redact_url, shown_cause
from ..format.manifest import INDEX_NAME, Manifest, ShardInfo, TableFile, read_manifest
from ..format.remotefs import DEFAULT_TIMEOUT, Remote, one_line, with_timeouts
from ..format.tablefiles import SplitTables
from ..pack import PackHooks, PackResult, pack
from ..scan.tree import split_tree_error, tree_warnings
from ..shards.verify import (
    VerifyReport,
    build_report,
    check_shard_stream,
    check_table_stream,
    shard_entries,
    shard_jobs,
    table_jobs,
    table_problem,
    usable_tables,
)
from ..write.destination import STATE_DIR
from ..write.indexurl import put_index
from ..write.safefs import make_dirs, remove, write_atomic
from ..write.shard import ShardRecord
from ..write.tablefiles import index_to_write

__all__ = ["pack_to_url", "verify_url"]

_UPLOAD_THREADS = 4
_READ_BLOCK = 8 << 20


def pack_to_url(
    src: str | os.PathLike[str],
    url: str,
    config: PackConfig | None = None,
    *,
    storage_options: Mapping[str, Any] | None = None,
    staging: str | os.PathLike[str] | None = None,
) -> PackResult:
    """Pack the ImageFolder tree ``src`` into shards and an index at ``url``, uploading as it goes.

    Args:
        src: The ImageFolder tree.
        url: Destination, any fsspec URL (``s3://bucket/prefix``...).
        config: How to pack, as for :func:`~imgshards.converter.pack`.
        storage_options: Options of the destination's fsspec file system (endpoint, credentials).
        staging: Local directory where shards are written before upload; default a temporary
            directory, removed at the end. Needs room for the split's images (gathered there in disk
            order before the shards are written). Required on Ray: a directory every node sees.

    Raises:
        SourceError: ``src`` is not a usable ImageFolder tree.
        DestinationError: ``url`` cannot be reached or used (no such bucket, no credentials, no
            access: checked first, in seconds), holds a conflicting pack, or an upload kept failing.

    """
    config = config or PackConfig()
    if config.val_fraction is not None or config.split_file is not None:
        raise DestinationError(
            f"cannot pack several splits into a URL ({redact_url(url)}) in one run yet: pack into a local "
            "directory and upload it, or split the tree and pack each split with --split"
        )
    if config.engine == "ray" and staging is None:
        raise DestinationError(
            f"--engine ray with a URL ({redact_url(url)}) needs --staging DIR, one every node sees"
        )
    shown = redact_url(url)
    # Both refusals come before the network (the check's first call).
    if not config.allow_split_names and (refusal := split_tree_error(src, dst=shown)):
        raise SourceError(f"refused: {refusal}")
    if config.strict and (suspicious := tree_warnings(src, dst=shown)):
        raise SourceError(f"refused (strict): {suspicious[0]}")
    # Every request of the pack waits at most DEFAULT_TIMEOUT on the server, then is retried.
    remote = Remote(url, with_timeouts(url, storage_options, DEFAULT_TIMEOUT))
    remote.check()  # in a second or two, before the tree is read: unreachable, no bucket, no access
    own_staging = staging is None
    stage = Path(tempfile.mkdtemp(prefix="imgshards-pack-")) if staging is None else Path(staging)
    stage.mkdir(parents=True, exist_ok=True)
    try:
        with _start_upload(remote, stage, config) as uploader:
            try:
                result = pack(
                    src, stage, config, hooks=PackHooks(stored=uploader.stored, on_shard=uploader.upload)
                )
            except DestinationError as e:  # name the URL, not the staging directory
                raise DestinationError(str(e).replace(str(stage.resolve()), url)) from None
            manifest = uploader.finish(result)
    finally:
        if own_staging:
            shutil.rmtree(stage, ignore_errors=True)
    return replace(
        result, dst=remote.url, manifest=manifest, warnings=tree_warnings(src, dst=redact_url(url))
    )


def verify_url(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    splits: list[str] | None = None,
    workers: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> VerifyReport:
    """Like :func:`~imgshards.converter.shards.verify`, for a dataset at a URL: every shard is streamed once.

    Its table files (index format 2) are streamed once too, before the shards; each shard's
    entries are fetched by ranges of them, as the loader fetches them. ``timeout``: seconds a
    request may wait for the server, to connect or for more of its answer
    (:func:`~.format.remotefs.with_timeouts`; a timeout set in ``storage_options`` wins).

    Raises:
        ManifestError: the index is missing or unreadable.
        DestinationError: a shard or table could not be read for a reason of the network or the
            server (it stalled past ``timeout``, broke the connection, answered 5xx): nothing is said
            about the data, so the report is not made. A missing shard is a problem of the report.

    """
    options = with_timeouts(url, storage_options, timeout)
    remote = Remote(url, options)
    manifest = read_manifest(url, storage_options=options)
    jobs = shard_jobs(manifest, splits)
    names = sorted(set(splits or manifest.splits))
    num_classes = len(manifest.classes)
    files = table_jobs(manifest, names)
    local = threading.local()  # a SplitTables keeps a cache of its own: one a thread

    def fetch(entry: TableFile, lo: int, hi: int) -> bytes:
        with _read_shard(remote, entry.name, timeout, start=lo, end=hi) as f:
            return f.read()

    def check_file(job: tuple[str, TableFile]) -> list[str]:  # read as a shard is: no listing needed
        return check_table_stream(partial(_read_shard, remote, job[1].name, timeout), job[1])

    def check(job: tuple[str, int, ShardInfo]) -> tuple[list[str], Counter[int]]:
        split, s, shard = job
        if not hasattr(local, "tables"):
            local.tables = {
                name: SplitTables(manifest.split(name), num_classes, fetch=fetch, where=remote.shown)
                for name in names
            }
        entries, told = shard_entries(local.tables[split], s, usable[split])
        opener = partial(_read_shard, remote, shard.name, timeout)
        labels = manifest.split(split).labels
        problems, found = check_shard_stream(
            opener, shard, num_classes, labels, manifest.class_to_idx, entries
        )
        return told + problems, found

    # Threads: the work is waiting on the network and hashing, which releases the GIL.
    with ThreadPoolExecutor(min(workers or 8, max(1, len(jobs) + len(files)))) as pool:
        try:
            bad = [
                table_problem(manifest, split, entry, p)
                for (split, entry), found in zip(files, pool.map(check_file, files), strict=True)
                for p in found
            ]
            tables = {name: SplitTables(manifest.split(name), num_classes, fetch=fetch) for name in names}
            usable = {
                name: usable_tables(tables[name], (p.shard for p in bad if p.split == name)) for name in names
            }
            at = [(name, s) for name in names for s in range(len(manifest.split(name).shards))]
            work = [(split, s, shard) for (split, s), (_, shard) in zip(at, jobs, strict=True)]
            return build_report(manifest, jobs, pool.map(check, work), (len(files), bad))
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)  # the shards not started yet are not read
            raise


@contextlib.contextmanager
def _read_shard(
    remote: Remote, name: str, timeout: float, *, start: int | None = None, end: int | None = None
) -> Iterator[BinaryIO]:
    """Open shard or table file ``name`` at the URL; an error of the network or server is a DestinationError.

    A missing or forbidden shard stays a ``FileNotFoundError`` / ``PermissionError`` (the data's
    problem, which the report tells); a timeout, a reset or a 5xx says nothing about the data.
    ``start``, ``end``: only those bytes of it (a table's range), read into memory.
    """
    try:
        if start is not None:
            yield io.BytesIO(remote.fs.cat_file(remote.path(name), start=start, end=end))
            return
        with remote.fs.open(remote.path(name), "rb", block_size=_READ_BLOCK) as f:
            yield f
    except (FileNotFoundError, PermissionError, ImgshardsError):
        raise
    except Exception as e:  # the file system's own errors (aiohttp, botocore...), timeouts
        raise DestinationError(
            f"cannot read {remote.shown}/{name}: {type(e).__name__}: {one_line(e) or 'no answer'} "
            f"(a request waits {timeout:g} s for the server: --timeout); check the network and the "
            "server, then run it again"
        ) from shown_cause(e)


def _start_upload(remote: Remote, stage: Path, config: PackConfig) -> _Uploader:
    """Start the uploader, which reads the destination's state first.

    An error of the file system there (the network went away since :meth:`Remote.check`) becomes
    one line, not a traceback.
    """
    try:
        return _Uploader(remote, stage, config)
    except ImgshardsError:
        raise
    except Exception as e:  # botocore, aiohttp...: the file system's own errors
        raise DestinationError(
            f"cannot read the state of {remote.shown}: {type(e).__name__}: {one_line(e)}; "
            "check the network, then run the same command again"
        ) from shown_cause(e)


class _Uploader:
    """Mirrors the remote pack state into staging, uploads shards as pack commits them, then the index."""

    def __init__(self, remote: Remote, stage: Path, config: PackConfig) -> None:
        self.remote, self.stage, self.split = remote, stage, config.split
        self.state = f"{STATE_DIR}/{config.split}"
        self.pool = ThreadPoolExecutor(_UPLOAD_THREADS, thread_name_prefix="imgshards-upload")
        self.pending: set[Future[None]] = set()
        self.started = False
        self.sizes = remote.sizes()
        records = [n for n in remote.sizes(self.state) if n.endswith(".json") and n != "plan.json"]
        self.records = {n.removesuffix(".json") for n in records}
        self.remote_plan = remote.read(f"{self.state}/plan.json")
        self.remote_index = remote.read(INDEX_NAME)
        self._mirror(config, records)

    def __enter__(self) -> _Uploader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    # ---- before pack --------------------------------------------------------------------------

    def _mirror(self, config: PackConfig, records: list[str]) -> None:
        """Copy the remote index, plan and records into staging, where pack reads its state."""
        state = self.stage / STATE_DIR / self.split
        make_dirs(self.stage, f"{STATE_DIR}/{self.split}")  # in staging too, nothing through a link
        ours = sorted(n for n in self.sizes if n.startswith(f"{self.split}-") and n.endswith(".tar"))
        known = self.remote_plan is not None or (
            self.remote_index is not None and self.split in _splits(self.remote_index)
        )
        if ours and not known and not config.overwrite:
            raise DestinationError(
                f"{self.remote.shown} already holds {len(ours)} shard{'s' if len(ours) != 1 else ''} of "
                f"split {self.split!r} not made by an interrupted run of this command: to read them as a "
                f"dataset, run `imgshards index {self.remote.shown}`; to pack, choose another destination "
                "(--overwrite would delete them)"
            )
        if self.remote_index is None:
            remove(self.stage / INDEX_NAME, root=self.stage)
        else:
            write_atomic(self.stage / INDEX_NAME, self.remote_index, root=self.stage)
        if self.remote_plan is not None:
            write_atomic(state / "plan.json", self.remote_plan, root=self.stage)
        paths = [self.remote.path(f"{self.state}/{n}") for n in records]
        for path, data in (self.remote.fs.cat(paths, on_error="omit") if paths else {}).items():
            write_atomic(state / path.rsplit("/", 1)[-1], data, root=self.stage)

    def stored(self, record: ShardRecord) -> bool:
        """Whether the shard of ``record`` is uploaded whole (pack skips it)."""
        return self._stored(record.name, record.bytes)

    def _stored(self, name: str, size: int) -> bool:
        return name in self.records and self.sizes.get(name) == size

    # ---- while pack runs ----------------------------------------------------------------------

    def upload(self, path: Path, record: ShardRecord) -> None:
        """Queue a committed shard for upload; wait while too many are queued (staging stays small)."""
        self._start()
        self._reap(block=len(self.pending) >= 2 * _UPLOAD_THREADS)
        self.pending.add(self.pool.submit(self._upload_shard, path, record))

    def _start(self) -> None:
        """Before the first shard goes up: a new plan replaces the old records, and the index."""
        if self.started:
            return
        self.started = True
        plan = (self.stage / self.state / "plan.json").read_bytes()
        if plan != self.remote_plan:
            self.remote.remove(sorted(f"{self.state}/{n}.json" for n in self.records))
            self.records.clear()
            index = self.stage / INDEX_NAME
            if index.exists() and index.read_bytes() != self.remote_index:  # --overwrite dropped the split
                put_index(self.remote, read_manifest(self.stage), self.stage)
            self.remote.put_bytes(f"{self.state}/plan.json", plan)

    def _upload_shard(self, path: Path, record: ShardRecord) -> None:
        self.remote.put_file(path, record.name)
        size = int(self.remote.fs.info(self.remote.path(record.name))["size"])
        if size != record.bytes:
            raise DestinationError(
                f"uploaded {record.name} to {self.remote.shown} but it is {size} bytes there, not "
                f"{record.bytes}; run the same command again"
            )
        self.remote.put_bytes(f"{self.state}/{record.name}.json", json.dumps(record.to_json()).encode())
        self.sizes[record.name] = record.bytes
        self.records.add(record.name)
        path.unlink()

    def _reap(self, *, block: bool) -> None:
        if block:
            done, _ = wait(self.pending, return_when=FIRST_COMPLETED)
        else:
            done = {f for f in self.pending if f.done()}
        for future in done:
            self.pending.discard(future)
            future.result()  # an upload that kept failing stops the pack here

    # ---- after pack ---------------------------------------------------------------------------

    def finish(self, result: PackResult) -> Manifest:
        """Upload what is left, remove shards the plan no longer names, write the index last."""
        self._start()
        while self.pending:
            self._reap(block=True)
        for shard in result.info.shards:  # written to a kept staging directory by an earlier run
            local = self.stage / shard.name
            if local.exists() and shard.name not in self.records:
                record = ShardRecord.from_json(
                    json.loads((self.stage / self.state / f"{shard.name}.json").read_text())
                )
                self.pending.add(self.pool.submit(self._upload_shard, local, record))
        while self.pending:
            self._reap(block=True)
        missing = [s.name for s in result.info.shards if not self._stored(s.name, s.bytes)]
        if missing:
            raise DestinationError(
                f"shards {missing[:3]} of {self.remote.shown} are neither uploaded nor in staging; "
                "run the same command again"
            )
        names = {s.name for s in result.info.shards}
        stale = [n for n in self.remote.sizes() if _is_shard_of(n, self.split) and n not in names]
        records = self.remote.sizes(self.state)
        self.remote.remove(stale + [f"{self.state}/{n}.json" for n in stale if f"{n}.json" in records])
        rejects = result.info.rejects_file
        if rejects:
            self.remote.put_file(self.stage / rejects, rejects)
        # Other splits of a format-1 index at the URL are written as format 2 too, in staging.
        manifest = index_to_write(
            self.stage,
            self._merged(result.manifest),
            f"the index of {self.remote.shown}",
            safe_root=self.stage,
        )
        put_index(self.remote, manifest, self.stage)
        return manifest

    def _merged(self, ours: Manifest) -> Manifest:
        """Return this split folded into the remote index as it is now (another split may have landed)."""
        text = self.remote.read(INDEX_NAME)
        if text is None:
            return Manifest(ours.classes, {self.split: ours.split(self.split)})
        try:
            current = Manifest.from_json(json.loads(text), where=f"{self.remote.shown}/{INDEX_NAME}")
        except (ManifestError, json.JSONDecodeError):
            current = Manifest(ours.classes, {})
        others = {k: v for k, v in current.splits.items() if k != self.split}
        if others and current.classes != ours.classes:
            raise DestinationError(
                f"split(s) {sorted(others)} packed into {self.remote.shown} meanwhile have other classes; "
                f"split {self.split!r} is uploaded but not in the index: pack into another destination"
            )
        return Manifest(ours.classes, {**others, self.split: ours.split(self.split)})


def _is_shard_of(name: str, split: str) -> bool:
    number = name.removeprefix(f"{split}-").removesuffix(".tar")
    return name.startswith(f"{split}-") and name.endswith(".tar") and number.isdigit()


def _splits(index: bytes) -> set[str]:
    try:
        return set(json.loads(index).get("splits") or {})
    except (json.JSONDecodeError, AttributeError):
        return set()
