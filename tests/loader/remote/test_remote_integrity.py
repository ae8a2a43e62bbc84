"""Nothing lost or wrong without an error: only damaged bytes are skipped; the rest is read or raised.

Each test runs against a real server or file system: a stock ``http.server`` that ignores ``Range``,
the test HTTP server replacing a shard between two reads or refusing it, moto's S3 without
credentials, a cache on a full tmpfs. Each asserts the exact samples (keys and labels) delivered.
"""

from __future__ import annotations

import errno
import functools
import http.server
import os
import shutil
import subprocess
import tarfile
import time
import warnings
from collections import Counter
from pathlib import Path

import fsspec
import pytest

from imgshards.converter import PackConfig, pack_to_url, read_manifest
from imgshards.loader import ShardDataset, ShardSource, make_loader
from imgshards.loader.errors import ShardAccessError
from imgshards.loader.remote import RetryPolicy
from imgshards.loader.remote.objects import RemoteObject

from ...remote_servers import serving
from .conftest import SIZE, pixel_hash
from .test_remote_dataset import CHUNK

FAST_RETRY = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.02)


def expected(packed: Path) -> Counter[tuple[str, int]]:
    """(key, label) of every sample of the train split, read from the tar files themselves."""
    pairs: Counter[tuple[str, int]] = Counter()
    for shard in read_manifest(packed).split("train").shards:
        with tarfile.open(packed / shard.name) as tar:
            for member in tar:
                key, ext = member.name.split(".", 1)
                if ext == "cls":
                    pairs[(key, int(tar.extractfile(member).read()))] += 1  # type: ignore[union-attr]
    return pairs


def delivered(dataset: ShardDataset, key_of: dict[str, str], workers: int) -> Counter[tuple[str, int]]:
    pairs: Counter[tuple[str, int]] = Counter()
    for images, labels in make_loader(dataset, num_workers=workers):
        pairs.update((key_of[pixel_hash(im)], int(y)) for im, y in zip(images, labels, strict=True))
    return pairs


def eval_dataset(source, **kwargs) -> ShardDataset:
    return ShardDataset(source, mode="eval", transform="eval", image_size=SIZE, batch_size=8, **kwargs)


def copy_of(packed: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(packed, tmp_path / "served"))


# ---- a server that ignores Range ---------------------------------------------------------------


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:
        pass


