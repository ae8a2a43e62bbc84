"""Pack to a real S3 protocol server (moto on 127.0.0.1, through s3fs); verify and describe it there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest
from click.testing import CliRunner

from imgshards.cli.main import cli
from imgshards.converter import (
    DestinationError,
    ManifestError,
    PackConfig,
    pack_to_url,
    read_manifest,
    verify_url,
)

SHARD_SIZE = 30_000  # as remote_packed


def config(**kwargs) -> PackConfig:
    return PackConfig(shard_size=SHARD_SIZE, workers=2, **kwargs)


def remote_files(url: str, options: dict) -> dict[str, int]:
    fs, root = fsspec.core.url_to_fs(url, **options)
    fs.invalidate_cache()
    return {p[len(root) + 1 :]: fs.size(p) for p in fs.find(root)}


def test_pack_to_s3_uploads_the_local_layout(s3, remote_tree, remote_packed, tmp_path):
    bucket, options = s3
    url = f"{bucket}/data/imgs"
    staging = tmp_path / "staging"
    result = pack_to_url(remote_tree, url, config(), storage_options=options, staging=staging)
    assert result.dst == url and result.shards_written == len(result.info.shards)
    local = read_manifest(remote_packed)
    remote = read_manifest(url, storage_options=options)
    assert remote == local == result.manifest  # byte-identical shards: same names, sizes, hashes
    files = remote_files(url, options)
    for shard in local.split("train").shards:
        assert files[shard.name] == shard.bytes
        assert f".imgshards/train/{shard.name}.json" in files
    assert {
        "index.json",
        "_info.json",
        ".imgshards/rejects/train.jsonl",
        ".imgshards/train/plan.json",
    } <= set(files)
    assert not [n for n in files if "partial" in n]
    assert not list(staging.glob("*.tar"))  # each staged shard went once uploaded
    report = verify_url(url, storage_options=options)
    assert report.ok and report.samples == local.split("train").samples


def test_a_rerun_uploads_only_what_is_missing(s3, remote_tree):
    bucket, options = s3
    url = f"{bucket}/ds"
    first = pack_to_url(remote_tree, url, config(), storage_options=options)
    fs, root = fsspec.core.url_to_fs(url, **options)
    names = [s.name for s in first.info.shards]
    fs.rm([f"{root}/{names[1]}", f"{root}/{names[-1]}", f"{root}/index.json"])  # as if never uploaded
    again = pack_to_url(remote_tree, url, config(), storage_options=options)
    assert (again.shards_written, again.shards_reused) == (2, len(names) - 2)
    assert read_manifest(url, storage_options=options) == first.manifest
    assert verify_url(url, storage_options=options).ok


def test_a_killed_upload_resumes_to_the_same_shards(s3, remote_tree, remote_packed):
    bucket, options = s3
    url = f"{bucket}/killed"
    opts = [f"-o{k}={v}" for k, v in options.items()]
    cmd = [sys.executable, "-m", "imgshards.cli", "pack", str(remote_tree), url, *opts, "--no-progress"]
    cmd += ["--shard-size", f"{SHARD_SIZE}B", "--workers", "1", "--check", "full"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    records: list[str] = []
    while len(records) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
        records = [n for n in remote_files(url, options) if n.endswith(".tar.json")]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    files = remote_files(url, options)
    assert "index.json" not in files, "killed too late to test anything"
    assert len(records) >= 3
    again = pack_to_url(remote_tree, url, config(check="full"), storage_options=options)
    assert again.shards_reused >= 3
    assert again.info.shards == read_manifest(remote_packed).split("train").shards
    assert verify_url(url, storage_options=options).ok


def test_another_pack_in_the_destination_is_refused_unless_overwrite(s3, remote_tree):
    bucket, options = s3
    url = f"{bucket}/conflict"
    pack_to_url(remote_tree, url, PackConfig(shard_size=60_000, workers=2), storage_options=options)
    with pytest.raises(DestinationError, match=rf"{url} already holds split 'train' packed with other"):
        pack_to_url(remote_tree, url, config(), storage_options=options)
    result = pack_to_url(remote_tree, url, config(overwrite=True), storage_options=options)
    assert read_manifest(url, storage_options=options) == result.manifest
    shards = sorted(n for n in remote_files(url, options) if n.endswith(".tar"))
    assert shards == sorted(s.name for s in result.info.shards)  # the old, larger shards are gone
    assert verify_url(url, storage_options=options).ok


def test_foreign_shards_are_refused(s3, remote_tree):
    bucket, options = s3
    fs, _ = fsspec.core.url_to_fs(bucket, **options)
    fs.pipe(f"{bucket}/foreign/train-000000.tar", b"not ours")
    with pytest.raises(DestinationError, match="1 shard of split 'train' not made by"):
        pack_to_url(remote_tree, f"{bucket}/foreign", config(), storage_options=options)


def test_verify_url_names_damaged_and_missing_shards(s3, remote_tree):
    bucket, options = s3
    url = f"{bucket}/damaged"
    result = pack_to_url(remote_tree, url, config(), storage_options=options)
    fs, root = fsspec.core.url_to_fs(url, **options)
    first, second = result.info.shards[0].name, result.info.shards[1].name
    data = fs.cat_file(f"{root}/{first}")
    fs.pipe_file(f"{root}/{first}", data[:-1024])
    fs.rm(f"{root}/{second}")
    report = verify_url(url, storage_options=options)
    problems = {(p.shard, p.problem.split(" (")[0]) for p in report.problems}
    assert (second, "missing") in problems
    assert any(shard == first and "SHA-256" in problem for shard, problem in problems)


def test_a_missing_index_is_a_clear_error(s3):
    bucket, options = s3
    with pytest.raises(ManifestError, match=rf"no index.json at {bucket}/nothing/index.json"):
        read_manifest(f"{bucket}/nothing", storage_options=options)


def test_pack_to_a_filesystem_without_atomic_puts(remote_tree):
    url = "memory://imgshards-test/packed"
    result = pack_to_url(remote_tree, url, config())
    fs = fsspec.filesystem("memory")
    names = [p.rsplit("/", 1)[-1] for p in fs.find("/imgshards-test/packed")]
    assert not [n for n in names if n.endswith(".partial")]
    assert read_manifest(url) == result.manifest
    assert verify_url(url).ok
    fs.rm("/imgshards-test", recursive=True)


# The commands on a URL: the path-or-URL argument and --storage-option (-o) of cli/storage.py.
def test_cli_pack_info_verify_on_a_url(s3, remote_tree):
    bucket, options = s3
    url = f"{bucket}/cli/"
    opts = [f"--storage-option={k}={v}" for k, v in options.items()]
    runner = CliRunner()
    packed = runner.invoke(
        cli, ["pack", str(remote_tree), url, *opts, "--shard-size", "30kB", "--workers", "2", "--no-progress"]
    )
    assert packed.exit_code == 0, packed.output
    assert f"into {bucket}/cli:" in packed.output and "120 samples of 6 classes" in packed.output
    info = runner.invoke(cli, ["info", url, *opts, "--json"])
    assert info.exit_code == 0 and json.loads(info.output)["splits"]["train"]["samples"] == 120
    verified = runner.invoke(cli, ["verify", url, *opts])
    assert verified.exit_code == 0 and verified.output.startswith("ok:"), verified.output
    assert f"{bucket}/cli/index.json" in verified.output
    missing = runner.invoke(cli, ["info", f"{bucket}/none", *opts])
    assert missing.exit_code == 2 and "no index.json at" in missing.output
    local_only = runner.invoke(cli, ["pack", str(remote_tree), str(Path("x")), "-o", "a=b"])
    assert local_only.exit_code == 2 and "URL destination only" in local_only.output


def test_the_converter_imports_fsspec_only_for_urls():
    code = "import sys, imgshards.converter, imgshards.loader; print('fsspec' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "False"
