"""Phone photos: HEIC and AVIF packed converted to the split's format, upright, and read back."""

import io
import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from imgshards.converter import PackConfig, pack, read_manifest
from imgshards.converter.format.formats import heif_opener
from imgshards.converter.scan.check import Check, inspect_image
from imgshards.loader import ShardDataset

pytestmark = pytest.mark.skipif(not heif_opener(), reason='needs pillow-heif: pip install -e ".[heic]"')


def _photo(width: int, height: int) -> Image.Image:
    """Left half red, right half blue: which way it was turned shows in its pixels."""
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    pixels[:, : width // 2, 0] = 220
    pixels[:, width // 2 :, 2] = 220
    return Image.fromarray(pixels)


def _encode(im: Image.Image, fmt: str, orientation: int = 1) -> bytes:
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    buf = io.BytesIO()
    im.save(buf, format=fmt, quality=90, exif=exif)
    return buf.getvalue()


@pytest.fixture(scope="module")
def photo_tree(tiny_tree, tmp_path_factory):
    """tiny_tree (40 JPEGs) plus two HEIC and two AVIF photos, one AVIF turned by its EXIF tag."""
    src = tmp_path_factory.mktemp("photos") / "src"
    shutil.copytree(tiny_tree, src)
    classes = sorted(p for p in src.iterdir() if p.is_dir())
    (classes[0] / "p1.heic").write_bytes(_encode(_photo(80, 60), "HEIF"))
    (classes[1] / "p2.HEIF").write_bytes(_encode(_photo(64, 48), "HEIF"))
    (classes[2] / "p3.avif").write_bytes(_encode(_photo(80, 60), "AVIF"))
    (classes[3] / "p4.avif").write_bytes(_encode(_photo(80, 60), "AVIF", orientation=6))  # 90 deg clockwise
    return src


def _samples(out):
    urls = [str(out / s.name) for s in read_manifest(out).split("train").shards]
    return {json.loads(s["json"])["path"]: s for s in wds.WebDataset(urls, shardshuffle=False)}


@pytest.mark.parametrize("keep_formats", [False, True])
def test_heic_and_avif_are_packed_as_jpeg_none_rejected(photo_tree, tmp_path, keep_formats):
    config = PackConfig(shard_size=30_000, workers=2, keep_formats=keep_formats)
    info = pack(photo_tree, tmp_path / "out", config).info
    assert info.samples == 44 and info.rejects_by_reason == {}
    assert info.formats == {"jpg": 44}  # converted even where formats are kept: nothing else reads them
    assert info.converted == {"heic_to_jpg": 2, "avif_to_jpg": 2, "exif_rotated": 1}
    samples = _samples(tmp_path / "out")
    assert set(samples) >= {"n00000000/p1.heic", "n00000001/p2.HEIF", "n00000002/p3.avif"}
    assert all(set(s) & {"jpg", "png", "webp", "heic", "avif"} == {"jpg"} for s in samples.values())
    turned = samples["n00000003/p4.avif"]
    with Image.open(io.BytesIO(turned["jpg"])) as stored:
        assert stored.size == (60, 80)  # stored upright: the tag applied to the pixels
        top, bottom = np.asarray(stored.convert("RGB"), dtype=int)[[5, -5], 30]
        assert top[0] > 150 > top[2] and bottom[2] > 150 > bottom[0]  # the red half turned to the top


def test_their_samples_decode_in_the_loader(photo_tree, tmp_path):
    out = tmp_path / "out"
    pack(photo_tree, out, PackConfig(shard_size=30_000, workers=2))
    batches = list(ShardDataset(out, batch_size=8, mode="eval", transform="eval", shuffle=False))
    labels = [label for batch in batches for label in batch.labels.tolist()]
    assert sorted(labels) == sorted([0] * 11 + [1] * 11 + [2] * 11 + [3] * 11)
    assert all(batch.images.shape[1:] == (3, 224, 224) for batch in batches)


def test_the_header_check_knows_them_by_their_bytes(photo_tree):
    for name, ext in [("p1.heic", "heic"), ("p3.avif", "avif")]:
        data = next(photo_tree.rglob(name)).read_bytes()
        for check in (Check.NONE, Check.HEADER, Check.FULL):
            verdict = inspect_image(data, ".jpg", check)  # misnamed: the bytes decide
            assert verdict.reason is None and verdict.ext == ext


def test_without_pillow_heif_a_heic_is_rejected_naming_the_extra(photo_tree, tmp_path):
    script = tmp_path / "pack_without_heif.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            sys.modules["pillow_heif"] = None  # as if the heic extra were not installed
            from imgshards.converter import PackConfig, pack
            info = pack({str(photo_tree)!r}, {str(tmp_path / "out")!r}, PackConfig(workers=1)).info
            print(json.dumps(info.rejects_by_reason))
            """
        )
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    assert json.loads(run.stdout.splitlines()[-1]) == {"unsupported_format": 2}
    rejects = [json.loads(line) for line in (tmp_path / "out/.imgshards/rejects/train.jsonl").open()]
    assert {r["path"] for r in rejects} == {"n00000000/p1.heic", "n00000001/p2.HEIF"}
    assert all('pip install -e ".[heic]"' in r["detail"] for r in rejects)


def test_resize_stores_a_turned_jpeg_upright(tmp_path):
    src = tmp_path / "src" / "only"
    src.mkdir(parents=True)
    (src / "turned.jpg").write_bytes(_encode(_photo(80, 60), "JPEG", orientation=6))
    info = pack(src.parent, tmp_path / "out", PackConfig(workers=1, resize=40)).info
    assert info.samples == 1
    (sample,) = _samples(tmp_path / "out").values()
    with Image.open(io.BytesIO(sample["jpg"])) as stored:
        assert stored.size == (40, 53) and stored.getexif().get(0x0112) is None  # upright, no tag
        top, bottom = np.asarray(stored.convert("RGB"), dtype=int)[[3, -3], 20]
        assert top[0] > 150 > top[2] and bottom[2] > 150 > bottom[0]
