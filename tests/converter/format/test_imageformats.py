"""The table of image formats (converter/format/imageformats.py): what every other module reads of one."""

import io

import pytest
from PIL import Image, features

from imgshards.converter import IMG_EXTENSIONS as PUBLIC_IMG_EXTENSIONS
from imgshards.converter.format.formats import main_format, reader_warnings
from imgshards.converter.format.imageformats import (
    ALWAYS_CONVERTED,
    AVIF,
    FORMATS,
    HEIC,
    IMAGE_EXTENSIONS,
    IMG_EXTENSIONS,
    JPEG,
    PGM,
    PHOTO_EXTENSIONS,
    PPM,
    format_named,
    member_name,
    sniff,
    unsupported_format,
)
from imgshards.converter.scan.check import Check, inspect_image


def test_each_name_and_suffix_means_one_format():
    names = [f.name for f in FORMATS]
    suffixes = [s for f in FORMATS for s in f.suffixes]
    assert len(set(names)) == len(names) and len(set(suffixes)) == len(suffixes)
    assert all(s == s.lower() and s.startswith(".") for s in suffixes)
    assert all(format_named(f.name) is f for f in FORMATS)
    assert format_named("gif") is None


def test_the_derived_lists_are_those_the_modules_spelled():
    # What converter/format/locate.py, manifest.py, formats.py and check.py each spelled before the table.
    torchvision = pytest.importorskip("torchvision.datasets.folder")
    assert IMG_EXTENSIONS == torchvision.IMG_EXTENSIONS == PUBLIC_IMG_EXTENSIONS  # in its order too
    assert PHOTO_EXTENSIONS == (".heic", ".heif", ".avif")
    assert set(IMAGE_EXTENSIONS) == {"jpg", "png", "webp", "bmp", "ppm", "pgm", "tiff"}
    assert set(ALWAYS_CONVERTED) == {"heic", "avif"}
    by_suffix = {
        ".jpeg": "jpg",
        ".jpg": "jpg",
        ".tif": "tiff",
        ".tiff": "tiff",
        ".heif": "heic",
        ".avif": "avif",
    }
    assert {s: member_name(s) for s in by_suffix} == by_suffix
    assert member_name("jpeg") == "jpg" and member_name(".jxl") == "jxl" and member_name("") == ""


def test_the_lossless_and_timm_columns_decide_what_they_did():
    assert main_format(["a.png", "b.tif", "c.jpg"]) == "png"
    assert main_format(["a.PGM", "b.webp", "c.jpeg"]) == "jpg"  # a tie: JPEG
    assert reader_warnings({"jpg": 2}) == [] and reader_warnings({"webp": 2}) == []
    assert "skips the 3 bmp samples (it reads jpg, png, webp)" in " ".join(reader_warnings({"bmp": 3}))


def _written(fmt: str, mode: str) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (16, 12), 90).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("form", [f for f in FORMATS if f not in (HEIC, AVIF)], ids=lambda f: f.name)
def test_pillows_file_of_each_format_sniffs_as_it(form):
    data = _written(form.pillow, "L" if form is PGM else "RGB")
    assert sniff(data) is form
    assert inspect_image(data, ".bin", Check.HEADER).ext == form.name  # named by its bytes, not its name


@pytest.mark.skipif(not features.check("avif"), reason="this Pillow writes no AVIF")
def test_an_avif_sniffs_as_avif_though_it_lists_a_heif_brand():
    data = _written(AVIF.pillow, "RGB")
    assert b"mif1" in data[:64] and sniff(data) is AVIF


def test_iso_media_brands_tell_heic_from_avif():
    def ftyp(*brands: bytes) -> bytes:
        body = b"ftyp" + brands[0] + b"\0\0\0\0" + b"".join(brands[1:])
        return (len(body) + 4).to_bytes(4, "big") + body + b"\0" * 16

    assert sniff(ftyp(b"heic", b"mif1", b"heic")) is HEIC
    assert sniff(ftyp(b"mif1", b"mif1", b"avif")) is AVIF
    assert sniff(ftyp(b"isom", b"mp41")) is None  # a video: no image format


def test_the_device_and_cpu_columns():
    assert [f.name for f in FORMATS if f.device] == ["jpg"]  # nvjpeg
    assert [f for f in FORMATS if f.cpu == "libjpeg"] == [JPEG]
    assert HEIC.cpu == "pillow-heif" and PPM.cpu == "pillow"


def test_formats_pack_refuses_are_named():
    assert unsupported_format(_written("GIF", "P")) == "GIF"
    assert unsupported_format(b"%PDF-1.7") == "PDF"
    assert unsupported_format(_written("PNG", "RGB")) is None
