"""Every remote wait ends (issue 37, points 2 and 3), against real HTTP servers on 127.0.0.1.

A server that sends the headers and 1,000 bytes of a shard then nothing, one that trickles a byte
every half second (each byte resetting the read timeout), and one that redirects a shard to
``file://``: each ends the pass in one line, the first two within twice the documented bound
(:meth:`RetryPolicy.patience`: every try within its deadline, ``2 x timeout`` plus its bytes at
``MIN_RATE``, and the backoffs), the redirect at its first request.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest

from imgshards.converter import read_manifest
from imgshards.loader import (
    RetryPolicy,
    ShardAccessError,
    ShardDataset,
    ShardReadError,
    ShardSource,
    make_loader,
)
from imgshards.loader.remote.ranges import MIN_RATE

from .hostile_http import hostile_server

TIMEOUT = 2.0  # the ShardDataset(timeout=2)
RETRY = RetryPolicy(attempts=2, backoff=0.05, max_backoff=0.1)


def dataset(base: str, tmp_path: Path | None = None) -> ShardDataset:
    cache = {"cache_dir": tmp_path / "cache", "cache_limit": 10**8} if tmp_path is not None else {}
    source = ShardSource(base, timeout=TIMEOUT, retry=RETRY, **cache)
    return ShardDataset(source, mode="eval", image_size=32, batch_size=8, on_error="raise")


def bound(remote_packed: Path) -> float:
    """The documented longest wait for the first shard: its tries, each within its deadline."""
    first = read_manifest(remote_packed).split("train").shards[0]
    return RETRY.patience(TIMEOUT, first.bytes)


def test_the_deadline_is_two_timeouts_plus_the_bytes_at_the_floor_speed():
    assert MIN_RATE == 64 << 10
    assert RetryPolicy().deadline(20, 8 << 20) == 40 + 128
    assert RETRY.patience(TIMEOUT, 30_000) == pytest.approx(2 * (4 + 30_000 / MIN_RATE) + 0.05)


@pytest.mark.exclusive  # times it
@pytest.mark.timeout(60)  # a wait without an end fails here, not after pytest's 5 minutes
@pytest.mark.parametrize("cached", [False, True], ids=["streamed", "cached"])
@pytest.mark.parametrize("kind", ["stall", "trickle"])
def test_a_server_that_stalls_or_trickles_ends_the_pass_in_one_line(remote_packed, tmp_path, kind, cached):
    with hostile_server(remote_packed, kind, (".tar",)) as (base, hits):
        ds = dataset(base, tmp_path if cached else None)
        started = time.monotonic()
        with pytest.raises(ShardReadError) as caught:
            list(make_loader(ds, num_workers=0))
        took = time.monotonic() - started
    message = str(caught.value)
    assert type(caught.value) is ShardReadError  # unreadable (damage, per on_error), not a setup error
    assert "\n" not in message and "train-000000.tar" in message and "failed 2 times" in message
    assert took < 2 * bound(remote_packed), (took, message)
    if kind == "trickle":
        assert "deadline" in message, message
    assert hits.count("train-000000.tar") == RETRY.attempts


@pytest.mark.exclusive  # times it
@pytest.mark.timeout(60)
def test_a_trickling_shard_is_skipped_and_counted_with_on_error_skip(remote_packed):
    bad = read_manifest(remote_packed).split("train").shards[1]
    with hostile_server(remote_packed, "trickle", (bad.name,)) as (base, _):
        source = ShardSource(base, timeout=TIMEOUT, retry=RETRY)
        ds = ShardDataset(source, mode="eval", image_size=32, batch_size=8, on_error="skip", max_lost=1)
        started = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            samples = sum(len(labels) for _, labels in make_loader(ds, num_workers=0))
        took = time.monotonic() - started
    assert ds.unreadable_shards == 1 and samples == ds.num_samples - bad.samples
    assert any(bad.name in str(w.message) and "deadline" in str(w.message) for w in caught)
    assert took < 2 * RETRY.patience(TIMEOUT, bad.bytes) + 5  # + the other shards, read at once


@pytest.mark.exclusive  # times it
def test_a_redirect_off_http_fails_at_the_first_request(remote_packed):
    with hostile_server(remote_packed, "redirect", (".tar",), location="file:///etc/passwd") as (base, hits):
        source = ShardSource(base, timeout=TIMEOUT)  # the default 6 tries
        ds = ShardDataset(source, mode="eval", image_size=32, batch_size=8, on_error="skip")
        started = time.monotonic()
        with pytest.raises(ShardAccessError, match=r"train-000000\.tar: the server redirects it off HTTP"):
            list(make_loader(ds, num_workers=0))
        took = time.monotonic() - started
    assert hits == ["train-000000.tar"], hits  # once: never retried, never skipped
    assert took < 5
