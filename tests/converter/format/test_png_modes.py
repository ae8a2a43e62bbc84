"""Every image mode pack accepts has a form in a PNG split and a JPEG split (issue 37, point 11).

On 1bc048c a 32-bit integer TIFF (Pillow mode ``I``) bound for a PNG split was rejected as
"undecodable: cannot write mode I as PNG": a valid image, a false reason. PNG holds at most 16 bits
of gray, so it is now stored as 16-bit (values clipped to 0..65535), the same reading of it that
the JPEG split's conversion scales to 8 bits (:func:`~imgshards.converter.format.formats.eight_bit`).
A big-endian 16-bit TIFF (``I;16B``) bound for a PNG split came out black (Pillow's
``convert("I;16")`` zeroes it); it keeps its values now.
"""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
from PIL import Image

from imgshards.converter import PackConfig, pack, read_manifest
from imgshards.converter.format.formats import convert_image


def eight_bit(im: Image.Image) -> Image.Image:
    """:func:`imgshards.converter.format.formats.eight_bit`, imported late.

    This file also runs on older code.
    """
    from imgshards.converter.format import formats

    return formats.eight_bit(im)


VALUES = (100_000, 40_000, 1_000, -5)  # past 16 bits, 16 bits, under 8 bits... and below zero


def int32_tiff(seed: int) -> bytes:
    pixels = np.array(VALUES, dtype=np.int32).repeat(6).reshape(1, 24).repeat(16, axis=0) + seed
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="TIFF")
    return buf.getvalue()


def test_a_32_bit_integer_tiff_packs_into_a_png_split_as_16_bit_gray(tmp_path):
    src = tmp_path / "src"
    for cls in ("a", "b"):
        (src / cls).mkdir(parents=True)
        for i in range(2):
            (src / cls / f"{i}.tiff").write_bytes(int32_tiff(i))
    result = pack(src, tmp_path / "out", PackConfig(workers=1))
    assert result.info.rejects_by_reason == {}  # was {"undecodable": 4}: "cannot write mode I as PNG"
    assert result.info.samples == 4 and result.info.formats == {"png": 4}
    assert result.info.converted == {"tiff_to_png": 4}
    (shard,) = read_manifest(tmp_path / "out").split("train").shards
    with tarfile.open(tmp_path / "out" / shard.name) as tar:
        for member in tar:
            if not member.name.endswith(".png"):
                continue
            data = tar.extractfile(member).read()
            meta = json.loads(tar.extractfile(member.name.replace(".png", ".json")).read())
            seed = int(meta["path"].rsplit("/", 1)[1].split(".")[0])
            with Image.open(io.BytesIO(data)) as stored:
                assert stored.mode == "I;16" and stored.size == (24, 16)
                want = np.clip(np.array(VALUES) + seed, 0, 65535).repeat(6)
                assert np.array_equal(np.asarray(stored)[0], want)


# Every mode Pillow writes to a TIFF, as it opens again.
TIFF_MODES = ["1", "L", "LA", "P", "PA", "RGB", "RGBA", "CMYK", "YCbCr", "LAB", "I", "I;16", "I;16B", "F"]


def tiff_of(mode: str) -> bytes:
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (16, 24, 3), dtype=np.uint8))
    if mode == "I;16B":
        deep = np.asarray(rgb.convert("L")).astype(">u2") * 257
        im = Image.frombytes("I;16B", rgb.size, deep.tobytes())
    elif mode == "I":
        im = Image.fromarray(np.asarray(rgb.convert("L")).astype(np.int32) * 300)  # up to 76500
    else:
        im = rgb.convert(mode)
    buf = io.BytesIO()
    im.save(buf, format="TIFF")
    return buf.getvalue()


@pytest.mark.parametrize("mode", TIFF_MODES)
def test_every_mode_converts_to_png_and_jpeg_and_both_agree(mode):
    data = tiff_of(mode)
    png = convert_image(data, "tiff", "png")
    jpeg = convert_image(data, "tiff", "jpg")
    with Image.open(io.BytesIO(png.data)) as p, Image.open(io.BytesIO(jpeg.data)) as j:
        assert p.size == j.size == (24, 16)
        # The PNG, read as the loader reads it, is the JPEG's image (JPEG's error aside).
        as_png = np.asarray(eight_bit(p).convert("RGB"), dtype=float)
        as_jpeg = np.asarray(j.convert("RGB"), dtype=float)
    if mode not in ("LA", "PA", "RGBA"):  # the JPEG composited the alpha onto white, the PNG kept it
        assert np.abs(as_png - as_jpeg).mean() < 4, mode
    if mode in ("I", "I;16", "I;16B"):
        with Image.open(io.BytesIO(data)) as original:
            assert np.array_equal(np.asarray(eight_bit(original)), as_png[..., 0].astype(np.uint8))
