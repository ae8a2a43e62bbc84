"""Reading runs of samples out of real shards written by ``pack``."""

from __future__ import annotations

import pytest

from imgshards.converter.manifest import read_manifest
from imgshards.loader.reader import read_run


@pytest.fixture(scope="module")
def shard(packed_few):
    info = read_manifest(packed_few).split("train").shards[0]
    return packed_few / info.name, info.samples


def test_whole_shard_in_stored_order(shard, lookup_few):
    path, n = shard
    samples = list(read_run(path, 0, n))
    assert len(samples) == n
    assert len({s.key for s in samples}) == n
    assert all(s.ext == "jpg" and s.shard == path.name for s in samples)
    assert all(s.label == lookup_few.label_of[s.key] for s in samples)


@pytest.mark.parametrize("start, stop", [(0, 1), (5, 9), (17, 40), (39, 40)])
def test_a_run_is_the_same_slice_of_the_shard(shard, start, stop):
    path, n = shard
    everything = [s.key for s in read_run(path, 0, n)]
    assert [s.key for s in read_run(path, start, stop)] == everything[start:stop]


def test_truncated_shard_yields_what_it_has_and_reports_once(shard, tmp_path):
    path, n = shard
    data = path.read_bytes()
    cut = tmp_path / path.name
    cut.write_bytes(data[: len(data) // 2])
    reports = []
    samples = list(read_run(cut, 0, n, on_truncated=reports.append))
    assert 0 < len(samples) < n
    assert len(reports) == 1
    assert path.name in reports[0] and f"ended after sample {len(samples)}" in reports[0]
    with pytest.warns(RuntimeWarning, match="truncated"):
        assert len(list(read_run(cut, 0, n))) == len(samples)


def test_garbage_file_reports_instead_of_raising(tmp_path):
    bad = tmp_path / "train-000000.tar"
    bad.write_bytes(b"not a tar file at all" * 100)
    reports = []
    assert list(read_run(bad, 0, 5, on_truncated=reports.append)) == []
    assert len(reports) == 1