def stock_server(root: Path):
    """``python -m http.server`` as users start it: HTTP/1.0, no ``Range``, the whole file every time."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    server.daemon_threads = True
    return serving(server)


@pytest.mark.parametrize("cache", [False, True])
def test_a_stock_http_server_delivers_every_sample_once(remote_packed, key_of, tmp_path, cache):
    with stock_server(remote_packed) as base, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        options = {"cache_dir": tmp_path / "cache", "cache_limit": 10**8} if cache else {}
        dataset = eval_dataset(ShardSource(base, chunk_size=CHUNK, retry=FAST_RETRY, **options))
        got = delivered(dataset, key_of, workers=2)
    assert got == expected(remote_packed)
    assert dataset.unreadable_shards == 0
    assert not [w for w in caught if "range" in str(w.message) or "lost" in str(w.message)]


def test_a_stock_http_server_serves_any_range_and_seeks_back(remote_packed):
    shard = read_manifest(remote_packed).split("train").shards[0]
    data = (remote_packed / shard.name).read_bytes()
    with stock_server(remote_packed) as base, ShardSource(base, chunk_size=4096).open(shard) as f:
        f.seek(len(data) // 2)
        assert f.read(10_000) == data[len(data) // 2 : len(data) // 2 + 10_000]
        f.seek(100)  # behind what the answer has given: a new GET from the start
        assert f.read() == data[100:]


# ---- a shard replaced between two reads ---------------------------------------------------------


@pytest.fixture(scope="session")
def repacked(remote_tree, packed_factory) -> Path:
    """``remote_tree`` packed again with another seed: other shards under the same names."""
    return packed_factory(remote_tree, shard_size=30_000, seed=7)


@pytest.mark.parametrize("new", ["repacked", "grown"])
@pytest.mark.parametrize("cache", [False, True])
def test_a_shard_replaced_during_the_pass_is_an_error_never_a_mix(
    http_serve, remote_packed, repacked, tmp_path, cache, new
):
    served = copy_of(remote_packed, tmp_path)
    name = read_manifest(remote_packed).split("train").shards[1].name
    old = (served / name).read_bytes()
    # Another packing of the same tree (another seed), or the same shard with two more tar blocks.
    data = (repacked / name).read_bytes() if new == "repacked" else old + bytes(1024)
    assert data != old
    base, state = http_serve(served)
    state.add_fault(name, "swap", data=data)  # after the first GET of it
    options = {"cache_dir": tmp_path / "cache", "cache_limit": 10**8, "prefetch": 0} if cache else {}
    source = ShardSource(base, chunk_size=CHUNK, readahead=1, retry=FAST_RETRY, **options)
    with pytest.raises(ShardAccessError) as raised:
        for _ in make_loader(eval_dataset(source), num_workers=2):
            pass
    message = str(raised.value)
    assert f"shard {base}/{name} changed on the server during the pass" in message
    assert "run again once the upload has finished" in message
    # Not retried: no range of it asked twice (how many went ahead before the answer that showed the
    # change was read depends on the readahead's timing).
    ranges = [(r.start, r.end) for r in state.gets(name)]
    assert len(ranges) == len(set(ranges))


def test_the_first_version_is_read_whole_when_nothing_changes(http_serve, remote_packed, key_of, tmp_path):
    # The same server and chunking as above, without the swap: every sample once (the check costs
    # nothing but a header).
    base, _ = http_serve(copy_of(remote_packed, tmp_path))
    source = ShardSource(base, chunk_size=CHUNK, readahead=1, retry=FAST_RETRY)
    assert delivered(eval_dataset(source), key_of, workers=2) == expected(remote_packed)


def test_an_s3_object_replaced_between_two_ranges_is_an_error(s3, remote_packed):
    bucket, options = s3
    fs = fsspec.filesystem("s3", **options)
    url = f"{bucket}/swap"
    fs.put(str(remote_packed) + "/", url + "/", recursive=True)
    shard = read_manifest(remote_packed).split("train").shards[0]
    data = (remote_packed / shard.name).read_bytes()
    with ShardSource(url, storage_options=options, chunk_size=4096, readahead=1).open(shard) as f:
        raw = f.raw  # unbuffered: one chunk read (one more in flight), not the whole shard
        assert raw.read(4096) == data[:4096]
        fs.pipe_file(f"{url}/{shard.name}", data[::-1])
        with pytest.raises(ShardAccessError, match=rf"shard {url}/{shard.name} changed on the server"):
            raw.read()


# ---- settings errors: raised at once, never retried or skipped ----------------------------------


@pytest.mark.parametrize("status", ["403", "404"])
def test_a_refused_or_missing_shard_fails_at_once(http_serve, remote_packed, tmp_path, status):
    base, state = http_serve(copy_of(remote_packed, tmp_path))
    name = read_manifest(remote_packed).split("train").shards[2].name
    state.add_fault(name, status, times=1000)
    source = ShardSource(base, chunk_size=CHUNK, readahead=1)  # the default retries: 6 tries
    started = time.monotonic()
    with pytest.raises(ShardAccessError) as raised:
        for _ in make_loader(eval_dataset(source), num_workers=2):
            pass
    # Well under the retries' backoff (0.2 s here alone; 10.3 s once in a loaded CI run): the ranges
    # below are what shows that nothing was retried.
    assert time.monotonic() - started < 30
    ranges = [(r.start, r.end) for r in state.gets(name)]
    assert len(ranges) == len(set(ranges)) <= 2  # no range asked twice (two are in flight at once)
    message = str(raised.value)
    cause = {"403": "access denied", "404": "not found, though the index lists it"}[status]
    assert f"shard {base}/{name}: {cause}" in message
    fix = {
        "403": "pass what the server asks for in storage_options",
        "404": "copy the shard back, or re-pack the dataset",
    }[status]
    assert fix in message


def test_a_server_that_refuses_to_list_the_root_is_read_all_the_same(http_serve, remote_packed, key_of):
    base, state = http_serve(remote_packed, listing=False)
    state.no_listing = 403  # nginx without autoindex
    dataset = eval_dataset(ShardSource(base, chunk_size=CHUNK))
    assert delivered(dataset, key_of, workers=0) == expected(remote_packed)


def test_a_missing_local_shard_fails_at_once(remote_packed, tmp_path):
    root = copy_of(remote_packed, tmp_path)
    dataset = eval_dataset(str(root))
    name = read_manifest(root).split("train").shards[0].name
    (root / name).unlink()  # after the dataset checked the shards
    with pytest.raises(ShardAccessError, match=rf"cannot read shard {root / name}: .*copy the shard back"):
        for _ in make_loader(dataset, num_workers=0):
            pass


@pytest.fixture
def no_aws_credentials(monkeypatch, tmp_path):
    # conftest removed every AWS_ variable; no file or instance metadata may supply them either.
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_s3_without_credentials_fails_at_once_naming_them(s3, remote_tree, no_aws_credentials, monkeypatch):
    bucket, options = s3
    url = f"{bucket}/nocreds"
    pack_to_url(remote_tree, url, PackConfig(shard_size=30_000, workers=2), storage_options=options)
    # Credentials in the environment while the dataset is made (it reads the index), gone in the
    # workers: as when they expire, or are set in the launcher only.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    dataset = eval_dataset(url, storage_options={"endpoint_url": options["endpoint_url"]})
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    started = time.monotonic()
    with pytest.raises(ShardAccessError) as raised:
        for _ in make_loader(dataset, num_workers=2):
            pass
    assert time.monotonic() - started < 10
    message = str(raised.value)
    assert f"shard {url}/" in message and "no credentials for the object store" in message
    assert "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE" in message


# ---- a cache that cannot be written -------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 150 kB tmpfs (about five shards of 30 kB), or skip where it cannot be mounted."""
    mount = tmp_path / "small"
    mount.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", "size=150k", "tmpfs", str(mount)]
    result = subprocess.run(command, capture_output=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {result.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def cache_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "cannot write the shard cache" in str(w.message)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_cache_on_a_full_disk_loses_nothing(http_serve, remote_packed, key_of, small_disk, workers):
    base, _ = http_serve(remote_packed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        source = ShardSource(base, chunk_size=CHUNK, cache_dir=small_disk / "cache", cache_limit=10**8)
        dataset = eval_dataset(source)
        got = delivered(dataset, key_of, workers=workers)
    assert got == expected(remote_packed)
    assert dataset.unreadable_shards == 0
    if workers == 0:  # (a worker warns in its own process)
        assert len(cache_warnings(caught)) == 1
        assert "No space left on device" in cache_warnings(caught)[0]


@pytest.fixture
def disk_full_after(monkeypatch):
    """``disk_full_after(n)``: writes into cache partial files fail with ENOSPC past ``n`` bytes.

    For where no tmpfs can be mounted, and to cut a download at a chosen byte; this process only.
    """
    real_pwrite, written = os.pwrite, [0]

    def arm(limit: int) -> None:
        def pwrite(fd, data, offset):
            if os.readlink(f"/proc/self/fd/{fd}").endswith(".partial"):
                if written[0] + len(data) > limit:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                written[0] += len(data)
            return real_pwrite(fd, data, offset)

        monkeypatch.setattr(os, "pwrite", pwrite)

    return arm


def test_a_cache_whose_writes_fail_streams_on(http_serve, remote_packed, key_of, tmp_path, disk_full_after):
    disk_full_after(40_000)
    base, _ = http_serve(remote_packed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        source = ShardSource(base, chunk_size=CHUNK, cache_dir=tmp_path / "cache", cache_limit=10**8)
        dataset = eval_dataset(source)
        got = delivered(dataset, key_of, workers=0)
    assert got == expected(remote_packed)
    assert dataset.unreadable_shards == 0
    assert len(cache_warnings(caught)) == 1


def test_a_shard_cut_short_in_the_cache_reads_on_from_the_server(
    http_serve, remote_packed, tmp_path, disk_full_after
):
    # Reads past where the cache stopped, each starting short of the end of the one before: every
    # byte from the server, none of the hole the full disk left in the partial file.
    shard = read_manifest(remote_packed).split("train").shards[0]
    data = (remote_packed / shard.name).read_bytes()
    disk_full_after(CHUNK)  # the first chunk is cached, the rest is not
    base, _ = http_serve(remote_packed)
    source = ShardSource(base, chunk_size=CHUNK, cache_dir=tmp_path / "cache", cache_limit=10**8)
    with warnings.catch_warnings(record=True) as caught, source.open(shard) as f:
        warnings.simplefilter("always")
        raw = f.raw
        pieces = [raw.read(CHUNK), raw.read(1000)]  # the cached bytes, then 1000 from the server
        while piece := raw.read(len(data)):  # longer than the 1000 past the cache
            pieces.append(piece)
        raw.seek(CHUNK + 5000)  # back, still past the cached bytes
        again = raw.read(3000)
    assert b"".join(pieces) == data
    assert again == data[CHUNK + 5000 : CHUNK + 8000]
    assert len(cache_warnings(caught)) == 1


def test_a_local_dataset_never_goes_through_the_version_check(remote_packed, key_of, monkeypatch):
    def no_remote_object(*args, **kwargs):
        raise AssertionError("a local shard was read as a remote object")

    monkeypatch.setattr(RemoteObject, "__init__", no_remote_object)
    assert delivered(eval_dataset(str(remote_packed)), key_of, workers=0) == expected(remote_packed)
