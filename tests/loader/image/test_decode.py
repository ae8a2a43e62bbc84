"""Decoding every stored format to RGB uint8 [3, H, W]."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from imgshards.loader import CorruptImageError
from imgshards.loader.image.decode import decode


def encode(image: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def rgb() -> Image.Image:
    rng = np.random.default_rng(0)
    base = np.linspace(0, 255, 40 * 30 * 3).reshape(30, 40, 3)
    return Image.fromarray((base + rng.integers(0, 20, base.shape)).clip(0, 255).astype(np.uint8))


@pytest.mark.parametrize(
    "mode, fmt, ext",
    [
        ("RGB", "JPEG", "jpg"),
        ("L", "JPEG", "jpg"),
        ("CMYK", "JPEG", "jpg"),
        ("RGB", "PNG", "png"),
        ("RGBA", "PNG", "png"),
        ("LA", "PNG", "png"),
        ("P", "PNG", "png"),
        ("L", "PNG", "png"),
        ("RGB", "WEBP", "webp"),
        ("RGB", "BMP", "bmp"),
        ("RGB", "PPM", "ppm"),
        ("L", "PPM", "pgm"),
        ("RGB", "TIFF", "tiff"),
        ("CMYK", "TIFF", "tiff"),
    ],
)
def test_every_format_and_mode_comes_out_rgb_uint8(rgb, mode, fmt, ext):
    out = decode(encode(rgb.convert(mode), fmt), ext)
    assert out.dtype == torch.uint8
    assert out.shape == (3, 30, 40)


def test_lossless_formats_keep_the_pixels(rgb):
    expected = torch.from_numpy(np.array(rgb)).permute(2, 0, 1)
    for fmt, ext in [("PNG", "png"), ("BMP", "bmp"), ("PPM", "ppm"), ("TIFF", "tiff")]:
        assert torch.equal(decode(encode(rgb, fmt), ext), expected)
    gray = rgb.convert("L")
    out = decode(encode(gray, "PNG"), "png")
    assert torch.equal(out[0], out[1]) and torch.equal(out[1], out[2])


def test_jpeg_goes_through_libjpeg_turbo_like_pillow(rgb):
    data = encode(rgb, "JPEG")
    ours = decode(data, "jpg").int()
    pillow = torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB"))).permute(2, 0, 1).int()
    assert (ours - pillow).abs().max() <= 2


@pytest.mark.parametrize("ext", ["jpg", "png"])
def test_corrupt_bytes_raise_naming_the_sample(rgb, ext):
    data = encode(rgb, "JPEG" if ext == "jpg" else "PNG")
    with pytest.raises(CorruptImageError, match=r"'k1' in shard s\.tar") as info:
        decode(data[: len(data) // 2], ext, key="k1", shard="s.tar")
    assert info.value.key == "k1" and info.value.shard == "s.tar"
    with pytest.raises(CorruptImageError):
        decode(b"", ext)


def test_jpeg_decodes_without_a_warning_per_image(rgb):
    # torchvision 0.29 warns (DeprecationWarning) on every decode_jpeg call; the loader decodes
    # through torchcodec, or silences the warning where torchvision is the fallback.
    import warnings

    data = encode(rgb, "JPEG")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            assert decode(data, "jpg").shape == (3, 30, 40)
            assert decode(bytearray(data), "jpg").shape == (3, 30, 40)
