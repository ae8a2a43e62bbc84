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
from imgshards.converter.format.tables import decode_table, encode_table
from imgshards.loader import ShardDataset
from imgshards.loader.pipeline.tar import read_run


@pytest.fixture(scope="module")
def shard(packed_few):
    info = read_manifest(packed_few).split("train").shards[0]
    return packed_few / info.name, info


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


def test_pack_writes_where_every_sample_starts(packed_many):
    for info in read_manifest(packed_many).split("train").shards:
        starts = first_headers(packed_many / info.name)
        assert len(starts) == info.samples
        assert [info.sample_offset(i) for i in range(info.samples)] == starts
    assert info.sample_offset(info.samples) is None


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_a_run_that_seeks_reads_what_the_walk_reads(shard, data):
    path, info = shard
    start = data.draw(st.integers(0, info.samples - 1))
    stop = data.draw(st.integers(start + 1, info.samples))
    walked = [(s.key, s.label, s.data) for s in read_run(path, start, stop)]
    sought = [(s.key, s.label, s.data) for s in read_run(path, start, stop, offset=info.sample_offset(start))]
    assert sought == walked and len(walked) == stop - start


def test_a_table_that_points_inside_a_member_costs_a_report_not_a_wrong_sample(shard):
    path, info = shard
    reports = []
    wrong = info.sample_offset(5) + 512  # the image's data, not a header
    samples = list(read_run(path, 5, 9, offset=wrong, on_truncated=reports.append))
    assert samples == [] and len(reports) == 1
    assert "4 of the 4 samples [5, 9) read here are lost" in reports[0]


def test_a_table_past_a_truncated_shards_end_reads_what_is_left(shard, tmp_path):
    path, info = shard
    cut = tmp_path / path.name
    cut.write_bytes(path.read_bytes()[: info.sample_offset(10)])
    reports = []
    samples = list(read_run(cut, 12, 14, offset=info.sample_offset(12), on_truncated=reports.append))
    assert samples == [] and len(reports) == 1 and "holds only 10 readable sample(s)" in reports[0]


def test_the_loader_delivers_the_same_epoch_with_and_without_the_table(packed_many, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(packed_many, bare)
    index = json.loads((bare / "index.json").read_text())
    for shard in index["splits"]["train"]["shards"]:
        del shard["offsets"]  # an index written before the table, or by `imgshards index`
    (bare / "index.json").write_text(json.dumps(index))

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
def test_the_index_refuses_a_table_that_cannot_be_the_shards(packed_few, tmp_path, offsets, says):
    ds = tmp_path / "ds"
    shutil.copytree(packed_few, ds)
    index = json.loads((ds / "index.json").read_text())
    shard = index["splits"]["train"]["shards"][0]
    shard["offsets"] = offsets(shard["offsets"])
    (ds / "index.json").write_text(json.dumps(index))
    with pytest.raises(ManifestError, match=r"splits\.train\.shards\[0\]\.offsets is .*" + says):
        read_manifest(ds)
