"""Bombs at pack time (issue 21): ``--check header`` bounds the declared pixels and a JPEG's scans.

Every hostile file is built here: a small real image whose header is rewritten to declare a huge
size (checksums fixed where the format has them), so only the size gives it away; and a valid
progressive JPEG whose last scan is repeated thousands of times (each repeat a pass over the whole
image for the decoder).
"""

from __future__ import annotations

import io
import json
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from imgshards.cli.main import cli
from imgshards.converter import PackConfig, Reason, pack
from imgshards.converter.format.headers import (
    MAX_SCANS,
    MAX_WALK,
    JpegError,
    image_size,
    jpeg_header,
    jpeg_scans,
    oversized,
    pixel_limit,
    too_many_scans,
    walk_jpeg,
)
from imgshards.converter.scan.check import Check, inspect_image

from ...bombs import gif, jpeg_two_frames, tiff


def small(fmt: str, size: tuple[int, int] = (8, 8), **params: object) -> bytes:
    rgb = Image.fromarray(np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    out = io.BytesIO()
    (rgb.convert("L") if fmt == "PPM-L" else rgb).save(out, format=fmt.split("-")[0], **params)
    return out.getvalue()


def jpeg_declaring(width: int, height: int) -> bytes:
    data = bytearray(small("JPEG"))
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def png_declaring(width: int, height: int) -> bytes:
    data = bytearray(small("PNG"))
    struct.pack_into(">II", data, 16, width, height)
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))  # a valid IHDR checksum
    return bytes(data)


def webp_declaring(width: int, height: int) -> bytes:
    data = bytearray(small("WEBP", lossless=True))
    assert data[12:16] == b"VP8L"
    bits = int.from_bytes(data[21:25], "little") & ~((1 << 28) - 1)
    struct.pack_into("<I", data, 21, bits | (width - 1) | (height - 1) << 14)
    return bytes(data)


def bmp_declaring(width: int, height: int) -> bytes:
    data = bytearray(small("BMP"))
    struct.pack_into("<ii", data, 18, width, -height)  # top-down: a negative height
    return bytes(data)


