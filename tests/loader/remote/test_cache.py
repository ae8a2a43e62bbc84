"""ShardCache: reservations, LRU eviction, locks, and the size limit under concurrent processes."""

from __future__ import annotations

import fcntl
import hashlib
import multiprocessing
import os
import random
import shutil
import time

import pytest

from imgshards.loader.remote.cache import ShardCache, cache_name


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put(cache: ShardCache, name: str, data: bytes) -> bool:
    reservation = cache.reserve(name, sha(data), len(data))
    if reservation is None:
        return False
    reservation.write(data)
    reservation.commit()
    return True


def files(cache: ShardCache) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in cache.root.iterdir() if p.name != ".lock"}


def test_a_committed_shard_reads_back_under_its_content_name(tmp_path):
    cache = ShardCache(tmp_path, 10_000)
    data = os.urandom(3000)
    assert cache.open("a.tar", sha(data)) is None
    assert put(cache, "a.tar", data)
    assert files(cache) == {cache_name("a.tar", sha(data)): 3000}
    assert cache_name("a.tar", sha(data)) == f"a.{sha(data)[:20]}.tar"
    with cache.open("a.tar", sha(data)) as f:
        assert f.read() == data
    assert cache.open("a.tar", sha(b"other content")) is None  # a re-packed shard misses


def test_a_reservation_counts_at_full_size_before_it_is_written(tmp_path):
    cache = ShardCache(tmp_path, 10_000)
    reservation = cache.reserve("a.tar", sha(b"x"), 6000)
    assert reservation is not None
    assert cache.usage() == 6000
    assert cache.reserve("b.tar", sha(b"y"), 6000) is None  # no room: the caller streams instead
    assert cache.reserve("a.tar", sha(b"x"), 6000) is None  # being written: not twice
    reservation.abort()
    assert cache.usage() == 0
    assert files(cache) == {}


def test_least_recently_used_shards_are_evicted_first(tmp_path):
    cache = ShardCache(tmp_path, 10_000)
    blobs = {name: os.urandom(3000) for name in "abc"}
    for i, (name, data) in enumerate(blobs.items()):
        assert put(cache, name, data)
        os.utime(cache.path(name, sha(data)), (1000 + i, 1000 + i))
    cache.open("a", sha(blobs["a"])).close()  # a hit makes "a" the most recent
    assert put(cache, "d", os.urandom(3000))
    assert not cache.path("b", sha(blobs["b"])).exists()
    assert cache.path("a", sha(blobs["a"])).exists() and cache.path("c", sha(blobs["c"])).exists()
    assert cache.usage() <= 10_000


def test_a_shard_being_read_is_not_evicted(tmp_path):
    cache = ShardCache(tmp_path, 6000)
    old, new = os.urandom(4000), os.urandom(4000)
    assert put(cache, "old", old)
    with cache.open("old", sha(old)):
        assert cache.reserve("new", sha(new), len(new)) is None
    assert put(cache, "new", new)
    assert list(files(cache)) == [cache_name("new", sha(new))]


def test_a_shard_larger_than_the_limit_is_never_cached(tmp_path):
    cache = ShardCache(tmp_path, 1000)
    assert cache.reserve("big", sha(b"big"), 1001) is None


def test_partial_files_of_dead_writers_are_removed(tmp_path):
    cache = ShardCache(tmp_path, 10_000)
    stale = tmp_path / f".{cache_name('a.tar', sha(b'a'))}.999999-0.partial"
    stale.write_bytes(b"\0" * 8000)  # nobody holds its lock
    live = cache.reserve("b.tar", sha(b"b"), 1000)
    assert live is not None
    assert not stale.exists()
    assert cache.usage() == 1000
    # The live one is locked by its writer: another process's reservation leaves it alone.
    fd = os.open(live.partial, os.O_RDONLY)
    with pytest.raises(BlockingIOError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)
    live.abort()


def test_writing_past_the_reservation_is_refused(tmp_path):
    reservation = ShardCache(tmp_path, 10_000).reserve("a", sha(b"a"), 10)
    assert reservation is not None
    with pytest.raises(ValueError, match="past the 10 bytes"):
        reservation.write(b"x" * 11)
    reservation.write(b"x" * 5)
    with pytest.raises(ValueError, match="committing 5 of 10"):
        reservation.commit()


def test_abort_after_a_failed_commit_closes_nothing_twice(tmp_path):
    # A download thread commits; when that fails (here: the cache directory is gone, as when a
    # benchmark removes its temporary cache while downloads run), it aborts. The file descriptor
    # must be closed once: a second close raised EBADF (a thread traceback), or closed a file that
    # reused the number meanwhile.
    root = tmp_path / "cache"
    reservation = ShardCache(root, 10_000).reserve("a.tar", sha(b"abc"), 3)
    assert reservation is not None
    reservation.write(b"abc")
    shutil.rmtree(root)
    with pytest.raises(FileNotFoundError):
        reservation.commit()
    with open(tmp_path / "other", "wb") as other:  # likely takes the number just closed
        reservation.abort()
        os.fstat(other.fileno())  # still open
        other.write(b"still mine")
    assert (tmp_path / "other").read_bytes() == b"still mine"
    with pytest.raises(ValueError, match="has ended"):
        reservation.write(b"")


def _churn(root: str, limit: int, seed: int, seconds: float) -> int:
    """Fill, hit and evict shards of random sizes from one process; return the shards committed."""
    rng = random.Random(seed)
    cache = ShardCache(root, limit)
    committed = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        name = f"s{rng.randrange(40)}"
        data = bytes([rng.randrange(256)]) * rng.randrange(1000, 30_000)
        f = cache.open(name, sha(data))
        if f is not None:
            f.close()
            continue
        reservation = cache.reserve(name, sha(data), len(data))
        if reservation is None:
            continue
        for i in range(0, len(data), 4096):
            reservation.write(data[i : i + 4096])
        if rng.random() < 0.1:
            reservation.abort()
        else:
            reservation.commit()
            committed += 1
    return committed


def _size(entry: os.DirEntry) -> int:
    try:
        return entry.stat().st_size
    except FileNotFoundError:
        return 0


def test_several_processes_never_exceed_the_limit(tmp_path):
    limit = 100_000
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        result = pool.starmap_async(_churn, [(str(tmp_path), limit, seed, 3.0) for seed in range(4)])
        observed = 0
        while not result.ready():
            # Add up the files as a snapshot: under the cache lock no file appears or is renamed
            # (an aborted partial file may go, which only lowers the total).
            with open(tmp_path / ".lock", "a") as lock:
                fcntl.lockf(lock, fcntl.LOCK_EX)
                total = sum(_size(entry) for entry in os.scandir(tmp_path))
            assert total <= limit
            observed += 1
        committed = result.get(timeout=30)
    assert observed > 50 and sum(committed) > 20
    cache = ShardCache(tmp_path, limit)
    for name, size in files(cache).items():
        assert not name.endswith(".partial"), name
        data = (tmp_path / name).read_bytes()
        assert len(set(data)) == 1 and len(data) == size  # whole, never mixed by two writers
        assert name.split(".")[1] == sha(data)[:20]
