"""No password in a URL is ever shown (issue 37, point 1), against a real HTTP server on 127.0.0.1.

A dataset named ``http://user:PASSWORD@host/ds`` whose shards fail (404, 503) is read by the loader
in a script of its own (DataLoader workers, warnings and logging on, the traceback printed as a user
sees it) and by ``imgshards info`` and ``verify`` (their lines, their ``--json``); everything they
print is searched for the password.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from imgshards.cli.main import cli
from imgshards.converter import read_manifest
from imgshards.converter.format.locate import redact_url

from .remote_servers import _no_aws_env  # noqa: F401  (autouse: as in the remote folders)

PASSWORD = "PASSWORD-s3cr3t"


def with_password(base: str) -> str:
    return base.replace("http://", f"http://user:{PASSWORD}@")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:pw@host/ds", "http://user:****@host/ds"),
        ("https://token@host:8443/ds", "https://****@host:8443/ds"),
        ("s3://bucket/prefix", "s3://bucket/prefix"),
        ("http://u:p@ss@host/x", "http://u:****@host/x"),  # an @ left unquoted in the password
        (
            "404, url='http://u:pw@h/a.tar' and s3://k:s@b/c",
            "404, url='http://u:****@h/a.tar' and s3://k:****@b/c",
        ),
        ("/data/train: user@example.org", "/data/train: user@example.org"),  # no URL, nothing hidden
    ],
)
def test_redact_url_hides_the_credentials_of_every_url_in_a_text(url, shown):
    assert redact_url(url) == shown


_READ = """
import logging, sys, warnings
from imgshards.loader import RetryPolicy, ShardDataset, ShardSource, make_loader

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)  # the loader's own log lines (retries) are shown
    warnings.simplefilter("always")
    url, on_error = sys.argv[1], sys.argv[2]
    source = ShardSource(url, chunk_size=8192, timeout=2, retry=RetryPolicy(attempts=2, backoff=0.01))
    ds = ShardDataset(source, mode="eval", image_size=32, batch_size=8, on_error=on_error, max_lost=1)
    print(repr(ds))
    for batch in make_loader(ds, num_workers=2):
        pass
    print("unreadable", ds.unreadable_shards)
"""


@pytest.mark.parametrize(
    ("fault", "on_error", "error"), [("404", "raise", "ShardAccessError"), ("503", "skip", None)]
)
def test_a_failing_remote_pass_prints_no_password(
    http_serve, remote_packed, tmp_path, fault, on_error, error
):
    base, state = http_serve(remote_packed)
    bad = read_manifest(remote_packed).split("train").shards[1]
    state.add_fault(bad.name, fault, times=1000)
    script = tmp_path / "read.py"
    script.write_text(_READ)
    run = subprocess.run(
        [sys.executable, str(script), with_password(base), on_error],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "always"},
    )
    printed = run.stdout + run.stderr
    assert state.gets(bad.name), "the failing shard was asked for"
    assert bad.name in printed and "user:****@" in printed, printed  # the failure is told...
    assert PASSWORD not in printed, printed  # ...without the password
    if error is not None:
        assert run.returncode != 0 and error in run.stderr, printed
    else:
        assert run.returncode == 0 and "unreadable 1" in run.stdout, printed


def _everything(result) -> str:
    return result.output + (str(result.exception) if result.exception else "")


def test_info_and_verify_print_no_password(http_serve, remote_packed, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(remote_packed, ds)
    base, state = http_serve(ds)
    url = with_password(base)
    shown = base.replace("http://", "http://user:****@")
    runner = CliRunner()
    outputs = []
    # Good: the summary lines and the JSON of each.
    for args in (["info", url], ["info", url, "--json"], ["verify", url], ["verify", url, "--json"]):
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, _everything(result)
        outputs.append(_everything(result))
    assert f"{shown}: 6 classes" in outputs[0]
    # Bad: a damaged shard (BAD lines, the summary, --json), a shard and an index that are not there.
    shards = read_manifest(ds).split("train").shards
    damaged = ds / shards[2].name
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)  # inside an image: the hash differs
    damaged.write_bytes(bytes(data))
    state.add_fault(shards[3].name, "404", times=1000)
    for args in (["verify", url], ["verify", url, "--json"], ["info", f"{url}/nothing"]):
        result = runner.invoke(cli, args)
        assert result.exit_code in (1, 2), _everything(result)
        outputs.append(_everything(result))
    assert f"cannot read {shown}/{shards[3].name}" in outputs[4] or f"of {shown}" in outputs[4], outputs[4]
    assert "no index.json at http://user:****@" in outputs[6]
    state.faults.clear()
    for args in (["verify", url], ["verify", url, "--json"]):  # the damaged shard alone
        result = runner.invoke(cli, args)
        assert result.exit_code == 1, _everything(result)
        outputs.append(_everything(result))
    assert f"BAD train/{shards[2].name}" in outputs[7] and f"of {shown}" in outputs[7], outputs[7]
    doc = json.loads(outputs[8][: outputs[8].rindex("}") + 1])  # then the error line
    assert doc["index"] == f"{shown}/index.json" and not doc["ok"]
    for output in outputs:
        assert PASSWORD not in output, output


def test_a_password_recorded_in_an_index_is_not_printed(remote_packed, tmp_path):
    # An index is untrusted input: one whose recorded source holds a URL with its password (another
    # tool wrote it, or an older imgshards) is printed by `info --json` with the password hidden.
    ds = tmp_path / "ds"
    shutil.copytree(remote_packed, ds)
    index = json.loads((ds / "index.json").read_text())
    index["splits"]["train"]["pack"]["source"] = f"https://user:{PASSWORD}@host/photos"
    (ds / "index.json").write_text(json.dumps(index))
    result = CliRunner().invoke(cli, ["info", str(ds), "--json"])
    assert result.exit_code == 0, _everything(result)
    assert PASSWORD not in result.output
    assert json.loads(result.output)["splits"]["train"]["pack"]["source"] == "https://user:****@host/photos"


@pytest.mark.parametrize("as_json", [False, True])
def test_a_dry_run_into_a_url_prints_no_password(tiny_tree, as_json):
    """``pack --dry-run`` makes no request: what it prints names the destination, without the password."""
    dst = f"http://user:{PASSWORD}@127.0.0.1:9/ds"
    args = ["pack", str(tiny_tree), dst, "--dry-run", *(["--json"] if as_json else [])]
    result = CliRunner().invoke(cli, args)
    output = _everything(result)
    assert result.exit_code == 0, output
    assert "127.0.0.1:9/ds" in output and PASSWORD not in output, output
