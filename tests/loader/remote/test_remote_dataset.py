"""ShardDataset on remote shards (moto S3 and HTTP servers on 127.0.0.1): workers, cache, faults."""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from pathlib import Path

import fsspec
import pytest

from imgshards.converter import ManifestError, PackConfig, pack_to_url, read_manifest
from imgshards.loader import (
    MixedDataset,
    RetryPolicy,
    ShardDataset,
    ShardReadError,
    ShardSource,
    make_loader,
)

from .conftest import SIZE, pixel_hash

CHUNK = 8192  # several requests per ~30 kB shard
FAST_RETRY = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.02)


def epoch_keys(dataset: ShardDataset, key_of: dict[str, str], workers: int) -> Counter[str]:
    keys: Counter[str] = Counter()
    for images, _ in make_loader(dataset, num_workers=workers):
        keys.update(key_of[pixel_hash(image)] for image in images)
    return keys


def all_keys(key_of: dict[str, str]) -> Counter[str]:
    return Counter(key_of.values())


def eval_dataset(source, **kwargs) -> ShardDataset:
    return ShardDataset(source, mode="eval", transform="eval", image_size=SIZE, batch_size=8, **kwargs)


def test_streams_from_s3_through_workers(s3, remote_tree, key_of):
    bucket, options = s3
    url = f"{bucket}/stream"
    pack_to_url(remote_tree, url, PackConfig(shard_size=30_000, workers=2), storage_options=options)
    dataset = eval_dataset(url, storage_options=options)
    assert dataset.root == url
    assert epoch_keys(dataset, key_of, workers=2) == all_keys(key_of)


def test_train_mode_from_s3_keeps_its_batch_count(s3, remote_tree):
    bucket, options = s3
    url = f"{bucket}/train"
    pack_to_url(remote_tree, url, PackConfig(shard_size=30_000, workers=2), storage_options=options)
    dataset = ShardDataset(url, storage_options=options, batch_size=16, image_size=SIZE, world_size=2, rank=1)
    batches = list(make_loader(dataset, num_workers=2))
    assert len(batches) == len(dataset) and sum(len(b[1]) for b in batches) == 60


@pytest.mark.parametrize("workers", [0, 2])
def test_a_connection_cut_mid_shard_loses_and_repeats_nothing(http_serve, remote_packed, key_of, workers):
    base, state = http_serve(remote_packed)
    shards = read_manifest(remote_packed).split("train").shards
    for shard in shards[::3]:  # a third of the shards break once, never in their first chunk
        state.add_fault(shard.name, "cut", nth=4)  # (see test_a_connection_cut_while_caching_resumes)
    state.add_fault(shards[1].name, "503", nth=1)
    source = ShardSource(base, chunk_size=CHUNK, retry=FAST_RETRY)
    dataset = eval_dataset(source)
    assert epoch_keys(dataset, key_of, workers=workers) == all_keys(key_of)
    assert dataset.unreadable_shards == 0 and dataset.truncated_shards == 0
    if workers == 0:  # one reader per shard: what it asked the server for is in the log
        for shard in shards[::3]:
            starts = [r.start for r in state.gets(shard.name)]
            assert len(starts) == len(set(starts)) + 1 and starts.count(0) == 1  # one range again


