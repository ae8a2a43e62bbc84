"""RangeReader against a real HTTP server on 127.0.0.1: ranged chunks, seeks, and faults recovered."""

from __future__ import annotations

import io
import os
import time

import aiohttp
import fsspec
import pytest

from imgshards.loader.errors import ShardReadError
from imgshards.loader.remote.ranges import RangeReader, RetryPolicy, is_transient

FAST_RETRY = RetryPolicy(attempts=4, backoff=0.01, max_backoff=0.05)
CHUNK = 4096


@pytest.fixture
def blob(tmp_path):
    data = os.urandom(10 * CHUNK + 123)
    (tmp_path / "blob.bin").write_bytes(data)
    return data


def reader(url: str, size: int, *, fs=None, **kwargs) -> RangeReader:
    fs = fs or fsspec.filesystem("http", skip_instance_cache=True)
    kwargs.setdefault("chunk_size", CHUNK)
    kwargs.setdefault("retry", FAST_RETRY)
    return RangeReader(lambda a, b: fs.cat_file(url, start=a, end=b), size, name=url, **kwargs)


def test_reads_the_object_in_ranged_chunks(http_serve, tmp_path, blob):
    base, state = http_serve(tmp_path)
    with io.BufferedReader(reader(f"{base}/blob.bin", len(blob))) as f:
        assert f.read() == blob
    ranges = sorted((r.start, r.end) for r in state.gets("blob.bin"))
    expected = [(a, min(a + CHUNK, len(blob))) for a in range(0, len(blob), CHUNK)]
    assert ranges == expected  # each byte requested once, no request for the size


@pytest.mark.exclusive  # times it
def test_first_bytes_come_before_the_object_has_arrived(http_serve, tmp_path, blob):
    base, state = http_serve(tmp_path, latency=0.05)
    r = reader(f"{base}/blob.bin", len(blob), readahead=1)
    started = time.perf_counter()
    assert r.read(512) == blob[:512]
    first = time.perf_counter() - started
    assert len(state.gets("blob.bin")) <= 2  # the first chunk and at most one ahead
    assert r.read() == blob[512:]
    assert first < 0.5 * (time.perf_counter() - started)


def test_seek_past_chunks_skips_their_transfer(http_serve, tmp_path, blob):
    base, state = http_serve(tmp_path)
    r = reader(f"{base}/blob.bin", len(blob), readahead=1)
    assert r.read(10) == blob[:10]
    r.seek(7 * CHUNK + 5)
    assert r.read(100) == blob[7 * CHUNK + 5 : 7 * CHUNK + 105]
    r.seek(-50, os.SEEK_CUR)  # backwards inside the chunk in hand: no request
    assert r.read(50) == blob[7 * CHUNK + 55 : 7 * CHUNK + 105]
    starts = {req.start for req in state.gets("blob.bin")}
    assert not starts & {2 * CHUNK, 3 * CHUNK, 4 * CHUNK, 5 * CHUNK, 6 * CHUNK}


def test_chunks_yields_the_rest(http_serve, tmp_path, blob):
    base, _ = http_serve(tmp_path)
    r = reader(f"{base}/blob.bin", len(blob))
    r.read(100)
    assert b"".join(r.chunks()) == blob[100:]


@pytest.mark.parametrize("kind", ["cut", "503"])
def test_a_broken_request_is_repeated_for_its_range_only(http_serve, tmp_path, blob, kind):
    base, state = http_serve(tmp_path)
    state.add_fault("blob.bin", kind, nth=3)
    r = reader(f"{base}/blob.bin", len(blob), readahead=1)
    assert r.read() == blob
    assert r.retries == 1
    requested = [(q.start, q.end) for q in state.gets("blob.bin")]
    repeated = [r for r in set(requested) if requested.count(r) > 1]
    # The third request to arrive (not the first chunk's: the third chunk is asked for once the first
    # is in) broke and was made again; nothing else was, and the shard never restarted from the top.
    assert len(repeated) == 1 and repeated[0][0] > 0
    assert len(requested) == len(set(requested)) + 1


def test_a_stalled_request_times_out_and_is_repeated(http_serve, tmp_path, blob):
    base, state = http_serve(tmp_path)
    state.add_fault("blob.bin", "stall", nth=2, stall=2.0)
    fs = fsspec.filesystem(
        "http", skip_instance_cache=True, client_kwargs={"timeout": aiohttp.ClientTimeout(sock_read=0.3)}
    )
    r = reader(f"{base}/blob.bin", len(blob), fs=fs, readahead=1)
    assert r.read() == blob
    assert r.retries == 1


def test_a_range_that_keeps_failing_names_the_shard(http_serve, tmp_path, blob):
    base, state = http_serve(tmp_path)
    state.add_fault("blob.bin", "503", times=100)
    r = reader(f"{base}/blob.bin", len(blob), readahead=1)
    with pytest.raises(ShardReadError, match=r"blob\.bin: reading bytes 0-4096 failed 4 times") as info:
        r.read()
    assert info.value.shard == f"{base}/blob.bin"
    assert r.retries >= 3  # the chunk read ahead fails too


def test_a_missing_object_fails_at_once(http_serve, tmp_path):
    base, state = http_serve(tmp_path)
    r = reader(f"{base}/nope.bin", 5000)
    with pytest.raises(ShardReadError, match=r"nope\.bin.*FileNotFoundError"):
        r.read()
    assert r.retries == 0
    assert len(state.gets("nope.bin")) <= 2  # the first range and the one read ahead, once each


def test_transient_errors():
    assert is_transient(ConnectionResetError())
    assert is_transient(TimeoutError())
    assert is_transient(aiohttp.ClientPayloadError("cut"))
    assert not is_transient(FileNotFoundError())
    assert not is_transient(PermissionError())
    response = aiohttp.ClientResponseError
    assert is_transient(response(None, (), status=503))  # type: ignore[arg-type]
    assert is_transient(response(None, (), status=429))  # type: ignore[arg-type]
    assert not is_transient(response(None, (), status=403))  # type: ignore[arg-type]
