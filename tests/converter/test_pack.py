"""``pack`` end to end: the shards as converter/plan/shards.py plans them, the index, reruns, checks."""

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image
from torchvision.datasets import ImageFolder

import imgshards.converter.format.manifest as manifest
from imgshards.converter import (
    DestinationError,
    PackConfig,
    SourceError,
    pack,
    read_manifest,
)


@pytest.fixture(scope="module")
def bad_tree(tmp_path_factory, tiny_tree):
    """tiny_tree's real JPEGs plus two PNGs (one named .jpg) and one bad file of each kind."""
    root = tmp_path_factory.mktemp("bad") / "src"
    shutil.copytree(tiny_tree, root)
    c = sorted(p.name for p in root.iterdir())
    jpeg = next(root.rglob("*.JPEG")).read_bytes()
    png = io.BytesIO()
    Image.open(io.BytesIO(jpeg)).save(png, format="PNG")
    (root / c[0] / "extra.png").write_bytes(png.getvalue())
    (root / c[1] / "misnamed.jpg").write_bytes(png.getvalue())
    bad = {
        f"{c[0]}/notes.txt": (b"text", "unsupported_extension"),
        f"{c[1]}/empty.jpg": (b"", "empty"),
        f"{c[2]}/not-an-image.jpg": (b"<html></html>", "not_image"),
        f"{c[3]}/truncated.JPEG": (jpeg[: len(jpeg) // 2], "truncated"),
    }
    for rel, (data, _) in bad.items():
        (root / rel).write_bytes(data)
    return root, {rel: reason for rel, (_, reason) in bad.items()}


def _good_samples(src: Path, rejected: set[str]) -> set[tuple[bytes, int]]:
    folder = ImageFolder(str(src), loader=lambda p: Path(p).read_bytes(), is_valid_file=lambda p: True)
    return {
        (data, label)
        for (path, label), data in zip(
            folder.samples, (Path(p).read_bytes() for p, _ in folder.samples), strict=True
        )
        if os.path.relpath(path, src) not in rejected
    }


def test_round_trip_through_plain_webdataset(bad_tree, tmp_path):
    bad_tree, expected_reasons = bad_tree
    result = pack(bad_tree, tmp_path / "out", PackConfig(shard_size=30_000, workers=2, keep_formats=True))
    out = tmp_path / "out"
    assert result.info.rejects_file == ".imgshards/rejects/train.jsonl"
    rejects = [json.loads(line) for line in (out / result.info.rejects_file).read_text().splitlines()]
    reasons = {r["path"]: r["reason"] for r in rejects}
    assert reasons == expected_reasons
    assert result.info.rejects_by_reason == {r: 1 for r in expected_reasons.values()}

    urls = [str(out / s.name) for s in result.info.shards]
    assert len(urls) > 3
    seen = [
        (s["jpg"] if "jpg" in s else s["png"], int(s["cls"]), s["__key__"], json.loads(s["json"]))
        for s in wds.WebDataset(urls, shardshuffle=False)
    ]
    expected = _good_samples(bad_tree, set(reasons))
    assert {(data, label) for data, label, _, _ in seen} == expected
    assert len(seen) == len(expected) == result.info.samples == 42
    assert sum("png" in s for s in wds.WebDataset(urls, shardshuffle=False)) == 2
    keys = [key for _, _, key, _ in seen]
    assert len(set(keys)) == len(keys) and not any("." in k for k in keys)
    manifest = read_manifest(out)
    for data, label, _, meta in seen:
        assert meta["class"] == manifest.classes[label]
        assert (bad_tree / meta["path"]).read_bytes() == data


def test_index_counts_and_timm_info(tiny_packed, tiny_tree):
    manifest = read_manifest(tiny_packed)
    split = manifest.split("train")
    assert manifest.class_to_idx == ImageFolder(str(tiny_tree)).class_to_idx
    assert list(split.class_counts) == [10, 10, 10, 10]
    assert split.samples == 40 and len(split.shards) > 1
    for shard in split.shards:
        with tarfile.open(tiny_packed / shard.name) as tar:
            assert len(tar.getnames()) == 3 * shard.samples
        assert (tiny_packed / shard.name).stat().st_size == shard.bytes
    timm = json.loads((tiny_packed / "_info.json").read_text())["splits"]["train"]
    assert timm["num_samples"] == 40
    assert timm["filenames"] == [s.name for s in split.shards]
    assert timm["shard_lengths"] == [s.samples for s in split.shards]


def test_shards_mix_classes(tree_factory, tmp_path):
    src = tree_factory(classes=8, per_class=30)
    result = pack(src, tmp_path / "out", PackConfig(shard_size=40_000, workers=2))
    for shard in result.info.shards[:-1]:
        labels = [
            int(s["cls"]) for s in wds.WebDataset(str(tmp_path / "out" / shard.name), shardshuffle=False)
        ]
        assert len(set(labels)) >= 4, labels  # a class-sorted pack would give one or two


def test_output_is_byte_identical_whatever_the_workers(tiny_tree, tmp_path):
    pack(tiny_tree, tmp_path / "a", PackConfig(shard_size=20_000, workers=1))
    pack(tiny_tree, tmp_path / "b", PackConfig(shard_size=20_000, workers=3))
    names = sorted(p.name for p in (tmp_path / "a").iterdir() if p.is_file())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir() if p.is_file())
    assert len([n for n in names if n.endswith((".u32", ".zlib"))]) == 4  # the index's table files too
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_seed_changes_the_shuffle(tiny_tree, tmp_path):
    a = pack(tiny_tree, tmp_path / "a", PackConfig(shard_size=20_000, seed=0, workers=1))
    b = pack(tiny_tree, tmp_path / "b", PackConfig(shard_size=20_000, seed=1, workers=1))
    assert [s.sha256 for s in a.info.shards] != [s.sha256 for s in b.info.shards]


def test_resize_stores_small_rgb_jpegs(tmp_path):
    src = tmp_path / "src"
    modes = {"L": "gray", "CMYK": "cmyk", "P": "palette", "RGBA": "alpha", "RGB": "rgb"}
    for mode, name in modes.items():
        (src / name).mkdir(parents=True)
        im = Image.new(mode, (400, 300))
        fmt = "JPEG" if mode in ("L", "CMYK", "RGB") else "PNG"
        im.save(src / name / f"big.{fmt.lower()}", format=fmt)
        Image.new(mode, (60, 40)).save(src / name / f"small.{fmt.lower()}", format=fmt)
    result = pack(src, tmp_path / "out", PackConfig(resize=100, quality=80, workers=1))
    samples = list(wds.WebDataset(str(tmp_path / "out" / result.info.shards[0].name), shardshuffle=False))
    assert len(samples) == 10
    for s in samples:
        meta = json.loads(s["json"])
        im = Image.open(io.BytesIO(s["jpg"]))
        assert (im.format, im.mode) == ("JPEG", "RGB"), meta
        expected = (133, 100) if "big" in meta["path"] else (60, 40)  # shorter side 100, never upscaled
        assert im.size == expected == (meta["width"], meta["height"]), meta


def test_val_split_shares_the_label_index(tree_factory, tiny_tree, tmp_path):
    out = tmp_path / "out"
    pack(tiny_tree, out, PackConfig(split="train", workers=1))
    val = tree_factory(classes=4, per_class=3, seed=1)
    pack(val, out, PackConfig(split="val", workers=1))
    manifest = read_manifest(out)
    assert sorted(manifest.splits) == ["train", "val"]
    assert manifest.split("val").samples == 12
    other = tree_factory(classes=5, per_class=2, seed=2)
    with pytest.raises(DestinationError, match="differ from those of split"):
        pack(other, out, PackConfig(split="test", workers=1))


def test_conflicting_arguments_are_refused_unless_overwrite(tiny_tree, tmp_path):
    out = tmp_path / "out"
    pack(tiny_tree, out, PackConfig(shard_size=20_000, workers=1))
    with pytest.raises(DestinationError, match=r"other arguments \(seed 0 -> 5\).*--overwrite"):
        pack(tiny_tree, out, PackConfig(shard_size=20_000, seed=5, workers=1))
    again = pack(tiny_tree, out, PackConfig(shard_size=20_000, workers=1))
    assert again.shards_written == 0 and again.shards_reused == len(again.info.shards)
    replaced = pack(tiny_tree, out, PackConfig(shard_size=1_000_000, seed=5, workers=1, overwrite=True))
    assert len(replaced.info.shards) == 1
    assert sorted(p.name for p in out.glob("*.tar")) == ["train-000000.tar"]


def test_a_damaged_finished_shard_is_rewritten_on_rerun(tiny_tree, tmp_path):
    out = tmp_path / "out"
    first = pack(tiny_tree, out, PackConfig(shard_size=20_000, workers=1))
    victim = out / first.info.shards[1].name
    good = victim.read_bytes()
    victim.write_bytes(good[:-1024] + bytes(1024) if good[-1] else good[:100])
    again = pack(tiny_tree, out, PackConfig(shard_size=20_000, workers=1))
    assert again.shards_written == 1
    assert victim.read_bytes() == good


def test_source_changed_since_the_interrupted_run_is_refused(tree_factory, tmp_path):
    src = tree_factory(classes=2, per_class=4)
    out = tmp_path / "out"
    pack(src, out, PackConfig(workers=1))
    shutil.copy(next(src.rglob("*.JPEG")), src / sorted(os.listdir(src))[0] / "new.jpg")
    with pytest.raises(DestinationError, match="different tree"):
        pack(src, out, PackConfig(workers=1))


def test_bad_source_and_destination(tmp_path, tiny_tree):
    with pytest.raises(SourceError, match="does not exist"):
        pack(tmp_path / "missing", tmp_path / "out")
    with pytest.raises(DestinationError, match="inside the source tree"):
        pack(tiny_tree, tiny_tree / "shards")


def test_config_is_validated_with_the_allowed_values():
    with pytest.raises(ValueError, match="check must be one of none, header, full"):
        PackConfig(check="deep")
    with pytest.raises(ValueError, match="split 'Train-1' must be"):
        PackConfig(split="Train-1")
    assert PackConfig(check="full").check.value == "full"


def test_many_shards_keys_sort_by_imagefolder_index(tiny_packed):
    keys = sorted(
        int(s["__key__"])
        for s in wds.WebDataset([str(p) for p in sorted(tiny_packed.glob("*.tar"))], shardshuffle=False)
    )
    assert keys == list(range(40))
    assert np.all(np.diff(keys) == 1)


def test_an_index_its_readers_would_refuse_is_never_committed(tiny_tree, tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(manifest, "MAX_INDEX_BYTES", 256)  # what read_manifest and info accept, scaled down
    with pytest.raises(
        SourceError,
        match=r"the index of .* would be 0 MiB for \d+ shards?, over the 0 MiB a reader accepts; pack with "
        r"larger shards \(--shard-size\); nothing was written to the index$",
    ):
        pack(tiny_tree, out)
    assert list(out.glob("*.tar")) and not (out / "index.json").exists()
    assert not list(out.glob("train=*")), "the table files of an index never written stayed"
    monkeypatch.undo()
    result = pack(tiny_tree, out)  # the shards written are kept: the run resumes
    assert result.shards_written == 0 and result.shards_reused > 0
    assert read_manifest(out).splits["train"].samples
