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
