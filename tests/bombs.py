"""Decompression bombs of issue 50, built by hand: real files of a few kilobytes that decode to gigabytes.

Shared by ``tests/test_hostile7.py`` (every read path refuses them before making a pixel) and
``tests/converter/format/test_headers.py`` (the header walkers read their sizes). Each is valid:
Pillow opens it at the size it declares, and decodes it there (which the tests never ask of it).
"""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image

BIG = (12000, 12000)  # 144,000,000 pixels: past Pillow's 89,478,485, under twice that (a warning only)


def _lzw_zeros(pixels: int) -> bytes:
    """GIF image data for ``pixels`` zeros: LZW codes of the longest run in the table, in sub-blocks.

    The table grows by one longer run a code (each code the one just added) up to its 4,096
    entries; then every code is a run of 4,090 zeros, 12 bits: 144 million pixels in 55 KB.
    """
    clear, end = 4, 5  # for a code size of 2
    out, bits, count, width = bytearray(), 0, 0, 3

    def put(code: int) -> None:
        nonlocal bits, count
        bits |= code << count
        count += width
        while count >= 8:
            out.append(bits & 0xFF)
            bits >>= 8
            count -= 8

    put(clear)
    table, left, previous, n = end + 1, pixels, 0, 0
    while left:
        longest = 1 if n == 0 else (previous + 1 if table < 4096 else 4095 - end)
        run = min(longest, left)
        put(0 if run == 1 else end + run - 1)
        left -= run
        if n and table < 4096:
            table += 1
        previous, n = run, n + 1
        if table + 1 > 1 << width and width < 12 and table < 4096:
            width += 1
    put(end)
    if count:
        out.append(bits & 0xFF)
    blocks = b"".join(bytes([len(out[k : k + 255])]) + out[k : k + 255] for k in range(0, len(out), 255))
    return b"\x02" + blocks + b"\x00"


def gif(screen: tuple[int, int], *frames: tuple[int, int, int, int]) -> bytes:
    """A GIF of logical screen ``screen`` whose frames ``(x0, y0, width, height)`` are all colour 0."""
    data = b"GIF89a" + struct.pack("<HHBBB", *screen, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    for x0, y0, width, height in frames:
        data += b"," + struct.pack("<HHHHB", x0, y0, width, height, 0) + _lzw_zeros(width * height)
    return data + b";"


def tiff(*pages: tuple[int, int]) -> bytes:
    """A little-endian TIFF of 8-bit gray pages of zeros, ``pages`` their ``(width, height)``; deflated.

    Every strip of a page is the same bytes, stored once and named by every strip's offset: a page
    of 12000x12000 takes 2 KB.
    """
    out = bytearray(b"II*\x00\x00\x00\x00\x00")
    layouts = []
    for width, height in pages:
        rows = max(r for r in range(1, height + 1) if height % r == 0 and (r == 1 or width * r <= 1 << 20))
        strip = zlib.compress(bytes(width * rows), 9)
        layouts.append((width, height, rows, height // rows, len(out), len(strip)))
        out += strip + b"\x00" * (len(strip) % 2)
    link = 4  # where the offset of the next directory goes
    for width, height, rows, strips, at, size in layouts:
        offsets = len(out)
        out += struct.pack(f"<{strips}I", *[at] * strips)
        counts = len(out)
        out += struct.pack(f"<{strips}I", *[size] * strips)
        entries = [  # (tag, type: 3 SHORT, 4 LONG, count, value)
            (256, 4, 1, width),
            (257, 4, 1, height),
            (258, 3, 1, 8),  # bits per sample
            (259, 3, 1, 8),  # deflate
            (262, 3, 1, 1),  # black is zero
            (273, 4, strips, offsets if strips > 1 else at),
            (277, 3, 1, 1),  # samples per pixel
            (278, 4, 1, rows),
            (279, 4, strips, counts if strips > 1 else size),
        ]
        struct.pack_into("<I", out, link, len(out))
        out += struct.pack("<H", len(entries))
        for tag, kind, count, value in entries:
            out += struct.pack("<HHI", tag, kind, count)
            out += struct.pack("<HH", value, 0) if kind == 3 else struct.pack("<I", value)
        link = len(out)
        out += b"\x00\x00\x00\x00"
    return bytes(out)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_1bit(width: int, height: int) -> bytes:
    """A PNG of ``width x height`` black 1-bit pixels (Pillow makes each a byte)."""
    row = bytes(1 + (width + 7) // 8)  # the filter byte, then the row
    z = zlib.compressobj(9)
    data = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")


def ico(png: bytes) -> bytes:
    """An icon file whose one icon, declared 256x256 in its directory, is ``png``.

    Pillow decodes the icon while it opens the file, at the size the PNG declares.
    """
    entry = struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 32, len(png), 6 + 16)
    return struct.pack("<HHH", 0, 1, 1) + entry + png


def jpeg_two_frames(width: int, height: int) -> bytes:
    """A real 8x8 JPEG with a second frame header, declaring ``width x height``, after its own.

    libjpeg refuses a second frame header; Pillow reads its size (the last it meets) and makes an
    image that large before libjpeg refuses.
    """
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (90, 120, 150)).save(out, format="JPEG")
    data = out.getvalue()
    sof = data.index(b"\xff\xc0")
    end = sof + 2 + struct.unpack_from(">H", data, sof + 2)[0]
    second = bytearray(data[sof:end])
    struct.pack_into(">HH", second, 5, height, width)
    return data[:end] + bytes(second) + data[end:]


def issue_50() -> dict[str, tuple[bytes, str]]:
    """The bombs of issue 50, each with the member extension a hostile shard stores it under."""
    return {
        "gif-frame-past-its-screen": (gif((1, 1), (0, 0, *BIG)), "png"),  # point 4: 55 KB
        "gif-second-frame": (gif((1, 1), (0, 0, 1, 1), (0, 0, *BIG)), "jpg"),  # every frame
        "tiff": (tiff(BIG), "tiff"),  # point 5: 2 KB
        "tiff-as-png": (tiff(BIG), "png"),  # point 6: Pillow opens by content
        "tiff-second-page": (tiff((3, 2), BIG), "tiff"),  # every page
        "ico": (ico(png_1bit(*BIG)), "png"),  # decoded by Image.open itself: 18 KB
        "jpeg-second-frame-header": (jpeg_two_frames(*BIG), "jpg"),  # the size Pillow reads
    }
