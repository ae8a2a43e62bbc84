import shutil

import pytest

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
