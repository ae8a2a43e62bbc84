"""A URL destination that cannot be used fails in one line, exit 2, in seconds, before the tree is read.

Against a real moto S3 server on 127.0.0.1 and a loopback port nothing listens on.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from imgshards.cli.main import cli
from imgshards.converter import DestinationError, PackConfig, pack_to_url

# The destination check's limit: a connect timeout of a few seconds, no retries (it was 11 s of
# retries before). Generous for a loaded machine, well under the retries it replaces.
FAST = 8.0


def pack_cli(*args: str):
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["pack", *args, "--no-progress"])
    elapsed = time.monotonic() - started
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result, elapsed


def options(values: dict) -> list[str]:
    return [f"--storage-option={k}={v}" for k, v in values.items()]


def the_error(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr  # one line, no traceback
    assert lines[0].startswith("Error: ")
    return lines[0]


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on: bound, not listening, so the kernel refuses connections.

    Held for the test: a port released at once may be taken by another process's server meanwhile
    (tests run two at a time), which then answers, slowly, instead of refusing.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.mark.exclusive  # times it
def test_an_unreachable_endpoint(remote_tree, closed_port, tmp_path):
    endpoint = f"http://127.0.0.1:{closed_port}"
    opts = {"key": "k", "secret": "s", "endpoint_url": endpoint}
    result, elapsed = pack_cli(
        str(remote_tree), "s3://bucket/x", *options(opts), "--staging", str(tmp_path / "st")
    )
    assert result.exit_code == 2
    message = the_error(result)
    assert f"cannot reach s3://bucket/x at {endpoint}" in message and "endpoint_url" in message
    assert elapsed < FAST, f"took {elapsed:.1f} s"
    assert not (tmp_path / "st").exists()  # failed before staging anything


@pytest.mark.exclusive  # times it
def test_a_missing_bucket(s3, remote_tree):
    _, opts = s3
    result, elapsed = pack_cli(str(remote_tree), "s3://no-such-bucket/x", *options(opts))
    assert result.exit_code == 2
    message = the_error(result)
    assert "bucket 'no-such-bucket' of s3://no-such-bucket/x does not exist" in message
    assert "create it first" in message and elapsed < FAST
    with pytest.raises(DestinationError, match="does not exist"):
        pack_to_url(remote_tree, "s3://no-such-bucket/x", PackConfig(), storage_options=opts)


@pytest.mark.exclusive  # times it
def test_no_credentials(s3, remote_tree, monkeypatch, tmp_path):
    bucket, opts = s3
    # No key, no secret, nothing in the environment or in a credentials file (the fixture clears AWS_*).
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance metadata service here
    result, elapsed = pack_cli(
        str(remote_tree), f"{bucket}/x", *options({"endpoint_url": opts["endpoint_url"]})
    )
    assert result.exit_code == 2
    message = the_error(result)
    assert f"no credentials for {bucket}/x" in message and "-o key=... -o secret=..." in message
    assert elapsed < FAST


def test_an_unknown_scheme(remote_tree):
    result, _ = pack_cli(str(remote_tree), "s4://bucket/x")
    assert result.exit_code == 2
    assert "cannot use s4://bucket/x: ValueError: Protocol not known: s4" in the_error(result)


def test_a_usable_bucket_passes_the_check(s3, remote_tree):
    bucket, opts = s3
    result, _ = pack_cli(str(remote_tree), f"{bucket}/ok", *options(opts), "--shard-size", "30kB", "-q")
    assert result.exit_code == 0, result.output
