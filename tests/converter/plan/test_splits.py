"""A held-out split from one tree (--val-fraction) and splits from a file (--split-file)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from hypothesis import given, settings
from hypothesis import strategies as st
from torchvision.datasets import ImageFolder

from imgshards.converter import PackConfig, SourceError, SplitFileError, pack, read_manifest
from imgshards.converter.plan.splits import held_out_count, split_stratified
from imgshards.converter.scan.tree import PathTable, ScanResult


def _fake_scan(sizes: list[int]) -> ScanResult:
    paths = [f"c{c}/{i}.jpg" for c, n in enumerate(sizes) for i in range(n)]
    labels = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
    return ScanResult(
        root=Path("/nowhere"),
        classes=tuple(f"c{c}" for c in range(len(sizes))),
        paths=PathTable.from_paths(paths),
        labels=labels,
        sizes=np.full(len(paths), 100, dtype=np.int64),
        inodes=np.arange(len(paths), dtype=np.uint64),
    )


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    fraction=st.floats(0.01, 0.99),
    seed=st.integers(0, 2**32),
)
def test_stratified_split_is_a_per_class_partition(sizes, fraction, seed):
    scan = _fake_scan(sizes)
    train, val = split_stratified(scan, ("train", "val"), fraction, seed)
    assert sorted([*train.positions, *val.positions]) == list(range(len(scan)))  # a partition
    for c, n in enumerate(sizes):
        held = int((val.scan.labels == c).sum())
        assert held == held_out_count(n, fraction)
        if n >= 2:
            assert 1 <= held <= n - 1  # a sample in each split
            assert abs(held - n * fraction) <= max(1, n * fraction)
        else:
            assert held == 0
    for part in (train, val):  # positions and sub-scan agree, in ImageFolder order
        assert list(part.positions) == sorted(part.positions)
        assert list(part.scan.paths) == [scan.paths[int(i)] for i in part.positions]
    again = split_stratified(scan, ("train", "val"), fraction, seed)
    assert np.array_equal(again[1].positions, val.positions)  # a pure function of tree and seed


def test_adding_a_file_moves_no_other_file(tmp_path):
    before = split_stratified(_fake_scan([30, 30]), ("train", "val"), 0.2, 7)[1]
    after = split_stratified(_fake_scan([31, 30]), ("train", "val"), 0.2, 7)[1]  # c0/30.jpg added
    held = lambda part: {p for p in part.scan.paths if p.startswith("c1/")}  # noqa: E731
    assert held(before) == held(after)


def _outputs(root: Path) -> dict[str, bytes]:
    files = [*root.iterdir(), *root.glob(".imgshards/rejects/*")]
    return {str(p.relative_to(root)): p.read_bytes() for p in files if p.is_file()}


def test_val_fraction_writes_two_splits_sharing_one_label_index(tiny_tree, tmp_path):
    config = dict(shard_size=20_000, val_fraction=0.25, seed=3)  # 10 * 0.25 = 2.5: 3 per class
    result = pack(tiny_tree, tmp_path / "a", PackConfig(workers=1, **config))
    manifest = read_manifest(tmp_path / "a")
    assert result.splits == ("train", "val") and sorted(manifest.splits) == ["train", "val"]
    assert manifest.split("train").class_counts == (7, 7, 7, 7)
    assert manifest.split("val").class_counts == (3, 3, 3, 3)
    assert manifest.class_to_idx == ImageFolder(str(tiny_tree)).class_to_idx
    assert manifest.split("val").pack_args["val_fraction"] == 0.25
    # keys are positions in ImageFolder(SRC).samples, unique across the two splits
    samples = ImageFolder(str(tiny_tree)).samples
    keys = []
    for split in ("train", "val"):
        urls = [str(tmp_path / "a" / s.name) for s in manifest.split(split).shards]
        for s in wds.WebDataset(urls, shardshuffle=False):
            path, label = samples[int(s["__key__"])]
            assert Path(path).relative_to(tiny_tree).as_posix() == json.loads(s["json"])["path"]
            assert int(s["cls"]) == label
            keys.append(s["__key__"])
    assert len(keys) == len(set(keys)) == 40
    # the same with 3 workers and the other read order: byte-identical
    pack(tiny_tree, tmp_path / "b", PackConfig(workers=3, read_order="disk", **config))
    assert _outputs(tmp_path / "a") == _outputs(tmp_path / "b")
    # interrupted (a val shard and the index lost): the re-run reuses the rest, gives the same bytes
    (tmp_path / "b" / "index.json").unlink()
    (tmp_path / "b" / manifest.split("val").shards[0].name).unlink()
    again = pack(tiny_tree, tmp_path / "b", PackConfig(workers=2, **config))
    assert (
        again.shards_written == 1
        and again.shards_reused == len(manifest.split("train").shards) + len(manifest.split("val").shards) - 1
    )
    assert _outputs(tmp_path / "a") == _outputs(tmp_path / "b")
    # another seed, another split
    other = pack(tiny_tree, tmp_path / "c", PackConfig(workers=2, **{**config, "seed": 4}))
    assert other.manifest.split("val").shards != manifest.split("val").shards


def test_val_fraction_refuses_a_tree_of_single_images(tree_factory, tmp_path):
    src = tree_factory(classes=3, per_class=1)
    with pytest.raises(SourceError, match="leaves split 'val' empty"):
        pack(src, tmp_path / "out", PackConfig(val_fraction=0.5, workers=1))


@pytest.fixture
def split_file(tiny_tree, tmp_path):
    paths = sorted(str(p.relative_to(tiny_tree)) for p in tiny_tree.rglob("*.JPEG"))
    listing = {"train": paths[:30], "test": paths[30:38]}  # two files listed nowhere
    path = tmp_path / "partition.json"
    path.write_text(json.dumps(listing))
    return path, paths


def test_split_file_packs_the_splits_it_lists_and_reports_the_rest(tiny_tree, tmp_path, split_file):
    path, paths = split_file
    result = pack(tiny_tree, tmp_path / "out", PackConfig(split_file=path, workers=2, shard_size=20_000))
    manifest = result.manifest
    assert result.splits == ("train", "test")
    assert manifest.split("train").samples == 30 and manifest.split("test").samples == 8
    rejects = (tmp_path / "out" / manifest.split("train").rejects_file).read_text().splitlines()
    assert sorted(json.loads(r)["path"] for r in rejects) == paths[38:]
    assert manifest.split("train").rejects_by_reason == {"not_in_split_file": 2}
    assert manifest.split("test").rejects_total == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "is not JSON"),
        ('["a.jpg"]', "must be a JSON object"),
        ('{"Train": []}', "split name 'Train'"),
        ('{"train": "n00000000/x.JPEG"}', "must be a list of paths"),
        ('{"train": ["nope/x.JPEG"]}', "'nope/x.JPEG'"),
        ('{"train": ["{p}"], "val": ["{p}"]}', "listed in 'train' and again in 'val'"),
        ('{"train": ["{p}"], "val": []}', "lists no image for split(s) val"),
    ],
)
def test_a_bad_split_file_is_named_with_what_is_wrong(tiny_tree, tmp_path, content, message):
    some = str(next(tiny_tree.rglob("*.JPEG")).relative_to(tiny_tree))
    path = tmp_path / "bad.json"
    path.write_text(content.replace("{p}", some))
    with pytest.raises(SplitFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pack(tiny_tree, tmp_path / "out", PackConfig(split_file=path, workers=1))
    assert not (tmp_path / "out" / "index.json").exists()


def test_split_config_is_checked_up_front():
    with pytest.raises(ValueError, match="val_fraction must be between 0 and 1"):
        PackConfig(val_fraction=1.0)
    with pytest.raises(ValueError, match="val_split must differ from split"):
        PackConfig(val_fraction=0.1, val_split="train")
    with pytest.raises(ValueError, match="not both"):
        PackConfig(val_fraction=0.1, split_file="x.json")


def test_a_moved_copy_of_the_tree_splits_the_same(tiny_tree, tmp_path):
    shutil.copytree(tiny_tree, tmp_path / "elsewhere")
    a = pack(tiny_tree, tmp_path / "a", PackConfig(val_fraction=0.3, workers=1))
    b = pack(tmp_path / "elsewhere", tmp_path / "b", PackConfig(val_fraction=0.3, workers=2))
    assert a.manifest.split("val").shards == b.manifest.split("val").shards
