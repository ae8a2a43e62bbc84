"""``verify``: every shard re-hashed and recounted against the index, and its tables; a flood summed up."""

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest

from imgshards.cli.verify import SHOWN_PROBLEMS
from imgshards.converter import ManifestError, PackConfig, pack, read_manifest, verify, verify_url

FORMAT1 = Path(__file__).resolve().parents[1] / "format1" / "dataset"  # as the last release packed it


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


# ---- the tables: each file against the index, each shard's entries against the shard ----------


def table(root, name):
    return root / read_manifest(root).split("train").tables[name].name


def test_a_damaged_or_missing_table_file_is_named_with_what_writes_it_again(copy):
    labels, keys = table(copy, "labels"), table(copy, "keys")
    data = bytearray(labels.read_bytes())
    data[0] ^= 0x01  # the first sample's class id: still a class, another one
    labels.write_bytes(bytes(data))
    keys.unlink()
    report = verify(copy, workers=2)
    by_file = {p.shard: p.problem for p in report.problems}
    assert by_file[labels.name].startswith("SHA-256 differs from the index: the file changed or is damaged")
    assert by_file[keys.name].startswith("missing (expected 160 bytes)")
    for problem in by_file.values():
        assert "a table file of the index; run the `imgshards pack` that wrote split 'train' again" in problem
    # Tables found damaged are reported once, as files, not again at every shard.
    assert set(by_file) == {labels.name, keys.name} and report.tables == 4


def test_the_tables_entries_are_checked_against_the_shards(copy):
    # A table whose file is what the index says, but whose entries are not the shards': a writer's bug.
    path = table(copy, "labels")
    data = path.read_bytes()
    shifted = data[4:] + data[:4]
    path.write_bytes(shifted)
    index = json.loads((copy / "index.json").read_text())
    index["splits"]["train"]["tables"]["labels"]["sha256"] = hashlib.sha256(shifted).hexdigest()
    (copy / "index.json").write_text(json.dumps(index))
    report = verify(copy, workers=2)
    assert report.problems and all(
        "differ from the index's labels table" in p.problem for p in report.problems
    )
    assert "has class id" in report.problems[0].problem and "the table says" in report.problems[0].problem


def test_a_run_of_the_same_pack_writes_a_damaged_table_again(copy, tiny_tree):
    path = table(copy, "starts")
    path.write_bytes(b"\0" * path.stat().st_size)
    assert not verify(copy, workers=1).ok
    pack(tiny_tree, copy, PackConfig(shard_size=20_000, workers=2))  # as tiny_packed was packed
    assert verify(copy, workers=1).ok


def test_format_1_tables_are_checked_against_the_shards(tmp_path):
    old = shutil.copytree(FORMAT1, tmp_path / "old")
    assert verify(old, workers=1).ok
    index = json.loads((old / "index.json").read_text())
    first, second = index["splits"]["train"]["shards"][:2]
    first["keys"], second["keys"] = second["keys"], first["keys"]  # well formed, the wrong samples'
    (old / "index.json").write_text(json.dumps(index))
    report = verify(old, workers=1)
    assert [p.shard for p in report.problems] == ["train-000000.tar", "train-000001.tar"]
    assert all("2 sample(s) differ from the index's keys table" in p.problem for p in report.problems)


def test_verify_url_checks_the_table_files_too(copy):
    url = "memory://imgshards-verify-tables/ds"
    fs = fsspec.filesystem("memory")
    for path in copy.iterdir():
        if path.is_file():
            fs.pipe_file(f"{url}/{path.name}", path.read_bytes())
    try:
        assert verify_url(url).ok and verify_url(url).tables == 4
        name = table(copy, "sources").name
        data = bytearray(fs.cat_file(f"{url}/{name}"))
        data[-1] ^= 0xFF
        fs.pipe_file(f"{url}/{name}", bytes(data))
        report = verify_url(url)
        assert [p.shard for p in report.problems] == [name]
        assert "SHA-256 differs" in report.problems[0].problem
    finally:
        fs.rm("/imgshards-verify-tables", recursive=True)
