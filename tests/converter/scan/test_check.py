import io
import zlib

import pytest
from PIL import Image

from imgshards.converter.scan.check import Check, inspect_image
from imgshards.converter.scan.reasons import Reason


def _encode(fmt: str, mode: str = "RGB", size=(40, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, 128).save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def jpeg(tiny_tree) -> bytes:
    return next(tiny_tree.rglob("*.JPEG")).read_bytes()


@pytest.mark.parametrize("check", [Check.HEADER, Check.FULL])
def test_good_images_pass_with_their_real_format(jpeg, check):
    assert inspect_image(jpeg, ".jpeg", check).ext == "jpg"
    assert inspect_image(jpeg + b"\0" * 100, ".jpg", check).reason is None  # padding after EOI is fine
    for fmt, ext in [("PNG", "png"), ("WEBP", "webp"), ("BMP", "bmp"), ("TIFF", "tiff"), ("PPM", "ppm")]:
        verdict = inspect_image(_encode(fmt), ".jpg", check)  # misnamed: stored under its real format
        assert (verdict.ext, verdict.width, verdict.height) == (ext, 40, 30), fmt


def test_header_check_catches_every_truncation_of_a_jpeg(jpeg):
    for cut in [3, 20, 200, len(jpeg) // 2, len(jpeg) - 1]:
        assert inspect_image(jpeg[:cut], ".jpg", Check.HEADER).reason is Reason.TRUNCATED, cut


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_header_check_catches_truncated_png_and_webp(fmt):
    data = _encode(fmt, size=(300, 200))
    assert inspect_image(data[: len(data) - 30], ".png", Check.HEADER).reason is Reason.TRUNCATED


def test_non_images_and_empty_files_are_rejected():
    assert inspect_image(b"", ".jpg", Check.HEADER).reason is Reason.EMPTY
    assert inspect_image(b"<html></html>", ".jpg", Check.HEADER).reason is Reason.NOT_IMAGE
    assert inspect_image(_encode("GIF"), ".png", Check.HEADER).reason is Reason.UNSUPPORTED_FORMAT


def test_full_check_decodes_what_the_header_check_cannot_see():
    png = bytearray(_encode("PNG", size=(64, 64)))
    idat = png.index(b"IDAT")
    png[idat + 6] ^= 0xFF  # corrupt compressed data; the chunk structure and IEND stay intact
    assert inspect_image(bytes(png), ".png", Check.HEADER).reason is None
    assert inspect_image(bytes(png), ".png", Check.FULL).reason is Reason.UNDECODABLE


def test_check_none_trusts_everything():
    assert inspect_image(b"", ".JPEG".lower(), Check.NONE).ext == "jpg"
    assert inspect_image(zlib.compress(b"x"), ".tif", Check.NONE).ext == "tiff"
