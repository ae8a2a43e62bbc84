"""Writing a split's tables as files (converter/write/tablefiles.py), and the index's one writer at a time.

``write_tables`` and ``as_format2`` turn format 1's inline tables into files, a shard at a time, the
same bytes and names every time; ``stale_tables`` lists what an index no longer names;
``update_index`` (converter/write/destination.py) holds the index lock every writer takes.
"""

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from imgshards.converter import DestinationError, ManifestError, read_manifest
from imgshards.converter.format.manifest import INDEX_NAME, Manifest
from imgshards.converter.write.destination import INDEX_LOCK, locked, update_index
from imgshards.converter.write.tablefiles import as_format2, remove_stale_tables, stale_tables, write_tables

FORMAT1 = Path(__file__).resolve().parents[1] / "format1" / "dataset"


@pytest.fixture
def old(tmp_path):
    return Path(shutil.copytree(FORMAT1, tmp_path / "old"))


def test_the_same_split_writes_the_same_files(tmp_path):
    split = read_manifest(FORMAT1).split("train")
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    a, b = write_tables(first, split), write_tables(second, split)
    assert a == b and sorted(a.tables) == ["keys", "labels", "sources", "starts"]
    assert {p.name: p.read_bytes() for p in first.iterdir()} == {
        p.name: p.read_bytes() for p in second.iterdir()
    }
    assert all(s.offsets is None and s.sources is None and s.sources_bytes for s in a.shards)
    assert write_tables(first, a) is a  # already format 2
    assert not list(first.glob(".*")), "a temporary file stayed"


def test_a_table_some_shard_lacks_is_left_out(tmp_path):
    split = read_manifest(FORMAT1).split("train")
    shards = (replace(split.shards[0], keys=None, sources=None), *split.shards[1:])
    written = write_tables(tmp_path, replace(split, shards=shards))
    assert sorted(written.tables) == ["labels", "starts"]
    assert all(s.sources_bytes is None for s in written.shards)


def test_as_format2_writes_every_split_and_the_index_reads_back(old):
    manifest = as_format2(old, read_manifest(old))
    assert manifest.version == 2 and not stale_tables(old, manifest)
    (old / INDEX_NAME).write_text(manifest.dumps())
    assert read_manifest(old) == manifest
    assert as_format2(old, manifest) == manifest


def test_stale_tables_are_those_the_index_does_not_name(old, tmp_path):
    manifest = as_format2(old, read_manifest(old))
    stale = old / "train=labels.0123456789abcdef.u32"
    stale.write_bytes(b"")
    target = tmp_path / "outside.u32"
    target.write_bytes(b"keep")
    os.symlink(target, old / "val=keys.0123456789abcdef.u32")  # a link planted at a table's name
    (old / "notes.u32").write_bytes(b"")  # not a table's name: not ours to remove
    assert [p.name for p in stale_tables(old, manifest)] == [
        "train=labels.0123456789abcdef.u32",
        "val=keys.0123456789abcdef.u32",
    ]
    remove_stale_tables(old, manifest)
    assert not stale.exists() and not os.path.lexists(old / "val=keys.0123456789abcdef.u32")
    assert target.read_bytes() == b"keep" and (old / "notes.u32").exists()


def test_update_index_upgrades_what_it_keeps_and_removes_what_it_no_longer_names(old):
    first = update_index(old, lambda current: current)
    assert first is not None and first.version == 2 and read_manifest(old) == first
    names = set(first.split("train").table_names)
    assert names <= {p.name for p in old.iterdir()}
    dropped = update_index(old, lambda current: Manifest(current.classes, {}))
    assert dropped is not None and not dropped.splits
    assert not names & {p.name for p in old.iterdir()}  # no index names them now
    assert update_index(old, lambda current: None) == read_manifest(old)  # None: left as it is


def test_a_change_that_fails_leaves_the_index_and_no_table_file(old):
    before = (old / INDEX_NAME).read_bytes()

    def refuse(current):
        raise ManifestError("no")

    with pytest.raises(ManifestError, match="no"):
        update_index(old, refuse)
    assert (old / INDEX_NAME).read_bytes() == before and not list(old.glob("train.*"))


def test_a_writer_waits_for_the_index_lock_then_gives_up_in_one_line(old, monkeypatch):
    monkeypatch.setattr("imgshards.converter.write.destination.INDEX_LOCK_WAIT", 0.0)
    (old / ".imgshards").mkdir(exist_ok=True)
    busy = f"another command has been writing the index of {old}"
    with locked(old, old / INDEX_LOCK, "held by this test"), pytest.raises(DestinationError, match=busy):
        update_index(old, lambda current: current)
    assert read_manifest(old).version == 1  # nothing written