def test_second_epoch_reads_from_the_cache(http_serve, remote_packed, key_of, tmp_path):
    base, state = http_serve(remote_packed)
    total = read_manifest(remote_packed).split("train").bytes
    source = ShardSource(base, chunk_size=CHUNK, cache_dir=tmp_path / "cache", cache_limit=2 * total)
    dataset = eval_dataset(source)
    assert epoch_keys(dataset, key_of, workers=2) == all_keys(key_of)
    first = len(state.gets(".tar"))
    # Every chunk at least once. Two workers whose parts share a shard can both fetch some of it: one
    # downloads it into the cache, the other streams what it needs meanwhile (whether their reads
    # overlap in time depends on the machine's load), so the first epoch's count is not exact.
    assert first >= sum(-(-s.bytes // CHUNK) for s in read_manifest(remote_packed).split("train").shards)
    assert epoch_keys(dataset, key_of, workers=2) == all_keys(key_of)
    assert len(state.gets(".tar")) == first  # no shard requested again
    assert sum(p.stat().st_size for p in (tmp_path / "cache").iterdir()) == total


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers on 2 CPUs
def test_the_cache_limit_holds_with_several_workers(http_serve, remote_packed, tmp_path, cache_bytes):
    base, _ = http_serve(remote_packed, latency=0.005)
    shards = read_manifest(remote_packed).split("train").shards
    limit = 4 * max(s.bytes for s in shards) + 1000  # room for a few shards of the 25
    cache = tmp_path / "cache"
    source = ShardSource(base, chunk_size=CHUNK, cache_dir=cache, cache_limit=limit, prefetch=3)
    dataset = ShardDataset(source, transform="eval", image_size=SIZE, batch_size=8, shuffle_buffer=16)
    seen, stop = [], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if (cache / ".lock").exists():
                seen.append(cache_bytes(cache))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for epoch in range(2):
            dataset.set_epoch(epoch)
            batches = list(make_loader(dataset, num_workers=3))
            assert len(batches) == len(dataset)
    finally:
        stop.set()
        watcher.join()
    assert len(seen) > 20 and max(seen) <= limit
    assert max(seen) > limit // 2  # the cache was used, not bypassed


def test_a_shard_that_keeps_failing_is_skipped_and_counted(http_serve, remote_packed):
    base, state = http_serve(remote_packed)
    bad = read_manifest(remote_packed).split("train").shards[4]
    state.add_fault(bad.name, "503", times=1000)
    # max_lost=1: the shard's samples are more than the default share a pass may lose (issue 31).
    dataset = eval_dataset(ShardSource(base, chunk_size=CHUNK, retry=FAST_RETRY), max_lost=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(make_loader(dataset, num_workers=0))
    assert len(batches) == len(dataset)
    assert dataset.unreadable_shards == 1
    assert any(bad.name in str(w.message) and "skipped the rest" in str(w.message) for w in caught)


def test_a_shard_that_keeps_failing_raises_naming_it(http_serve, remote_packed):
    base, state = http_serve(remote_packed)
    bad = read_manifest(remote_packed).split("train").shards[4]
    state.add_fault(bad.name, "503", times=1000)
    dataset = eval_dataset(ShardSource(base, chunk_size=CHUNK, retry=FAST_RETRY), on_error="raise")
    with pytest.raises(ShardReadError, match=rf"{bad.name}: reading bytes 0-8192 failed 3 times"):
        list(make_loader(dataset, num_workers=2))


def test_a_missing_index_fails_at_construction(http_serve, s3, tmp_path):
    base, _ = http_serve(tmp_path)
    with pytest.raises(ManifestError, match=rf"no index.json at {base}/nothing/index.json"):
        ShardDataset(f"{base}/nothing")
    bucket, options = s3
    with pytest.raises(ManifestError, match=rf"no index.json at {bucket}/nothing/index.json"):
        ShardDataset(f"{bucket}/nothing", storage_options=options)


def test_a_missing_shard_fails_at_construction(s3, remote_tree):
    bucket, options = s3
    url = f"{bucket}/holey"
    result = pack_to_url(remote_tree, url, PackConfig(shard_size=30_000, workers=2), storage_options=options)
    fs, root = fsspec.core.url_to_fs(url, **options)
    gone = result.info.shards[3].name
    fs.rm(f"{root}/{gone}")
    with pytest.raises(ManifestError, match=rf"shard {gone} of split 'train' is missing"):
        ShardDataset(url, storage_options=options)


def test_source_options_go_in_one_place(remote_packed, tmp_path):
    with pytest.raises(
        Exception, match="pass storage_options, cache_dir, cache_limit and timeout to the ShardSource"
    ):
        ShardDataset(ShardSource(str(remote_packed)), cache_dir=tmp_path, cache_limit=10)
    local = ShardDataset(Path(remote_packed))
    assert local.root == Path(remote_packed) and not local.part.source.remote


def test_a_mix_reads_each_index_once(http_serve, remote_packed):
    # A mix is one spec of several parts (issue 39): each source's index is read once, not once for
    # its weight and again for a dataset of its own.
    (a, served_a), (b, served_b) = http_serve(remote_packed), http_serve(remote_packed)
    mix = MixedDataset([a, b], batch_size=8, transform="eval", image_size=SIZE)
    assert len(served_a.gets("index.json")) == len(served_b.gets("index.json")) == 1
    assert mix.shares == [4, 4] and len(mix) > 0
