"""A server that stalls mid-answer, and a cache that cannot be written (issue 21), against real parts.

The server is a real HTTP server on 127.0.0.1 serving shards packed by the real ``pack``: for the files
it is told to stall it sends the headers and the first bytes of the body, then nothing until the test
ends. The read-only and the full cache directory are real file systems where the OS allows it: a tmpfs
mounted in a private mount namespace (``unshare``); else the test is skipped, saying why.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from imgshards.cli.main import cli
from imgshards.converter import read_manifest
from imgshards.loader import RetryPolicy, ShardDataset, ShardReadError, ShardSource, make_loader
from imgshards.loader.errors import ConfigError

from .hostile_http import hostile_server

SIZE = 32
CHUNK = 8192
TIMEOUT = 1.0
ATTEMPTS = 3
RETRY = RetryPolicy(attempts=ATTEMPTS, backoff=0.05, max_backoff=0.1)
SLACK = 3.0  # seconds past the timeouts for starting up and reading the shards that do not stall


@pytest.fixture
def serve():
    """``serve(root, stall=(suffix, ...))``: the base URL of a server stalling those files."""
    with contextlib.ExitStack() as stack:
        yield lambda root, stall=(): stack.enter_context(
            hostile_server(Path(root), "stall", tuple(stall), head=100)
        )[0]


def source(url: str, **kwargs) -> ShardSource:
    return ShardSource(url, chunk_size=CHUNK, timeout=TIMEOUT, retry=RETRY, **kwargs)


def dataset(src: ShardSource, **kwargs) -> ShardDataset:
    kwargs.setdefault("mode", "eval")
    return ShardDataset(src, transform="eval", image_size=SIZE, batch_size=8, **kwargs)


# ---- the loader ---------------------------------------------------------------------------------


@pytest.mark.exclusive  # times it
def test_a_stall_raises_shard_read_error_after_the_retries_in_train_mode(serve, remote_packed):
    base = serve(remote_packed, stall=(".tar",))
    ds = dataset(source(base), mode="train", on_error="raise")
    started = time.monotonic()
    with pytest.raises(ShardReadError, match=rf"failed {ATTEMPTS} times; last error: .*Timeout"):
        list(make_loader(ds, num_workers=0))
    took = time.monotonic() - started
    assert ATTEMPTS * TIMEOUT <= took < ATTEMPTS * TIMEOUT + SLACK


@pytest.mark.exclusive  # times it
def test_a_stalled_shard_is_counted_unreadable_in_eval_mode(serve, remote_packed):
    shards = read_manifest(remote_packed).split("train").shards
    bad = shards[2]
    base = serve(remote_packed, stall=(bad.name,))
    ds = dataset(source(base), on_error="skip", max_lost=1)  # more than the default share (issue 31)
    started = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        samples = sum(len(labels) for _, labels in make_loader(ds, num_workers=0))
    took = time.monotonic() - started
    assert ds.unreadable_shards == 1 and ds.lost_samples == bad.samples
    assert samples == ds.num_samples - bad.samples
    assert any(bad.name in str(w.message) for w in caught)
    assert took < ATTEMPTS * TIMEOUT + SLACK


def test_a_file_system_that_ignores_its_timeout_cannot_hang_a_reader(serve, remote_packed):
    # A timeout set in the options wins over the source's: here none at all (aiohttp's default is 5
    # minutes), as a file system that ignores what it is given. The reader's own bounds end it: the
    # request's deadline (AnswerTooSlow) or the reader's patience, which with one try fall due
    # together, so either may say it (the first did in 1 CI run of 3).
    import aiohttp

    base = serve(remote_packed, stall=(".tar",))
    options = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None)}}
    src = ShardSource(
        base, storage_options=options, chunk_size=CHUNK, timeout=0.2, retry=RetryPolicy(attempts=1)
    )
    ds = dataset(src, on_error="raise")
    started = time.monotonic()
    with pytest.raises(ShardReadError, match=r"train-000000\.tar.*(no answer for|reading) bytes 0-8192") as e:
        list(make_loader(ds, num_workers=0))
    assert "\n" not in str(e.value)
    patience = RetryPolicy(attempts=1).patience(0.2, CHUNK)
    assert patience <= time.monotonic() - started < patience + SLACK


def test_the_timeouts_go_to_the_file_system_and_a_users_own_wins():
    import aiohttp

    http = ShardSource("https://example.com/ds", timeout=7).storage_options["client_kwargs"]["timeout"]
    assert (http.sock_connect, http.sock_read, http.total) == (7, 7, None)
    own = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=99)}, "headers": {"a": "b"}}
    kept = ShardSource("https://example.com/ds", storage_options=own, timeout=7).storage_options
    assert kept["client_kwargs"]["timeout"].total == 99 and kept["headers"] == {"a": "b"}
    s3 = ShardSource("s3://bucket/ds", storage_options={"config_kwargs": {"read_timeout": 5}}, timeout=7)
    assert s3.storage_options["config_kwargs"] == {"read_timeout": 5, "connect_timeout": 7}
    with pytest.raises(ConfigError, match="timeout must be a positive number of seconds, got 0"):
        ShardSource("s3://bucket/ds", timeout=0)


# ---- the commands -------------------------------------------------------------------------------


def one_line_error(result) -> str:
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.exclusive  # times it
@pytest.mark.parametrize(("command", "stall"), [("info", "index.json"), ("verify", ".tar")])
def test_info_and_verify_on_a_stalled_url_end_in_one_line(serve, remote_packed, command, stall):
    base = serve(remote_packed, stall=(stall,))
    started = time.monotonic()
    result = CliRunner().invoke(cli, [command, base, "--timeout", str(TIMEOUT)])
    took = time.monotonic() - started
    assert result.exit_code == 2, result.output
    assert re.match(rf"Error: cannot read {base}/\S+: .*Timeout", one_line_error(result))
    assert took < 2 * TIMEOUT + SLACK


# ---- a training process killed while its workers wait on the server -----------------------------

_TRAINING = """
import sys
from imgshards.loader import ShardDataset, make_loader

