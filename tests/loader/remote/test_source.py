"""ShardSource over a real HTTP server: streaming, the cache filled as shards stream, prefetch, faults."""

from __future__ import annotations

import pickle
import time

import pytest

from imgshards.converter.format.errors import ManifestError
from imgshards.converter.format.manifest import read_manifest
from imgshards.loader.errors import ConfigError, ShardReadError
from imgshards.loader.remote.ranges import RetryPolicy
from imgshards.loader.remote.source import ShardSource

FAST_RETRY = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.02)
CHUNK = 8192


def shards_of(root):
    return read_manifest(root).split("train").shards


def source(url: str, **kwargs) -> ShardSource:
    kwargs.setdefault("chunk_size", CHUNK)
    kwargs.setdefault("retry", FAST_RETRY)
    return ShardSource(url, **kwargs)


def wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_streams_every_shard_as_stored(http_serve, remote_packed):
    base, state = http_serve(remote_packed)
    src = source(base)
    for shard in shards_of(remote_packed):
        with src.open(shard) as f:
            assert f.read() == (remote_packed / shard.name).read_bytes()
    assert all(r.start is not None for r in state.gets(".tar"))  # ranged GETs only


def test_cached_shards_are_read_from_disk_the_second_time(http_serve, remote_packed, tmp_path):
    base, state = http_serve(remote_packed)
    shards = shards_of(remote_packed)[:4]
    src = source(base, cache_dir=tmp_path / "cache", cache_limit=10**6, prefetch=0)
    for _ in range(2):
        for shard in shards:
            with src.open(shard) as f:
                assert f.read() == (remote_packed / shard.name).read_bytes()
        wait_for(lambda: len(list((tmp_path / "cache").glob("*.tar"))) == 4)  # downloads finish
    requests = state.gets(".tar")
    assert len(requests) == sum(-(-s.bytes // CHUNK) for s in shards)  # every byte fetched once
    assert not list((tmp_path / "cache").glob(".*.partial"))


def test_prefetch_downloads_the_next_shards_of_the_plan(http_serve, remote_packed, tmp_path):
    base, state = http_serve(remote_packed)
    shards = shards_of(remote_packed)
    src = source(base, cache_dir=tmp_path / "cache", cache_limit=10**6, prefetch=3)
    src.set_read_order(shards[:6])
    src.open(shards[0]).close()
    wait_for(lambda: len(list((tmp_path / "cache").glob("*.tar"))) == 4)
    fetched = {r.path.rsplit("/", 1)[-1] for r in state.gets(".tar")}
    assert fetched == {s.name for s in shards[:4]}
    before = len(state.gets(".tar"))
    for shard in shards[1:4]:
        with src.open(shard) as f:
            assert f.read() == (remote_packed / shard.name).read_bytes()
    wait_for(lambda: len(list((tmp_path / "cache").glob("*.tar"))) == 6)  # 4 and 5 ahead now
    assert len(state.gets(".tar")) == before + 2 * -(-shards[0].bytes // CHUNK)


def test_the_cache_stays_under_its_limit(http_serve, remote_packed, tmp_path, cache_bytes):
    base, _ = http_serve(remote_packed)
    shards = shards_of(remote_packed)
    limit = 3 * max(s.bytes for s in shards) + 100
    src = source(base, cache_dir=tmp_path / "cache", cache_limit=limit, prefetch=2)
    src.set_read_order(shards)
    for shard in shards:
        with src.open(shard) as f:
            assert f.read() == (remote_packed / shard.name).read_bytes()
        assert cache_bytes(tmp_path / "cache") <= limit


def test_a_connection_cut_while_caching_resumes(http_serve, remote_packed, tmp_path):
    base, state = http_serve(remote_packed)
    shard = shards_of(remote_packed)[2]
    # The 4th request: the first three (chunks 0-2, two read ahead) arrive in any order, but the
    # 4th is asked for only once chunk 0 is in, so the cut is never in chunk 0.
    state.add_fault(shard.name, "cut", nth=4)
    src = source(base, cache_dir=tmp_path / "cache", cache_limit=10**6, prefetch=0)
    with src.open(shard) as f:
        assert f.read() == (remote_packed / shard.name).read_bytes()
    wait_for(lambda: len(list((tmp_path / "cache").glob("*.tar"))) == 1)
    assert (tmp_path / "cache" / next((tmp_path / "cache").glob("*.tar")).name).read_bytes() == (
        remote_packed / shard.name
    ).read_bytes()
    starts = [r.start for r in state.gets(shard.name)]
    assert len(starts) == len(set(starts)) + 1 and starts.count(0) == 1


def test_a_shard_that_keeps_failing_raises_naming_it(http_serve, remote_packed, tmp_path):
    base, state = http_serve(remote_packed)
    shard = shards_of(remote_packed)[1]
    state.add_fault(shard.name, "503", nth=2, times=100)
    for kwargs in ({}, {"cache_dir": tmp_path / "cache", "cache_limit": 10**6}):
        src = source(base, **kwargs)
        with src.open(shard) as f, pytest.raises(ShardReadError, match=rf"{shard.name}.*failed 3 times"):
            f.read()
    assert not list((tmp_path / "cache").iterdir())[1:]  # the lock file only: nothing half-cached


def test_check_finds_a_missing_shard_by_listing(http_serve, remote_packed, tmp_path):
    shards = shards_of(remote_packed)
    partial = tmp_path / "partial"
    partial.mkdir()
    for shard in shards[1:]:
        (partial / shard.name).write_bytes((remote_packed / shard.name).read_bytes())
    (partial / "index.json").write_bytes((remote_packed / "index.json").read_bytes())
    base, _ = http_serve(partial)
    source(base).check(shards[1:], "train")  # http.server lists the directory
    with pytest.raises(ManifestError, match=rf"shard {shards[0].name} of split 'train' is missing"):
        source(base).check(shards, "train")


def test_a_source_pickles_without_its_threads(http_serve, remote_packed, tmp_path):
    base, _ = http_serve(remote_packed)
    src = source(base, cache_dir=tmp_path / "cache", cache_limit=10**6)
    shard = shards_of(remote_packed)[0]
    src.open(shard).close()
    copy = pickle.loads(pickle.dumps(src))
    with copy.open(shard) as f:
        assert f.read() == (remote_packed / shard.name).read_bytes()


def test_bad_arguments_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cache_dir and cache_limit go together"):
        ShardSource("http://127.0.0.1:1/x", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="cache_limit must be a positive"):
        ShardSource("http://127.0.0.1:1/x", cache_dir=tmp_path, cache_limit=0)


def test_a_caching_reader_gets_its_first_bytes_before_the_shard_arrives(http_serve, remote_packed, tmp_path):
    base, _ = http_serve(remote_packed, latency=0.15)
    shard = shards_of(remote_packed)[0]  # 30 kB: four requests of 8 kB, one in flight at a time
    cache = tmp_path / "cache"
    src = source(base, cache_dir=cache, cache_limit=10**6, prefetch=0, readahead=1)
    with src.open(shard) as f:
        head = f.read(512)
        assert not list(cache.glob("*.tar"))  # the shard is still arriving, into a partial file
        rest = f.read()
    assert head + rest == (remote_packed / shard.name).read_bytes()
    wait_for(lambda: len(list(cache.glob("*.tar"))) == 1)
