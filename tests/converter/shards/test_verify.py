"""``verify``: every shard re-hashed and recounted against the index; a flood of problems summed up."""

import shutil
import subprocess
import sys
import time

import pytest

from imgshards.cli.verify import SHOWN_PROBLEMS
from imgshards.converter import ManifestError, read_manifest, verify


@pytest.fixture
def copy(tiny_packed, tmp_path):
    return shutil.copytree(tiny_packed, tmp_path / "copy")


def test_verify_passes_on_a_fresh_pack(tiny_packed):
    report = verify(tiny_packed, workers=2)
    assert report.ok and report.samples == 40 and report.shards == len(list(tiny_packed.glob("*.tar")))


def test_verify_names_the_damaged_and_the_missing_shard(copy):
    shards = read_manifest(copy).split("train").shards
    damaged = copy / shards[0].name
    data = bytearray(damaged.read_bytes())
    data[700] ^= 0x01  # one bit inside the first image
    damaged.write_bytes(bytes(data))
    (copy / shards[1].name).unlink()
    report = verify(copy, workers=2)
    assert not report.ok
    by_shard = {p.shard: p.problem for p in report.problems}
    assert "SHA-256 differs" in by_shard[shards[0].name]
    assert "missing" in by_shard[shards[1].name]


def test_verify_needs_an_index(tmp_path):
    with pytest.raises(ManifestError, match=r"no index\.json"):
        verify(tmp_path)


def test_problems_come_in_the_index_order_with_every_missing_and_damaged_shard_named(copy):
    shards = read_manifest(copy).split("train").shards
    assert len(shards) >= 4
    for shard in shards[1::2]:
        (copy / shard.name).unlink()
    with open(copy / shards[0].name, "r+b") as f:
        f.truncate(shards[0].bytes - 512)  # cut short: read by a worker, not only looked up
    report = verify(copy, workers=2)
    missing = [s.name for s in shards[1::2]]
    assert [p.shard for p in report.problems if p.problem.startswith("missing")] == missing
    assert {p.shard for p in report.problems} == {shards[0].name, *missing}
    assert report.shards == len(shards)


def write_index_of_missing_shards(root, count: int) -> None:
    """An index of ``count`` one-sample shards, none of which exists, written in seconds."""
    entry = '{"name": "s-%07d.tar", "samples": 1, "bytes": 2048, "sha256": "' + "0" * 64 + '"}'
    shards = ", ".join(entry % i for i in range(count))
    split = f'"samples": {count}, "bytes": {2048 * count}, "class_counts": [{count}], "shards": [{shards}]'
    root.mkdir()
    (root / "index.json").write_text(
        f'{{"format": "imgshards", "version": 1, "classes": ["a"], "splits": {{"train": {{{split}}}}}}}'
    )


@pytest.mark.exclusive  # times it
def test_a_million_missing_shards_are_summed_up_in_one_report_within_a_minute(tmp_path):
    root = tmp_path / "gone"
    write_index_of_missing_shards(root, 1_000_000)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "imgshards.cli", "verify", str(root)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    took = time.monotonic() - started
    lines = done.stderr.splitlines()
    assert done.returncode == 1, done.stderr[-2000:]
    assert lines[:2] == [f"BAD train/s-{i:07d}.tar: missing (expected 2048 bytes)" for i in range(2)]
    assert len(lines) == SHOWN_PROBLEMS + 2 and "Traceback" not in done.stderr
    assert lines[-2] == "BAD ... and 999,980 more problems; --json lists every one"
    assert lines[-1] == f"Error: 1,000,000 problems in 1,000,000 shards of {root}"
    assert took < 60, f"{took:.0f} s"
