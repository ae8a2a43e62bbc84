"""One image format per split: a mixed-format tree comes out in one format, conversions counted."""

import io
import json
import shutil

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from imgshards.converter import PackConfig, pack, read_manifest, reader_warnings
from imgshards.converter.format.formats import convert_image, main_format


def _samples(out, split="train"):
    urls = [str(out / s.name) for s in read_manifest(out).split(split).shards]
    return list(wds.WebDataset(urls, shardshuffle=False))


def _image_key(sample):
    (key,) = [k for k in sample if k in ("jpg", "png", "webp", "bmp", "tiff")]
    return key


def test_mixed_tree_comes_out_as_jpeg_with_every_conversion_counted(mixed_tree, tmp_path):
    result = pack(mixed_tree, tmp_path / "out", PackConfig(shard_size=30_000, workers=2))
    info = result.info
    assert info.formats == {"jpg": 40}
    assert info.converted == {
        "alpha_flattened": 1,
        "bmp_to_jpg": 2,
        "png_to_jpg": 3,
        "tiff_to_jpg": 1,
        "webp_to_jpg": 1,
    }
    assert json.loads((tmp_path / "out" / "index.json").read_text())["splits"]["train"]["converted"] == dict(
        info.converted
    )
    by_path = {json.loads(s["json"])["path"]: s for s in _samples(tmp_path / "out")}
    assert len(by_path) == 40 and all(_image_key(s) == "jpg" for s in by_path.values())
    for path, sample in by_path.items():
        source = (mixed_tree / path).read_bytes()
        if path.endswith(".JPEG"):
            assert sample["jpg"] == source  # JPEGs are stored as they are
            continue
        with Image.open(io.BytesIO(sample["jpg"])) as stored, Image.open(io.BytesIO(source)) as original:
            meta = json.loads(sample["json"])
            assert (meta["width"], meta["height"]) == stored.size == original.size
            if path.endswith("g.bmp"):
                assert stored.mode == "L"  # gray stays gray
            want = np.asarray(original.convert("RGBA" if path.endswith("b.png") else "RGB"), dtype=float)
            got = np.asarray(stored.convert("RGB"), dtype=float)
            if path.endswith("b.png"):  # the transparent left half is composited onto white
                half = original.width // 2
                assert np.abs(got[:, : half - 2] - 255).mean() < 3
                want, got = want[:, half + 2 :, :3], got[:, half + 2 :]
            assert np.abs(got - want).mean() < 6, path  # quality 95: close to the original


def test_png_tree_comes_out_as_lossless_png(mixed_tree, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(mixed_tree, src)
    jpegs = sorted(src.rglob("*.JPEG"))
    for victim in jpegs[:-3]:  # all but three JPEGs become PNGs: PNG is the main format
        with Image.open(victim) as im:
            victim.with_suffix(".png").write_bytes(_encode(im, "PNG"))
        victim.unlink()
    result = pack(src, tmp_path / "out", PackConfig(shard_size=30_000, workers=2))
    assert result.info.formats == {"png": 40}
    assert result.info.converted == {"bmp_to_png": 2, "jpg_to_png": 3, "tiff_to_png": 1, "webp_to_png": 1}
    for sample in _samples(tmp_path / "out"):
        path = json.loads(sample["json"])["path"]
        with Image.open(io.BytesIO(sample["png"])) as stored, Image.open(src / path) as original:
            assert stored.mode == original.mode or original.format == "JPEG"
            assert np.array_equal(np.asarray(stored), np.asarray(original)), path  # lossless


def _encode(im, fmt):
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return buf.getvalue()


def test_keep_formats_stores_the_original_bytes_and_says_who_misses_what(mixed_tree, tmp_path):
    result = pack(mixed_tree, tmp_path / "out", PackConfig(shard_size=30_000, workers=2, keep_formats=True))
    assert result.info.formats == {"bmp": 2, "jpg": 33, "png": 3, "tiff": 1, "webp": 1}
    assert result.info.converted == {}
    for sample in _samples(tmp_path / "out"):
        assert sample[_image_key(sample)] == (mixed_tree / json.loads(sample["json"])["path"]).read_bytes()
    notes = reader_warnings(result.info.formats)
    assert any("timm's wds reader skips the 3 bmp/tiff samples" in n for n in notes)
    assert any("7 of 40 rows have no 'jpg' image" in n for n in notes)
    assert any('to_tuple("bmp;jpg;png;tiff;webp", "cls")' in n for n in notes)
    assert reader_warnings({"jpg": 40}) == [] and reader_warnings({"png": 3}) == []


def test_an_undecodable_file_that_needs_converting_is_rejected_with_its_reason(mixed_tree, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(mixed_tree, src)
    bmp = next(src.rglob("d.bmp"))
    bmp.write_bytes(bmp.read_bytes()[:54] + b"\0" * 8)  # a BMP header, then too little pixel data
    result = pack(src, tmp_path / "out", PackConfig(shard_size=30_000, workers=2, check="none"))
    assert result.info.samples == 39 and result.info.rejects_by_reason == {"undecodable": 1}


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["a.jpg", "b.JPEG", "c.png"], "jpg"),
        (["a.jpg", "c.png"], "jpg"),  # a tie: JPEG
        (["a.jpg", "c.png", "d.tif"], "png"),
        (["a.webp", "c.bmp", "d.PGM"], "png"),
    ],
)
def test_main_format_is_decided_by_the_names(names, expected):
    assert main_format(names) == expected


def test_conversion_is_deterministic():
    im = Image.linear_gradient("L").resize((64, 48)).convert("RGB")
    data = _encode(im, "PNG")
    assert convert_image(data, "png", "jpg").data == convert_image(data, "png", "jpg").data
