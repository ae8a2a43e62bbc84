"""Index format 2: a split's tables as files (converter/format/tablefiles.py), read by ``SplitTables``.

Round trips through ``pack`` and ``read_manifest``, mapped and fetched; hostile tables refused when
the split is opened or a shard's entries are used, never read as another sample's; a format-1
dataset as the last release wrote it (tests/converter/format1/) read through the same class.
"""

import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from imgshards.converter import ManifestError, PackConfig, pack, read_manifest
from imgshards.converter.format.tablefiles import (
    ENTRY,
    SplitTables,
    decode_sources_chunk,
    encode_sources_chunk,
    table_file_name,
)
from imgshards.converter.format.tables import BLOCK, key_digest
from imgshards.converter.format.tarsamples import checked_samples
from imgshards.converter.format.tarstream import TarStream, stream_end
from imgshards.converter.format.validate import open_regular

FORMAT1 = Path(__file__).resolve().parents[1] / "format1" / "dataset"


@pytest.fixture(scope="module")
def packed(tiny_tree, tmp_path_factory):
    dst = tmp_path_factory.mktemp("format2") / "ds"
    pack(tiny_tree, dst, PackConfig(shard_size=20_000, workers=1))
    return dst


@pytest.fixture
def copy(packed, tmp_path):
    return Path(shutil.copytree(packed, tmp_path / "copy"))


def opened(root, split="train", **kwargs):
    manifest = read_manifest(root)
    return SplitTables(manifest.split(split), len(manifest.classes), root=root, **kwargs), manifest


def shard_samples(path):
    """(start in bytes, key, class id) of each sample of the shard at ``path``, as the tar reader reads it."""
    with open_regular(path) as f:
        tar = TarStream(f, end=stream_end(f), seekable=False)
        return [(s.start, s.key, int(value)) for s, value, _ in checked_samples(tar, "cls")]


def table_path(root, table, split="train"):
    return root / read_manifest(root).split(split).tables[table].name


def test_a_pack_writes_one_file_a_table_named_by_its_content(packed):
    split = read_manifest(packed).split("train")
    assert sorted(split.tables) == ["keys", "labels", "sources", "starts"]
    for table, entry in split.tables.items():
        path = packed / entry.name
        assert entry.name == table_file_name("train", table, entry.sha256)
        assert path.stat().st_size == entry.bytes
    assert split.tables["starts"].bytes == 4 * split.samples
    assert sum(s.sources_bytes for s in split.shards) == split.tables["sources"].bytes
    index = json.loads((packed / "index.json").read_text())
    assert index["version"] == 2 and not {"offsets", "labels", "keys"} & set(
        index["splits"]["train"]["shards"][0]
    )


def test_the_tables_say_what_the_shards_hold_mapped_or_fetched(packed):
    tables, manifest = opened(packed)
    split = manifest.split("train")

    def fetch(entry, lo, hi):
        with open(packed / entry.name, "rb") as f:
            f.seek(lo)
            return f.read(hi - lo)

    fetched = SplitTables(split, len(manifest.classes), fetch=fetch, where="http://host/ds")
    every = []
    for s, shard in enumerate(split.shards):
        held = shard_samples(packed / shard.name)
        every += [label for _, _, label in held]
        for t in (tables, fetched):
            assert t.starts(s).tolist() == [start for start, _, _ in held]
            assert t.keys(s).tolist() == [key_digest(key) for _, key, _ in held]
            assert t.labels(s).tolist() == [label for _, _, label in held]
            assert len(t.sources(s)) == shard.samples and all(p.endswith(".JPEG") for p in t.sources(s))
    assert tables.all_labels().tolist() == every == fetched.all_labels().tolist()
    assert tables.version == 2 and tables.samples == split.samples == 40
    assert [tables.shard_of(i) for i in (0, split.shards[0].samples, 39)] == [0, 1, len(split.shards) - 1]


def test_a_split_tables_pickles_before_and_after_use(packed):
    tables, _ = opened(packed)
    fresh = pickle.loads(pickle.dumps(tables))
    assert fresh.labels(1).tolist() == tables.labels(1).tolist()  # tables mapped now
    again = pickle.loads(pickle.dumps(tables))  # the maps are not pickled: mapped again on first use
    assert again.starts(0).tolist() == tables.starts(0).tolist()
    assert again.sources(0) == tables.sources(0)


def test_a_sources_stream_decodes_no_more_than_its_samples_may_hold():
    paths = ["cat/1.jpg", "dog/\udcff.jpg"]  # a name that is not UTF-8, as read
    chunk = encode_sources_chunk(paths)
    assert decode_sources_chunk(chunk, 2) == paths
    for bad, samples in ((chunk, 3), (chunk[:-2], 2), (chunk + b"\0", 2), (b"not zlib", 1)):
        with pytest.raises(ValueError):
            decode_sources_chunk(bad, samples)


