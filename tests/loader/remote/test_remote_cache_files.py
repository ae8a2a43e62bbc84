"""The shard cache reads only files it wrote, in a directory only this user writes (issue 37, points 4-5).

A real cache directory beside a real HTTP server on 127.0.0.1: a FIFO, a symbolic link to another
dataset's shard, or a short file planted under a shard's cache name is removed with one warning and
the shard downloaded again (every sample arrives once, none hangs); a cache directory that another
user owns, or that its group or others may write, is refused in one line.
"""

from __future__ import annotations

import os
import stat
import threading
import warnings
from pathlib import Path

import pytest

from imgshards.converter import read_manifest
from imgshards.loader import ShardDataset, make_loader, preset
from imgshards.loader.errors import ConfigError
from imgshards.loader.remote.cache import cache_name

from .conftest import SIZE, pixel_hash


def dataset(base: str, cache: Path) -> ShardDataset:
    return ShardDataset(base, mode="eval", image_size=SIZE, batch_size=8, cache_dir=cache, cache_limit=10**8)


def read_keys(ds: ShardDataset, key_of: dict[str, str], seconds: float = 20) -> tuple[list[str], list[str]]:
    """Every sample key of a pass (in a thread: a pass that hangs fails the test), and the warnings."""
    keys: list[str] = []
    caught: list[warnings.WarningMessage] = []
    transform = preset("eval", size=SIZE)
    assert transform is not None

    def run() -> None:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for images, _ in make_loader(ds, num_workers=0):
                keys.extend(key_of.get(pixel_hash(image), "?") for image in images)
        caught.extend(seen)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the pass hangs: {len(keys)} of {len(key_of)} samples after {seconds} s"
    return keys, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


@pytest.fixture
def cache(tmp_path) -> Path:
    path = tmp_path / "cache"
    path.mkdir(mode=0o700)
    return path


def planted(remote_packed: Path, cache: Path, index: int) -> tuple[Path, int]:
    shard = read_manifest(remote_packed).split("train").shards[index]
    return cache / cache_name(shard.name, shard.sha256), shard.bytes


def test_a_fifo_under_a_shards_cache_name_is_removed_not_waited_on(http_serve, remote_packed, key_of, cache):
    base, _ = http_serve(remote_packed)
    fifo, size = planted(remote_packed, cache, 0)
    os.mkfifo(fifo)
    try:
        keys, said = read_keys(dataset(base, cache), key_of)
    finally:
        if stat.S_ISFIFO(os.lstat(fifo).st_mode):  # the old code waits in open(): let it go
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert sorted(keys) == sorted(key_of.values())
    assert [m for m in said if fifo.name in m and "a FIFO" in m and "removed" in m], said
    assert stat.S_ISREG(os.lstat(fifo).st_mode) and fifo.stat().st_size == size  # downloaded again


def test_a_link_to_another_datasets_shard_is_never_read(
    http_serve, remote_packed, key_of, cache, tree_factory, packed_factory
):
    other = packed_factory(tree_factory(classes=6, per_class=20, seed=4), shard_size=30_000)
    base, _ = http_serve(remote_packed)
    link, size = planted(remote_packed, cache, 3)
    link.symlink_to(other / read_manifest(other).split("train").shards[3].name)
    keys, said = read_keys(dataset(base, cache), key_of)
    assert "?" not in keys and sorted(keys) == sorted(key_of.values())  # none missing, none twice
    assert [m for m in said if link.name in m and "symbolic link" in m], said
    assert not link.is_symlink() and link.stat().st_size == size


def test_a_short_file_under_a_shards_cache_name_is_replaced(http_serve, remote_packed, key_of, cache):
    base, _ = http_serve(remote_packed)
    short, size = planted(remote_packed, cache, 5)
    shard = read_manifest(remote_packed).split("train").shards[5]
    short.write_bytes((remote_packed / shard.name).read_bytes()[: size // 2])
    keys, said = read_keys(dataset(base, cache), key_of)
    assert sorted(keys) == sorted(key_of.values())
    assert [m for m in said if short.name in m and f"where the shard has {size}" in m], said
    assert short.stat().st_size == size


def test_a_cache_directory_others_can_write_is_refused_in_one_line(http_serve, remote_packed, tmp_path):
    base, _ = http_serve(remote_packed)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match=r"writable by its group or by others \(mode 777\)") as caught:
        dataset(base, shared)
    assert "\n" not in str(caught.value)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 12345, 12345)  # the suite runs as root; elsewhere this needs the privilege
    with pytest.raises(ConfigError, match=r"belongs to uid 12345, not to this user"):
        dataset(base, theirs)
    assert os.listdir(shared) == [] and os.listdir(theirs) == []  # nothing written into either


def test_a_cache_directory_the_loader_makes_is_accepted_under_a_lax_umask(
    http_serve, remote_packed, tmp_path
):
    base, _ = http_serve(remote_packed)
    fresh = tmp_path / "a" / "b" / "cache"
    old = os.umask(0o002)
    try:
        ds = dataset(base, fresh)
    finally:
        os.umask(old)
    assert stat.S_IMODE(fresh.stat().st_mode) & 0o022 == 0
    assert sum(len(labels) for _, labels in make_loader(ds, num_workers=0)) == ds.num_samples
