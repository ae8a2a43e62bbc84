"""The index's table of sample starts: pack writes it, the index checks it, a run seeks by it.

A worker's run that starts inside a shard seeks to its first sample instead of stepping over the
tar headers of the samples before it. It must read exactly what the walk reads, and a table that
does not match its shard must cost a damaged-shard report, never a wrong sample.
"""

from __future__ import annotations

import json
import shutil
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from imgshards.converter import ManifestError, read_manifest
from imgshards.converter.format.manifest import split_member_name
from imgshards.converter.format.tables import decode_table, encode_table, key_digest
from imgshards.loader import ImageFolder, ShardDataset
from imgshards.loader.pipeline.tar import read_run


@pytest.fixture(scope="module")
def shard(packed_few, tables_of):
    """The first shard of ``packed_few``: its path, its entry, where each sample starts, its keys."""
    tables = tables_of(packed_few)
    info = tables.split.shards[0]
    keys = tables.keys(0)
    assert keys is not None
    return packed_few / info.name, info, tables.starts(0).tolist(), keys.tolist()


def first_headers(path) -> list[int]:
    """Where each sample's first member header is, by tarfile's reading of the shard."""
    starts, key = [], None
    with tarfile.open(path) as tar:
        for member in tar:
            k = split_member_name(member.name)[0]
            if k != key:
                starts.append(member.offset)
                key = k
    return starts


def test_pack_writes_where_every_sample_starts_and_each_keys_crc(packed_many, tables_of):
    tables = tables_of(packed_many)
    for s, info in enumerate(tables.split.shards):
        path = packed_many / info.name
        assert tables.starts(s).tolist() == first_headers(path) and len(first_headers(path)) == info.samples
        keys = tables.keys(s)
        assert keys is not None and keys.tolist() == [
            key_digest(s.key) for s in read_run(path, 0, info.samples)
        ]


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_a_run_that_seeks_reads_what_the_walk_reads(shard, data):
    path, info, starts, keys = shard
    start = data.draw(st.integers(0, info.samples - 1))
    stop = data.draw(st.integers(start + 1, info.samples))
    walked = [(s.key, s.label, s.data) for s in read_run(path, start, stop)]
    sought = read_run(path, start, stop, offset=starts[start], expect=keys[start])
    assert [(s.key, s.label, s.data) for s in sought] == walked and len(walked) == stop - start


def test_a_table_that_points_inside_a_member_costs_a_report_not_a_wrong_sample(shard):
    path, _, starts, _ = shard
    reports = []
    wrong = starts[5] + 512  # the image's data, not a header
    samples = list(read_run(path, 5, 9, offset=wrong, on_truncated=reports.append))
    assert samples == [] and len(reports) == 1
    assert "4 of the 4 samples [5, 9) read here are lost" in reports[0]


def test_a_table_that_points_at_another_sample_costs_a_report_not_a_wrong_sample(shard):
    path, _, starts, keys = shard
    reports: list[str] = []
    samples = list(read_run(path, 5, 9, offset=starts[6], expect=keys[5], on_truncated=reports.append))
    assert samples == [] and len(reports) == 1  # sample 6 is where the table says 5 starts: not read as 5
    assert "sample 5 is not where the index's table of starts says" in reports[0]
    assert "the 4 samples [5, 9) read here are lost" in reports[0] and "imgshards verify" in reports[0]
    # Without the key's CRC (an index without the table of keys) a seek trusts the table of starts.
    assert len(list(read_run(path, 5, 9, offset=starts[6]))) == 4


def test_a_table_past_a_truncated_shards_end_reads_what_is_left(shard, tmp_path):
    path, _, starts, keys = shard
    cut = tmp_path / path.name
    cut.write_bytes(path.read_bytes()[: starts[10]])
    reports = []
    samples = list(read_run(cut, 12, 14, offset=starts[12], expect=keys[12], on_truncated=reports.append))
    assert samples == [] and len(reports) == 1 and "holds only 10 readable sample(s)" in reports[0]


def test_the_loader_delivers_the_same_epoch_with_and_without_the_table(packed_many, tmp_path, index_rewriter):
    bare = tmp_path / "bare"
    shutil.copytree(packed_many, bare)
    index_rewriter(bare, drop=["starts"])  # an index written before the table, or by another tool

    def epoch(root):
        ds = ShardDataset(root, batch_size=8, transform="eval", image_size=32, seed=3)
        ds.set_epoch(1)
        return [(b.labels.tolist(), b.images.sum().item()) for b in ds]

    assert epoch(bare) == epoch(packed_many)


@pytest.mark.parametrize(
    ("offsets", "says"),
    [
        (lambda t: encode_table(decode_table(t)[:-1]), "one entry per sample"),
        (lambda t: encode_table(list(reversed(decode_table(t)))), "strictly increasing"),
        (lambda t: encode_table([0, *[2**32 - 1] * (len(decode_table(t)) - 1)]), "strictly increasing"),
        (lambda t: "not base64!", "base64 of 4-byte entries"),
        (lambda t: 17, "a base64 string"),
    ],
    ids=["short", "not-from-zero", "past-the-end", "not-base64", "not-a-string"],
)
def test_an_index_of_format_1_refuses_a_table_that_cannot_be_the_shards(
    packed_few, tmp_path, offsets, says, format1
):
    ds = format1(packed_few, tmp_path / "ds")
    index = json.loads((ds / "index.json").read_text())
    shard = index["splits"]["train"]["shards"][0]
    shard["offsets"] = offsets(shard["offsets"])
    (ds / "index.json").write_text(json.dumps(index))
    with pytest.raises(ManifestError, match=r"splits\.train\.shards\[0\]\.offsets is .*" + says):
        read_manifest(ds)


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda t, n: [*reversed(t[:n]), *t[n:]], "not increasing inside the shard"),
        (lambda t, n: [0, *[2**32 - 1] * (n - 1), *t[n:]], "not increasing inside the shard"),
    ],
    ids=["not-from-zero", "past-the-end"],
)
def test_a_table_file_that_cannot_be_the_shards_is_refused_where_it_is_used(
    packed_few, tmp_path, edit, says, entries_of, index_rewriter, tables_of
):
    ds = tmp_path / "ds"
    shutil.copytree(packed_few, ds)
    n = read_manifest(ds).split("train").shards[0].samples
    index_rewriter(ds, tables={"starts": edit(entries_of(ds)["starts"].tolist(), n)})
    tables = tables_of(ds)
    tables.starts(1)  # another shard's entries are used as they are
    with pytest.raises(
        ManifestError, match=r"table starts of split 'train' \(train=starts\..*\.u32\).*" + says
    ):
        tables.starts(0)
    with pytest.raises(ManifestError, match=says):  # a read by position, or a run that seeks there
        ImageFolder(ds)[0]
