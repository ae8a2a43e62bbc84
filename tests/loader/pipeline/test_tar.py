"""Reading runs of samples out of real shards written by ``pack`` (and by tarfile, in its three formats)."""

from __future__ import annotations

import io
import tarfile

import pytest

from imgshards.converter.format.manifest import read_manifest
from imgshards.loader.pipeline.tar import read_run


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
    assert path.name in reports[0] and f"holds only {len(samples)} readable sample" in reports[0]
    with pytest.warns(RuntimeWarning, match="truncated"):
        assert len(list(read_run(cut, 0, n))) == len(samples)


def test_garbage_file_reports_instead_of_raising(tmp_path):
    bad = tmp_path / "train-000000.tar"
    bad.write_bytes(b"not a tar file at all" * 100)
    reports = []
    assert list(read_run(bad, 0, 5, on_truncated=reports.append)) == []
    assert len(reports) == 1


def test_same_samples_as_webdatasets_own_reading(packed_many):
    import webdataset as wds

    shards = read_manifest(packed_many).split("train").shards
    for info in shards[:3]:
        path = packed_many / info.name
        theirs = [
            (s["__key__"], s["jpg"], int(s["cls"]))
            for s in wds.WebDataset(str(path), shardshuffle=False, empty_check=False)
        ]
        ours = [(s.key, bytes(s.data), s.label) for s in read_run(path, 0, info.samples)]
        assert ours == theirs


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_reads_ustar_gnu_and_pax_headers(tmp_path, fmt):
    path = tmp_path / "s.tar"
    long_dir = "d" * 120 if fmt != tarfile.USTAR_FORMAT else "d" * 40
    with tarfile.open(path, "w", format=fmt) as tar:
        for i in range(3):
            for ext, data in (
                ("jpg", b"\xff\xd8" + bytes([i]) * 700),
                ("cls", str(i).encode()),
                ("json", b"{}"),
            ):
                info = tarfile.TarInfo(f"{long_dir}/k{i}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    samples = list(read_run(path, 0, 3))
    assert [(s.key, s.label, len(s.data)) for s in samples] == [
        (f"{long_dir}/k{i}", i, 702) for i in range(3)
    ]
    assert [s.key for s in read_run(path, 1, 2)] == [f"{long_dir}/k1"]


def test_a_damaged_header_ends_the_shard_with_a_report(shard, tmp_path):
    path, n = shard
    with tarfile.open(path) as tar:
        at = tar.getmembers()[30].offset  # the header of the 11th sample's image
    data = bytearray(path.read_bytes())
    data[at : at + 512] = b"\x07" * 512
    bad = tmp_path / path.name
    bad.write_bytes(bytes(data))
    reports = []
    samples = list(read_run(bad, 0, n, on_truncated=reports.append))
    assert len(samples) == 10 and len(reports) == 1
    assert "holds only 10 readable sample(s)" in reports[0]
    assert f"{n - 10} of the {n} samples [0, {n}) read here are lost" in reports[0]