BOMBS = {
    "jpeg-16000": (jpeg_declaring(16000, 16000), ".jpg", (16000, 16000)),
    "jpeg-65500": (jpeg_declaring(65500, 65500), ".jpg", (65500, 65500)),
    "png-65500": (png_declaring(65500, 65500), ".png", (65500, 65500)),
    "png-as-jpg": (png_declaring(20000, 20000), ".jpg", (20000, 20000)),
    "webp-16384": (webp_declaring(16384, 16384), ".webp", (16384, 16384)),
    "bmp-100000": (bmp_declaring(100000, 100000), ".bmp", (100000, 100000)),
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_header_check_rejects_a_bomb_before_decoding_it(name):
    data, suffix, size = BOMBS[name]
    assert len(data) < 2000 and image_size(data) == size
    for check in (Check.HEADER, Check.FULL):
        verdict = inspect_image(data, suffix, check)
        assert verdict.reason is Reason.TOO_MANY_PIXELS, verdict
        w, h = size
        assert verdict.detail == (
            f"declares {w}x{h} = {w * h:,} pixels, more than the limit of {Image.MAX_IMAGE_PIXELS:,}"
        )
    assert inspect_image(data, suffix, Check.NONE).reason is None, "check none trusts the input"


def test_the_bound_is_configurable_and_defaults_to_pillows(monkeypatch):
    data = jpeg_declaring(16000, 16000)  # 256 million pixels
    assert pixel_limit() == Image.MAX_IMAGE_PIXELS
    assert inspect_image(data, ".jpg", Check.HEADER, max_pixels=300_000_000).reason is None
    assert inspect_image(small("JPEG"), ".jpg", Check.HEADER, max_pixels=63).reason is Reason.TOO_MANY_PIXELS
    assert inspect_image(small("JPEG"), ".jpg", Check.HEADER, max_pixels=64).reason is None
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # Pillow's own switch turns the default off
    assert oversized(data) is None and inspect_image(data, ".jpg", Check.HEADER).reason is None


FORMATS = [
    ("JPEG", {}),
    ("JPEG", {"progressive": True}),
    ("PNG", {}),
    ("WEBP", {}),
    ("WEBP", {"lossless": True}),
]
FORMATS += [
    ("BMP", {}),
    ("GIF", {}),
    ("PPM", {}),
    ("PPM-L", {}),
    ("TIFF", {}),
    ("TIFF", {"compression": "tiff_lzw"}),
]


@pytest.mark.parametrize(("fmt", "params"), FORMATS)
def test_image_size_reads_what_pillow_reads(fmt, params):
    data = small(fmt, (37, 23), **params)
    with Image.open(io.BytesIO(data)) as im:
        assert image_size(data) == im.size == (37, 23)


def _frame_sizes(data: bytes) -> list[tuple[int, int]]:
    """The size Pillow gives each frame of ``data`` (it decodes the frames before the last: tiny ones)."""
    sizes = []
    with Image.open(io.BytesIO(data)) as im:
        for frame in range(im.n_frames):
            im.seek(frame)
            sizes.append(im.size)
    return sizes


def test_image_size_reads_every_frame_of_a_gif_and_every_page_of_a_tiff():
    # Issue 50: the logical screen says nothing of the frames; Pillow grows its canvas to hold each.
    past_the_screen = gif((1, 1), (0, 0, 40, 30))
    assert image_size(past_the_screen) == _frame_sizes(past_the_screen)[-1] == (40, 30)
    later = gif((10, 10), (0, 0, 2, 2), (30, 5, 4, 4))  # a later frame, placed past the screen
    assert _frame_sizes(later) == [(10, 10), (34, 10)] and image_size(later) == (34, 10)
    # A stray byte before a descriptor: Pillow passes over it, and so does the walk.
    stray = later.replace(b"\x00,\x1e\x00", b"\x00\x07,\x1e\x00")
    assert stray != later and _frame_sizes(stray) == [(10, 10), (34, 10)] and image_size(stray) == (34, 10)
    pages = tiff((3, 2), (40, 30), (5, 5))
    assert _frame_sizes(pages) == [(3, 2), (40, 30), (5, 5)] and image_size(pages) == (40, 30)
    assert oversized(pages, max_pixels=1199) == "declares 40x30 = 1,200 pixels, more than the limit of 1,199"
    assert oversized(pages, max_pixels=1200) is None
    for cut in (past_the_screen[:12], pages[:6], b"GIF89a", b"II*\x00"):
        assert image_size(cut) is None or image_size(cut) == (1, 1)  # never an error


def test_a_header_walk_is_bounded():
    # A comment extension of MAX_WALK + 1 one-byte blocks before the frame: refused after the walk's
    # budget, in milliseconds, not walked to its end.
    screen = gif((4, 4), (0, 0, 4, 4))
    comment = b"!\xfe" + b"\x01x" * (MAX_WALK + 1) + b"\x00"
    long = screen[:19] + comment + screen[19:]
    start = time.perf_counter()
    assert image_size(long) is None
    assert oversized(long) == (
        f"a header of more than {MAX_WALK:,} blocks, frames or tags: too long to bound before decoding"
    )
    assert time.perf_counter() - start < 1.0
    # A TIFF whose directory names itself as the next one: walked once.
    looped = bytearray(tiff((40, 30)))
    first = struct.unpack_from("<I", looped, 4)[0]
    struct.pack_into("<I", looped, len(looped) - 4, first)
    assert image_size(bytes(looped)) == (40, 30)
    # A directory claiming 65,535 entries in a file of a few: read as far as the file goes.
    struct.pack_into("<H", looped, first, 65535)
    assert image_size(bytes(looped)) in ((40, 30), None)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_a_jpeg_with_a_second_frame_header_is_refused_by_the_walk_to_its_scan():
    # libjpeg refuses it; Pillow reads the second size (the last it meets) and makes that image first.
    data = jpeg_two_frames(12000, 12000)
    assert jpeg_header(data) == (8, 8, 3, False)  # the first frame header, as before
    with Image.open(io.BytesIO(data)) as im:
        assert im.size == (12000, 12000)
    with pytest.raises(JpegError, match="a second JPEG frame header") as e:
        walk_jpeg(data, to_scan=True)
    assert not e.value.truncated
    verdict = inspect_image(data, ".jpg", Check.HEADER)
    assert verdict.reason is Reason.UNDECODABLE and verdict.detail.startswith("a second JPEG frame header")


def test_jpeg_header_reads_the_size_of_a_file_cut_after_its_frame_header():
    data = jpeg_declaring(65500, 65500)
    cut = data[: data.index(b"\xff\xc0") + 12]
    assert jpeg_header(cut) == (65500, 65500, 3, False) and oversized(cut)
    assert inspect_image(cut, ".jpg", Check.HEADER).reason is Reason.TRUNCATED
    for bad in (b"", b"\xff\xd8", b"\xff\xd8\xff\xc0\x00", bytes(100)):
        assert jpeg_header(bad) is None and image_size(bad) is None


def _tree_with_bombs(root: Path) -> Path:
    for name, (data, suffix, _) in BOMBS.items():
        (root / "bombs").mkdir(parents=True, exist_ok=True)
        (root / "bombs" / f"{name}{suffix}").write_bytes(data)
    (root / "fine").mkdir()
    for i in range(3):
        (root / "fine" / f"{i}.jpg").write_bytes(small("JPEG"))
        (root / "bombs" / f"ok{i}.jpg").write_bytes(small("JPEG"))
    return root


def test_pack_rejects_every_bomb_with_a_reason_and_packs_the_rest(tmp_path):
    src = _tree_with_bombs(tmp_path / "src")
    result = pack(src, tmp_path / "out", PackConfig(workers=1))
    assert result.info.samples == 6
    assert result.info.rejects_by_reason == {"too_many_pixels": len(BOMBS)}
    lines = (tmp_path / "out" / result.info.rejects_file).read_text().splitlines()
    rejects = {json.loads(line)["path"]: json.loads(line) for line in lines}
    assert sorted(rejects) == sorted(f"bombs/{n}{s}" for n, (_, s, _) in BOMBS.items())
    assert all(
        r["reason"] == "too_many_pixels" and "more than the limit" in r["detail"] for r in rejects.values()
    )


def test_pack_cli_takes_max_pixels(tmp_path):
    src = _tree_with_bombs(tmp_path / "src")
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["pack", str(src), str(out), "--max-pixels", "300000000", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)["splits"]["train"]
    # 16000x16000 passes; the 16384x16384 WebP too, but Pillow (which opens it) refuses past twice its own
    # bound, as the loader's Pillow decode would: still rejected, with Pillow's reason.
    assert summary["rejects"]["by_reason"]["too_many_pixels"] == len(BOMBS) - 1
    assert summary["samples"] == 7, summary
    index = json.loads((out / "index.json").read_text())
    assert index["splits"]["train"]["pack"]["max_pixels"] == 300_000_000
    res = CliRunner().invoke(cli, ["pack", str(src), str(tmp_path / "x"), "--max-pixels", "0"])
    assert res.exit_code == 2 and "--max-pixels" in res.output


def with_scans(extra: int, *, side: int = 512, **params: object) -> bytes:
    """A valid progressive JPEG (10 scans) with its last scan repeated ``extra`` more times."""
    out = io.BytesIO()
    Image.new("RGB", (side, side), (90, 120, 150)).save(out, format="JPEG", progressive=True, **params)
    data = out.getvalue()
    last, end = data.rindex(b"\xff\xda"), data.rindex(b"\xff\xd9")
    return data[:end] + data[last:end] * extra + data[end:]


def with_comment(jpeg: bytes, payload: bytes) -> bytes:
    """``jpeg`` with a COM segment holding ``payload`` right after its SOI."""
    return jpeg[:2] + b"\xff\xfe" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]