if __name__ == "__main__":  # workers may start from a forkserver, which imports this module
    url, cache, start = sys.argv[1], sys.argv[2], sys.argv[3]
    ds = ShardDataset(url, cache_dir=cache, cache_limit=10**8, timeout=60, image_size=32, batch_size=8)
    for batch in make_loader(ds, num_workers=2, multiprocessing_context=None if start == "-" else start):
        pass
"""


# The loader's choice (a forkserver: fsspec runs a thread in the training process), and fork: a
# worker whose parent is the training process itself, which DataLoader's watchdog does not check
# while the worker waits inside a batch.
@pytest.mark.parametrize("start", ["-", "fork"])
def test_sigterm_ends_the_workers_waiting_on_a_stall_and_removes_their_partial_files(
    serve, remote_packed, tmp_path, start
):
    base = serve(remote_packed, stall=(".tar",))
    cache = tmp_path / "cache"
    script = tmp_path / "train.py"
    script.write_text(_TRAINING)
    training = subprocess.Popen(  # a session of its own: the clean-up below kills its group, none of ours
        [sys.executable, str(script), base, str(cache), start], stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        # The workers wait on the server once their downloads into the cache have begun.
        while not (cache.is_dir() and list(cache.glob("*.partial"))):
            assert training.poll() is None, training.stderr.read().decode()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no download started"
            time.sleep(0.1)
        family = psutil.Process(training.pid).children(recursive=True)
        assert len(family) >= 2  # the workers (and a forkserver, a resource tracker)
        time.sleep(0.5)
        training.send_signal(signal.SIGTERM)
        training.wait(10)
        ended = time.monotonic()
        while time.monotonic() < ended + 10 and (_alive(family) or list(cache.glob("*.partial"))):
            time.sleep(0.1)
        assert not _alive(family), [p.cmdline() for p in _alive(family)]
        assert not list(cache.glob("*.partial"))
    finally:
        # Its process group: it and what it started, orphaned or not. Not every child of this
        # process, which took pytest's own resource tracker with them (the next test to share
        # memory warned "resource_tracker: process died unexpectedly").
        with contextlib.suppress(ProcessLookupError):
            os.killpg(training.pid, signal.SIGKILL)
        training.wait()


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
    return alive


# ---- a cache directory that cannot be written -----------------------------------------------------

_READ_WITH_CACHE = """
import json, os, sys, warnings
from imgshards.loader import ShardDataset, ShardSource, make_loader

url, cache = sys.argv[1], sys.argv[2]
source = ShardSource(url, chunk_size=8192, cache_dir=cache, cache_limit=10**8)
ds = ShardDataset(source, mode="eval", transform="eval", image_size=32, batch_size=8)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    samples = sum(len(labels) for _, labels in make_loader(ds, num_workers=0))
print(json.dumps({
    "samples": samples, "expected": ds.num_samples, "unreadable": ds.unreadable_shards,
    "lost": ds.lost_samples, "warnings": [str(w.message) for w in caught],
    "files": sorted(os.listdir(cache)) if os.path.isdir(cache) else None,
}))
"""


@pytest.fixture(scope="session")
def private_mounts() -> str:
    """The ``unshare`` that runs a command in a mount namespace of its own, or skip saying why not."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare (util-linux) to mount a small tmpfs as the cache directory")
    probe = subprocess.run([unshare, "-Urm", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here ({probe.stderr.strip()}): no small tmpfs to fill")
    return unshare


def read_with_cache_on(tmpfs_options: str, unshare: str, url: str, tmp_path: Path) -> dict:
    """Read the dataset at ``url`` once, the cache on a tmpfs mounted with ``tmpfs_options``."""
    cache = tmp_path / "cache"
    cache.mkdir()
    script = tmp_path / "read.py"
    script.write_text(_READ_WITH_CACHE)
    # mode=0755: a tmpfs is 1777 by default, a cache directory others may write, which is refused.
    mount = f'mount -t tmpfs -o {tmpfs_options},mode=0755 tmpfs "$1" && exec "$2" "$3" "$4" "$1"'
    result = subprocess.run(
        [unshare, "-Urm", "sh", "-c", mount, "sh", str(cache), sys.executable, str(script), url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def cache_warnings(report: dict) -> list[str]:
    return [w for w in report["warnings"] if "cannot write the shard cache" in w]


def test_a_read_only_cache_directory_streams_past_it_saying_so_once(
    serve, remote_packed, tmp_path, private_mounts
):
    report = read_with_cache_on("ro,size=1m", private_mounts, serve(remote_packed), tmp_path)
    assert report["samples"] == report["expected"] and report["unreadable"] == report["lost"] == 0
    (line,) = cache_warnings(report)
    assert "Read-only file system" in line
    assert report["files"] == []


def test_a_full_cache_disk_streams_past_it_saying_so_once(serve, remote_packed, tmp_path, private_mounts):
    # Room for about two of the ~30 kB shards: the third one's writes fail with ENOSPC midway.
    report = read_with_cache_on("size=64k", private_mounts, serve(remote_packed), tmp_path)
    assert report["samples"] == report["expected"] and report["unreadable"] == report["lost"] == 0
    (line,) = cache_warnings(report)
    assert "No space left on device" in line
    assert report["files"] and not [f for f in report["files"] if f.endswith(".partial")]
