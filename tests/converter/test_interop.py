"""The shards are plain WebDataset: tools people already use read them as they are."""

import json

import pytest

from imgshards.converter import read_manifest


def test_timm_wds_reader_reads_the_split_from_info_json(tiny_packed):
    timm_data = pytest.importorskip("timm.data")
    ds = timm_data.create_dataset("wds/imgshards", root=str(tiny_packed), split="train", is_training=False)
    labels = sorted(target for _, target in ds)
    counts = read_manifest(tiny_packed).split("train").class_counts
    assert labels == sorted(label for label, n in enumerate(counts) for _ in range(n))


def test_hugging_face_datasets_webdataset_builder(tiny_packed, tmp_path):
    datasets = pytest.importorskip("datasets")
    files = [str(tiny_packed / s.name) for s in read_manifest(tiny_packed).split("train").shards]
    ds = datasets.load_dataset(
        "webdataset", data_files={"train": files}, split="train", cache_dir=str(tmp_path)
    )
    assert ds.num_rows == 40
    row = ds[0]
    assert row["jpg"].size[0] > 0
    assert json.loads(json.dumps(row["json"]))["class"] in read_manifest(tiny_packed).classes


# A tree that mixes JPEG, PNG (RGB, RGBA, palette), WebP, BMP (RGB, gray) and TIFF, packed with the
# defaults and --val-fraction 0.2 (tests/converter/conftest.py): every reader sees every sample.


def _paths(packed, split):
    return sorted(json.loads(s["json"])["path"] for s in _wds(packed, split))


def _wds(packed, split):
    wds = pytest.importorskip("webdataset")
    urls = [str(packed / s.name) for s in read_manifest(packed).split(split).shards]
    return wds.WebDataset(urls, shardshuffle=False)


def test_mixed_tree_every_sample_through_plain_webdataset(mixed_packed, mixed_tree):
    manifest = read_manifest(mixed_packed)
    seen = {
        split: list(_wds(mixed_packed, split).decode("pil").to_tuple("jpg", "cls"))
        for split in ("train", "val")
    }
    assert {k: len(v) for k, v in seen.items()} == {"train": 32, "val": 8}
    assert all(image.size == (64, 48) for split in seen.values() for image, _ in split)
    everything = sorted(_paths(mixed_packed, "train") + _paths(mixed_packed, "val"))
    assert everything == sorted(str(p.relative_to(mixed_tree)) for p in mixed_tree.rglob("*.*"))
    assert manifest.split("train").formats == {"jpg": 32} and manifest.split("val").formats == {"jpg": 8}


def test_mixed_tree_every_sample_through_timm(mixed_packed):
    """timm drops (with a warning) samples without a jpg, png or webp member: none is dropped here."""
    timm_data = pytest.importorskip("timm.data")
    for split, n in (("train", 32), ("val", 8)):
        ds = timm_data.create_dataset("wds/imgshards", root=str(mixed_packed), split=split, is_training=False)
        samples = list(ds)
        assert len(samples) == n and all(image.size == (64, 48) for image, _ in samples)


@pytest.mark.parametrize("streaming", [False, True], ids=["arrow", "streaming"])
def test_mixed_tree_every_sample_through_hugging_face_data_files(mixed_packed, tmp_path, streaming):
    datasets = pytest.importorskip("datasets")
    files = {
        s: [str(mixed_packed / x.name) for x in read_manifest(mixed_packed).split(s).shards]
        for s in ("train", "val")
    }
    ds = datasets.load_dataset("webdataset", data_files=files, cache_dir=str(tmp_path), streaming=streaming)
    for split, n in (("train", 32), ("val", 8)):
        rows = list(ds[split])
        assert len(rows) == n
        assert all(row["jpg"] is not None and row["jpg"].size == (64, 48) for row in rows)


@pytest.mark.parametrize("streaming", [False, True], ids=["arrow", "streaming"])
def test_mixed_tree_every_sample_through_hugging_face_data_dir(mixed_packed, tmp_path, streaming):
    """data_dir=DST: the rejects and state files match no split pattern, so only shards are read."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset(
        "webdataset", data_dir=str(mixed_packed), cache_dir=str(tmp_path), streaming=streaming
    )
    assert sorted(ds) == ["train", "validation"]  # Hugging Face's name for "val"
    for split, n in (("train", 32), ("validation", 8)):
        rows = list(ds[split])
        assert len(rows) == n and all(row["jpg"] is not None for row in rows)
        assert {json.loads(json.dumps(row["json"]))["class"] for row in rows} <= set(
            read_manifest(mixed_packed).classes
        )