def test_jpeg_scans_counts_the_scans_of_real_jpegs():
    assert jpeg_scans(small("JPEG")) == 1
    assert jpeg_scans(small("JPEG", progressive=True)) == 10  # libjpeg's script for colour
    assert jpeg_scans(small("JPEG", progressive=True, restart_marker_blocks=1)) == 10  # RSTn in the data
    gray = io.BytesIO()
    Image.new("L", (40, 30), 7).save(gray, format="JPEG", progressive=True)
    assert jpeg_scans(gray.getvalue()) == 6
    assert jpeg_scans(with_scans(4000)) == 4010
    # 0xFFDA bytes inside a metadata segment are not scans: the walk skips segments by their length.
    padded = with_comment(small("JPEG", progressive=True), b"\xff\xda" * 500)
    assert padded.count(b"\xff\xda") == 510 and jpeg_scans(padded) == 10 and too_many_scans(padded) is None
    for bad in (b"", b"\xff\xd8", b"\xff\xd8\xff\xc0\x00", bytes(100), small("PNG")):
        assert jpeg_scans(bad) == 0 and too_many_scans(bad) is None


def test_a_baseline_jpeg_is_passed_after_its_first_scan_header():
    """One scan holding every component: libjpeg stops with an error at a second, so none is counted."""
    data = small("JPEG")
    last, end = data.rindex(b"\xff\xda"), data.rindex(b"\xff\xd9")
    repeated = data[:end] + data[last:end] * 500 + data[end:]
    assert jpeg_scans(repeated) == 501 and too_many_scans(repeated) is None
    assert inspect_image(repeated, ".jpg", Check.FULL).reason is Reason.UNDECODABLE


