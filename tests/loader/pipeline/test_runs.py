"""Local shards read through a memory map: images as views of the page cache, the same samples.

A pass with no user stage reads a local shard of at least ``_MAP_AT_LEAST`` bytes through
``MappedShard``: its images are ``memoryview``s of the map, not copies. It must give exactly the
batches that reading the file gives, hand a user's stage ``bytes``, and let go of every map (and its
file descriptor) once its samples are gone. The test shards are small, so the tests lower the
threshold.
"""

from __future__ import annotations

import gc
import os
import sys

import pytest
import torch
import webdataset as wds

from imgshards.loader import ShardDataset, make_loader
from imgshards.loader.epoch.position import PassPosition
from imgshards.loader.pipeline import passes
from imgshards.loader.pipeline import runs as read_stage
from imgshards.loader.pipeline.runs import MappedShard, read_runs


@pytest.fixture
def map_every_shard(monkeypatch):
    monkeypatch.setattr(read_stage, "_MAP_AT_LEAST", 0)


@pytest.fixture
def map_no_shard(monkeypatch):
    monkeypatch.setattr(read_stage, "_MAP_AT_LEAST", 1 << 62)


def runs(root, *, views: bool, told: list[str] | None = None) -> list[list]:
    ds = ShardDataset(root)
    segments = list(passes.plan(ds.spec, ds.part, PassPosition(0, (), 0, 0, 1)).segments)
    on_truncated = told.append if told is not None else print
    out = read_runs(segments, ds.part.reader, on_truncated=on_truncated, on_unreadable=None, views=views)
    return [list(run) for run in out]


def test_a_shard_cut_short_is_reported_the_same_mapped_or_read(packed_copy, map_every_shard):
    shard = sorted(packed_copy.glob("train-*.tar"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2 + 100])  # cut inside a member
    told_mapped: list[str] = []
    told_read: list[str] = []
    with pytest.warns(RuntimeWarning, match="truncated or replaced since it was packed"):
        mapped = runs(packed_copy, views=True, told=told_mapped)
    with pytest.warns(RuntimeWarning, match="truncated or replaced since it was packed"):
        read = runs(packed_copy, views=False, told=told_read)
    assert [[(s.key, s.data) for s in r] for r in mapped] == [[(s.key, s.data) for s in r] for r in read]
    assert told_mapped == told_read and len(told_read) >= 1 and shard.name in told_read[0]


def test_a_mapped_run_reads_what_the_file_gives(packed_many, map_every_shard):
    mapped, read = runs(packed_many, views=True), runs(packed_many, views=False)
    assert [len(r) for r in mapped] == [len(r) for r in read] and sum(map(len, read)) > 0
    views = 0
    for a, b in zip((s for r in mapped for s in r), (s for r in read for s in r), strict=True):
        assert (a.key, a.label, a.ext, a.shard) == (b.key, b.label, b.ext, b.shard)
        assert isinstance(b[b.ext], bytes)
        views += isinstance(a[a.ext], memoryview)
        assert isinstance(a[a.ext], memoryview) == (len(b[b.ext]) >= read_stage._COPY_BELOW)
        assert a.data == b.data  # RawSample.data: bytes either way
        assert isinstance(a["cls"], bytes) and a["cls"] == b["cls"]  # a label is copied out
    assert views > 0


def batches(root, **kw) -> list[tuple[str, list[int]]]:
    ds = ShardDataset(root, batch_size=5, seed=1, **kw)
    ds.set_epoch(2)
    return [(hash_batch(images), labels.tolist()) for images, labels in make_loader(ds, num_workers=2)]


def hash_batch(images: torch.Tensor) -> str:
    import hashlib

    return hashlib.sha256(images.contiguous().numpy().tobytes()).hexdigest()


def test_a_loader_on_mapped_shards_yields_the_same_batches(packed_many, monkeypatch):
    monkeypatch.setattr(read_stage, "_MAP_AT_LEAST", 1 << 62)
    read = batches(packed_many)
    monkeypatch.setattr(read_stage, "_MAP_AT_LEAST", 0)
    assert batches(packed_many) == read and len(read) > 3


def test_a_users_stages_see_bytes(packed_many, map_every_shard):
    seen: set[type] = set()

    def note(sample):
        seen.add(type(sample[sample.ext] if hasattr(sample, "ext") else sample["jpg"]))
        return sample

    for kw in ({"raw_stages": [wds.map(note)]}, {"image_stages": [wds.map(note)]}):
        ds = ShardDataset(packed_many, batch_size=8, **kw)
        for _ in ds:
            pass
    assert seen == {bytes}


def shard_descriptors(root) -> list[str]:
    fds = f"/proc/{os.getpid()}/fd"
    found = []
    for fd in os.listdir(fds):
        try:
            target = os.readlink(f"{fds}/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            found.append(target)
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/fd")
def test_every_map_is_let_go_with_its_samples(packed_many, map_every_shard):
    ds = ShardDataset(packed_many, batch_size=8)
    plan_runs = runs(packed_many, views=True)  # views held: their maps stay open
    assert shard_descriptors(packed_many)
    del plan_runs
    gc.collect()
    assert shard_descriptors(packed_many) == []
    for _ in ds:  # a whole pass, in this process
        pass
    gc.collect()
    assert shard_descriptors(packed_many) == []


def test_a_small_shard_is_read_not_mapped(packed_many, tmp_path):
    shard = next(iter(sorted(packed_many.glob("*.tar"))))
    assert shard.stat().st_size < read_stage._MAP_AT_LEAST
    with open(shard, "rb") as f:
        assert MappedShard.of(f) is None
        assert not f.closed  # still the caller's to read


def test_a_mapped_shard_reads_seeks_and_ends_as_a_file_does(tmp_path, map_every_shard):
    data = bytes(range(256)) * 40  # 10,240 bytes
    path = tmp_path / "blob.tar"
    path.write_bytes(data)
    with open(path, "rb") as f:
        mapped = MappedShard.of(f)
        assert mapped is not None and f.closed
    with mapped:
        head = mapped.read(512)
        assert isinstance(head, bytes) and head == data[:512]
        body = mapped.read(4000)
        assert isinstance(body, memoryview) and body == data[512:4512]
        assert mapped.seek(100, os.SEEK_CUR) == 4612 == mapped.tell()
        assert mapped.seek(0, os.SEEK_END) == len(data)
        assert mapped.read(512) == b""
        mapped.seek(len(data) - 10)
        assert mapped.read(512) == data[-10:]  # cut short at the end, as a file read is
    assert body.tobytes() == data[512:4512]  # a view outlives the reader that handed it out
