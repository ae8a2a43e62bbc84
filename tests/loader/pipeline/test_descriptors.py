"""A worker holds a bounded number of shards open and mapped, whatever the split's size (issue 37).

A split of 200 shards is read by DataLoader workers whose soft limit of open files leaves them 48
descriptors (``resource.setrlimit`` in ``worker_init_fn``): every sample arrives, and a thread in each worker
that counts the shard files in ``/proc/self/fd`` and ``/proc/self/maps`` sees no more than
interleave's open runs plus ``read._MAX_MAPS``. Before, a finished run stayed referenced until the
pass ended (its file open, its map alive): the descriptors grew with the shards read, ``EMFILE``
came, and was counted as damage (shards skipped, batches kept coming). Running out of descriptors
is now one :class:`ResourceLimitError` line.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

from imgshards.converter import read_manifest
from imgshards.loader import ResourceLimitError, ShardDataset, make_loader
from imgshards.loader.pipeline import runs as read_stage

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self")

OPEN_RUNS = 32  # interleave's max_open: the runs a worker reads at once


@pytest.fixture(scope="module")
def many_shards(tree_factory, packed_factory) -> Path:
    """800 tiny images in about 200 shards of 4 samples."""
    root = packed_factory(tree_factory(classes=4, per_class=200, seed=5), shard_size=16_000)
    assert len(read_manifest(root).split("train").shards) >= 180
    return root


def shard_files(root: Path) -> tuple[int, int]:
    """This process's open descriptors and mapped regions of shards under ``root`` (not its tables)."""
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since listed
            target = os.readlink(f"/proc/self/fd/{fd}")
            fds += target.startswith(str(root)) and target.endswith(".tar")
    with open("/proc/self/maps") as f:
        maps = sum(1 for line in f if str(root) in line and line.rstrip().endswith(".tar"))
    return fds, maps


class Watch:
    """worker_init_fn: leave the worker ``room`` descriptors, then note the most shard files held at once.

    (The room is counted from what the worker holds as it starts: a DataLoader worker forked from
    pytest inherits its descriptors, a few dozen.)
    """

    def __init__(self, root: Path, out: Path, room: int) -> None:
        self.root, self.out, self.room = root, out, room

    def __call__(self, worker_id: int) -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + self.room, hard))
        most = [0, 0]
        path = self.out / f"worker{worker_id}.json"

        def watch() -> None:
            while True:
                now = shard_files(self.root)
                if now[0] > most[0] or now[1] > most[1]:
                    most[:] = [max(a, b) for a, b in zip(most, now, strict=True)]
                    path.write_text(json.dumps(most))
                time.sleep(0.0005)

        threading.Thread(target=watch, daemon=True).start()


def read_all(root: Path, out: Path, *, room: int, **kw) -> tuple[list[int], list[list[int]]]:
    ds = ShardDataset(root, batch_size=8, transform=torch.nn.Identity(), shuffle_buffer=64, **kw)
    loader = started_by(make_loader(ds, num_workers=2), Watch(root, out, room))
    labels = [label for batch in loader for label in batch.labels.tolist()]
    return labels, [json.loads(p.read_text()) for p in sorted(out.glob("worker*.json"))]


def test_a_split_of_more_shards_than_descriptors_reads_every_sample(many_shards, tmp_path):
    ds = ShardDataset(many_shards, batch_size=8, transform=torch.nn.Identity())
    expected = sorted(label for batch in make_loader(ds, num_workers=0) for label in batch.labels.tolist())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a shard skipped for EMFILE warns: none may
        labels, most = read_all(many_shards, tmp_path, room=48)
    assert sorted(labels) == expected and len(labels) == 800
    assert len(most) == 2
    for fds, maps in most:
        assert 0 < fds <= OPEN_RUNS and maps == 0  # small shards are read, not mapped


def test_mapped_shards_stay_bounded_too(many_shards, tmp_path, monkeypatch):
    # Every shard mapped (the workers fork with this setting): the maps alive are capped, the runs
    # past the cap read their shard, and a finished run's map goes once no view of it is left.
    monkeypatch.setattr(read_stage, "_MAP_AT_LEAST", 0)
    labels, most = read_all(many_shards, tmp_path, room=OPEN_RUNS + read_stage._MAX_MAPS + 16)
    assert len(labels) == 800 and len(most) == 2
    for fds, maps in most:
        assert 0 < maps <= read_stage._MAX_MAPS
        assert fds <= OPEN_RUNS + read_stage._MAX_MAPS


def test_running_out_of_descriptors_is_one_error_not_skipped_shards(many_shards, tmp_path):
    # A soft limit just above what a worker holds before it reads: the first shards opened take
    # the last descriptors. With on_error="skip" (damage is skipped), this still stops at once.
    ds = ShardDataset(many_shards, batch_size=8, on_error="skip")
    loader = make_loader(ds, num_workers=2)  # the loader re-raises a worker's error as its one line
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        with pytest.raises(ResourceLimitError) as e:
            for _ in started_by(loader, Watch(many_shards, tmp_path, 16)):
                pass
    message = str(e.value)
    assert "\n" not in message and "Too many open files" in message and "ulimit -n" in message
    assert not [w for w in told if "skipped" in str(w.message)]


def started_by(loader, init):
    """``loader``, its workers also started by ``init`` (the loader sets its own worker_init_fn)."""

    class Started(type(loader.dataloader)):  # type: ignore[misc]
        def __iter__(self):
            own = self.worker_init_fn
            self.worker_init_fn = functools.partial(_both, own, init)
            return super().__iter__()

    loader.dataloader.__class__ = Started
    return loader


def _both(own, init, worker_id: int) -> None:
    if own is not None:
        own(worker_id)
    init(worker_id)


def test_a_view_of_pages_given_back_still_reads_the_shard(tmp_path, monkeypatch):
    # Pages behind the reader, then all of them at close, go back to the page cache (MADV_DONTNEED):
    # the views handed out before read the same bytes (faulted in again from the file).
    monkeypatch.setattr(read_stage, "_MAP_AT_LEAST", 0)
    monkeypatch.setattr(read_stage, "_KEEP_BEHIND", 4096)
    monkeypatch.setattr(read_stage, "_DROP_EVERY", 8192)
    data = os.urandom(1 << 20)
    path = tmp_path / "blob.tar"
    path.write_bytes(data)
    with open(path, "rb") as f:
        mapped = read_stage.MappedShard.of(f)
    assert mapped is not None
    views = [mapped.read(10_000) for _ in range(100)]
    assert mapped._dropped > 900_000  # most of it given back while read
    mapped.close()
    assert b"".join(bytes(v) for v in views) == data[:1_000_000]