def test_a_jpeg_with_more_scans_than_the_limit_is_rejected_before_decoding():
    assert MAX_SCANS == 100
    at_limit, past_it = with_scans(MAX_SCANS - 10), with_scans(MAX_SCANS - 9)
    assert inspect_image(at_limit, ".jpg", Check.HEADER).reason is None
    assert inspect_image(at_limit, ".jpg", Check.FULL).reason is None
    bomb = with_scans(4000)
    for data, scans in ((past_it, 101), (bomb, 4010)):
        for check in (Check.HEADER, Check.FULL):
            verdict = inspect_image(data, ".jpg", check)
            assert verdict.reason is Reason.TOO_MANY_SCANS, verdict
            assert verdict.detail == f"progressive JPEG with {scans} scans, more than the limit of 100"
    assert inspect_image(bomb, ".jpg", Check.NONE).reason is None, "check none trusts the input"
    assert too_many_scans(past_it, max_scans=101) is None
    start = time.perf_counter()
    inspect_image(bomb, ".jpg", Check.FULL)
    assert time.perf_counter() - start < 0.5, "decoded it: 4,010 scans of 512x512 take seconds"


def test_pack_rejects_a_scan_bomb_and_keeps_a_long_thin_image(tmp_path):
    """The 65500x1 JPEG is a valid image (a random crop of it trains); only the eval preset refuses it."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "scans.jpg").write_bytes(with_scans(4000))
    wide = io.BytesIO()
    Image.new("RGB", (65500, 1), (1, 2, 3)).save(wide, format="JPEG")
    (src / "a" / "wide.jpg").write_bytes(wide.getvalue())
    (src / "a" / "fine.jpg").write_bytes(small("JPEG", progressive=True))
    result = pack(src, tmp_path / "out", PackConfig(workers=1))
    assert result.info.samples == 2
    assert result.info.rejects_by_reason == {"too_many_scans": 1}
    (line,) = (tmp_path / "out" / result.info.rejects_file).read_text().splitlines()
    assert json.loads(line) == {
        "path": "a/scans.jpg",
        "reason": "too_many_scans",
        "detail": "progressive JPEG with 4010 scans, more than the limit of 100",
    }