# ---- hostile tables: refused at open or where used, never another sample's entry ---------------


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda data: data[:-4], id="short"),
        pytest.param(lambda data: data + b"\0\0\0\0", id="long"),
    ],
)
def test_a_table_file_of_another_size_is_refused_when_mapped(copy, change):
    path = table_path(copy, "labels")
    path.write_bytes(change(path.read_bytes()))
    tables, _ = opened(copy)
    with pytest.raises(ManifestError, match=rf"{path.name}.* bytes where the index says 160"):
        tables.labels(0)
    with pytest.raises(ManifestError, match="imgshards verify"):
        tables.all_labels()


def test_starts_shifted_by_one_entry_are_refused_where_used(copy):
    path = table_path(copy, "starts")
    data = path.read_bytes()
    path.write_bytes(data[4:] + data[:4])  # the same size: each sample would read its neighbour's
    tables, _ = opened(copy)
    with pytest.raises(ManifestError, match="starts are not increasing inside the shard"):
        tables.starts(0)
    assert tables.keys(0) is not None  # the other tables still read


def test_a_wrong_count_in_the_index_is_refused_when_it_is_read(copy):
    index = json.loads((copy / "index.json").read_text())
    index["splits"]["train"]["tables"]["keys"]["bytes"] += 4
    (copy / "index.json").write_text(json.dumps(index))
    with pytest.raises(ManifestError, match=r"splits\.train\.tables\.keys\.bytes is 164, expected 160"):
        read_manifest(copy)
    index["splits"]["train"]["tables"]["keys"]["bytes"] -= 4
    index["splits"]["train"]["shards"][0]["sources_bytes"] += 1  # the sources no longer add up
    (copy / "index.json").write_text(json.dumps(index))
    with pytest.raises(ManifestError, match=r"splits\.train\.tables\.sources\.bytes"):
        read_manifest(copy)


def test_labels_out_of_range_are_refused_where_used(copy):
    path = table_path(copy, "labels")
    labels = np.frombuffer(path.read_bytes(), dtype=ENTRY).copy()
    labels[-1] = 4  # 4 classes: ids 0..3
    path.write_bytes(labels.tobytes())
    tables, manifest = opened(copy)
    assert tables.labels(0) is not None  # the first shard's are fine
    with pytest.raises(ManifestError, match="not below the index's 4 classes"):
        tables.labels(len(manifest.split("train").shards) - 1)
    with pytest.raises(ManifestError, match="not below the index's 4 classes"):
        opened(copy)[0].all_labels()


def test_a_missing_table_file_says_the_dataset_changed(copy):
    path = table_path(copy, "starts")
    path.unlink()
    tables, _ = opened(copy)
    with pytest.raises(ManifestError, match=f"{path} is missing: the dataset at .* was re-packed"):
        tables.starts(0)


def test_a_table_file_swapped_for_a_link_out_of_the_root_is_refused(copy, tmp_path):
    path = table_path(copy, "labels")
    outside = tmp_path / "outside.u32"
    outside.write_bytes(path.read_bytes())  # the right size and content, out of the dataset
    path.unlink()
    os.symlink(outside, path)
    tables, _ = opened(copy)
    with pytest.raises(ManifestError, match="outside the dataset"):
        tables.labels(0)


def test_a_sources_stream_not_what_it_must_be_is_refused_for_its_shard(copy):
    path = table_path(copy, "sources")
    data = bytearray(path.read_bytes())
    data[2] ^= 0xFF  # inside the first shard's zlib stream
    path.write_bytes(bytes(data))
    tables, _ = opened(copy)
    with pytest.raises(ManifestError, match="paths are not what they must be"):
        tables.sources(0)
    assert tables.sources(1) is not None  # the next shard's stream is its own


# ---- format 1, as the last release (39ce913) wrote it: tests/converter/format1/ -----------------


def test_a_format_1_dataset_reads_through_the_same_class():
    manifest = read_manifest(FORMAT1)
    assert manifest.version == 1 and manifest.classes == ("cat", "dog")
    split = manifest.split("train")
    assert not split.tables and all(s.offsets and s.sources for s in split.shards)
    tables = SplitTables(split, 2, root=FORMAT1)
    assert tables.version == 1 and tables.samples == 6
    for s, shard in enumerate(split.shards):
        held = shard_samples(FORMAT1 / shard.name)
        assert tables.starts(s).tolist() == [start for start, _, _ in held]
        assert tables.keys(s).tolist() == [key_digest(key) for _, key, _ in held]
        assert tables.labels(s).tolist() == [label for _, _, label in held]
        assert len(tables.sources(s)) == 2
    assert sorted(tables.all_labels().tolist()) == [0, 0, 0, 1, 1, 1]
    assert tables.starts(0)[0] % BLOCK == 0
    assert pickle.loads(pickle.dumps(tables)).labels(2).tolist() == tables.labels(2).tolist()
