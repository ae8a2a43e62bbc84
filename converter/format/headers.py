"""An image's size read from its header, without decoding it; and the bound on its pixel count.

A decompression bomb is a small file whose header declares a huge image: a 634-byte JPEG declaring
16000x16000 decodes to 768 MB, one declaring 65500x65500 asks for 12.9 GB. The size is in the first
few hundred bytes, so it is read and bounded before any decoder allocates for it: ``pack --check
header`` rejects such a file, and the loader skips it (it imports :func:`oversized` from here).

One JPEG marker walker serves both: :func:`jpeg_header` stops at the frame header (the size, even
when the rest of the file is cut), and ``walk_jpeg(..., to_scan=True)`` goes on to the first scan
for ``pack``'s truncation check (:mod:`..scan.check`).

Pixels are one cost; scans are the other. A progressive JPEG is decoded scan by scan, each over the
whole image: a 274 KB file whose last scan is repeated 4,000 times takes 23-51 s to decode. Real
progressive JPEGs have about 10 scans (libjpeg's default script), so more than :data:`MAX_SCANS`
(100) is refused by :func:`too_many_scans`, as nvImageCodec refuses more than 256.

The bound defaults to Pillow's ``Image.MAX_IMAGE_PIXELS`` (about 89.5 million pixels, read when the
check runs), the limit Pillow itself warns at; ``Image.MAX_IMAGE_PIXELS = None`` removes it, as it
does in Pillow.

The bound is on what a decoder makes, every frame of it (issue 50): a GIF's logical screen says
nothing of its frames (a 55 KB GIF with a 1x1 screen holds a 12000x12000 frame, and Pillow grows
its canvas to hold it), so :func:`image_size` walks every frame's descriptor; a TIFF's every page
(image file directory) is read the same way. A walk reads at most :data:`MAX_WALK` blocks or
directory entries, in bounded time; a header longer than that is refused. For a format read here by
no walker, the read paths bound the size Pillow reads from its header before any pixel is decoded
(:func:`pixel_excess` of ``im.size`` after ``Image.open``, before ``load()``); the formats Pillow opens
without knowing the size of what it will decode (an ICO's icons, which Pillow decodes to open it, and
an ICNS's embedded images) are refused by their magic bytes
(:func:`~.imageformats.unbounded_format`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Literal, NamedTuple

from PIL import Image

from .imageformats import JPEG, unbounded_format

__all__ = [
    "MAX_SCANS",
    "MAX_WALK",
    "JpegError",
    "JpegHeader",
    "image_size",
    "jpeg_header",
    "jpeg_scans",
    "oversized",
    "pixel_excess",
    "pixel_limit",
    "too_many_scans",
    "walk_jpeg",
]


class JpegHeader(NamedTuple):
    """What a JPEG's frame header says: size, colour components, and whether it is progressive."""

    height: int
    width: int
    components: int
    progressive: bool


class JpegError(ValueError):
    """The JPEG's marker segments cannot be walked; ``truncated`` when the data ends too early."""

    def __init__(self, detail: str, *, truncated: bool) -> None:
        super().__init__(detail)
        self.truncated = truncated


# Start-of-frame markers (SOF0-SOF15 but DHT, JPG and DAC, which share the range).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_PROGRESSIVE = frozenset({0xC2, 0xC6, 0xCA, 0xCE})
_STANDALONE = frozenset([0x01, *range(0xD0, 0xD9)])  # TEM, RST0-7, SOI: no length field


def walk_jpeg(data: bytes | bytearray | memoryview, *, to_scan: bool) -> tuple[JpegHeader | None, int]:
    """Walk a JPEG's marker segments from after SOI; return its frame header and where the walk stopped.

    Stops at the first frame header (``to_scan=False``; the offset is that segment's), or goes on to
    the first start of scan (``to_scan=True``; the offset is where the scan's data begins; a second
    frame header before it is an error, as in libjpeg). The frame is ``None`` when a scan comes
    before any frame header.

    Raises:
        JpegError: the segments are corrupt, or the data ends before the walk does.

    """
    pos, n = 2, len(data)
    frame: JpegHeader | None = None
    while True:
        # A marker is 0xFF (any number of fill bytes) then a code; most carry a 2-byte length.
        if pos < n and data[pos] != 0xFF:
            raise JpegError(f"corrupt JPEG header at byte {pos}", truncated=False)
        while pos < n and data[pos] == 0xFF:
            pos += 1
        if pos >= n:
            raise JpegError("ends inside the JPEG header", truncated=True)
        marker = data[pos]
        pos += 1
        if marker == 0xD9:
            raise JpegError("JPEG ends before its first scan", truncated=True)
        if marker in _STANDALONE:
            continue
        if pos + 2 > n:
            raise JpegError("ends inside the JPEG header", truncated=True)
        length = data[pos] << 8 | data[pos + 1]
        if length < 2:
            raise JpegError(f"corrupt JPEG segment length at byte {pos}", truncated=False)
        if marker in _SOF and frame is not None:
            # libjpeg refuses a second frame header; Pillow reads its size, and makes the pixels of
            # that size before libjpeg refuses: the size checked here must be the one decoded.
            raise JpegError(f"a second JPEG frame header (SOF) at byte {pos - 2}", truncated=False)
        if marker in _SOF:
            if pos + 8 > n:  # length (2), precision, height (2), width (2), components
                raise JpegError("ends inside the JPEG frame header", truncated=True)
            height = data[pos + 3] << 8 | data[pos + 4]
            width = data[pos + 5] << 8 | data[pos + 6]
            frame = JpegHeader(height, width, data[pos + 7], marker in _PROGRESSIVE)
            if not to_scan:
                return frame, pos
        if marker == 0xDA:
            return frame, pos + length
        pos += length


def jpeg_header(data: bytes | bytearray | memoryview) -> JpegHeader | None:
    """Read the frame header of a JPEG without decoding it; ``None`` if there is none to read.

    Walks the marker segments up to the first start-of-frame, so it costs a few hundred bytes of
    reading, not a decode. The size is returned even when the data is cut after the frame header.
    """
    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    try:
        frame, _ = walk_jpeg(data, to_scan=False)
    except JpegError:
        return None
    return frame


MAX_SCANS = 100
"""The most scans a JPEG may have (libjpeg writes 10 for a colour progressive JPEG, 1 for a baseline)."""

# A marker after entropy-coded data: 0xFF then a code that is neither a stuffed zero, a restart
# marker (RST0-7, which sits inside the data) nor a fill byte (0xFF, which precedes the real code).
_MARKER = re.compile(rb"\xff[\x01-\xcf\xd8-\xfe]")


def _segments(buf: bytes | bytearray | memoryview) -> Iterator[tuple[int, int]]:
    """``(marker, offset of its length field)`` of each JPEG segment after SOI, up to EOI.

    Segments are skipped by their lengths, and each scan's entropy-coded data with one regular
    expression search for the next marker: a pass over the bytes in C, not a decode (a memoryview,
    such as a mapped shard's image, is searched in place). Lenient: bytes
    that are not a marker are passed over, a file cut short ends the walk.
    """
    pos, n = 2, len(buf)
    while (found := _MARKER.search(buf, pos)) is not None:
        pos = found.end()
        marker = buf[pos - 1]
        if marker == 0xD9:  # EOI
            return
        if marker in _STANDALONE:
            continue
        if pos + 2 > n:
            return
        yield marker, pos
        pos += max(buf[pos] << 8 | buf[pos + 1], 2)  # a corrupt length still moves on


def jpeg_scans(data: bytes | bytearray | memoryview) -> int:
    """How many scans (SOS segments) a JPEG holds (0 for what is not a JPEG); a cut file, those it has."""
    if data[:3] != b"\xff\xd8\xff":
        return 0
    return sum(marker == 0xDA for marker, _ in _segments(data))


def too_many_scans(data: bytes | bytearray | memoryview, max_scans: int | None = None) -> str | None:
    """Why a JPEG has too many scans to decode in bounded time (one line); ``None`` when it has not.

    A baseline JPEG whose first scan holds every colour component is passed after that scan's
    header, unwalked (a few microseconds): libjpeg stops with an error at a second scan of such a
    file. Any other JPEG is walked to its end (tens of microseconds: ~45 us for 90 KB).

    Args:
        data: The image's bytes; anything but a JPEG passes (``None``).
        max_scans: The most scans allowed; ``None`` for :data:`MAX_SCANS`.

    Returns:
        E.g. ``"progressive JPEG with 4010 scans, more than the limit of 100"``; ``None`` within it.

    """
    limit = MAX_SCANS if max_scans is None else max_scans
    frame = jpeg_header(data)
    if frame is None:
        return None
    scans = 0
    for marker, at in _segments(data):
        if marker != 0xDA:
            continue
        if not scans and not frame.progressive and at + 2 < len(data) and data[at + 2] == frame.components:
            return None
        scans += 1
    if scans <= limit:
        return None
    kind = f"progressive {JPEG.pillow}" if frame.progressive else JPEG.pillow
    return f"{kind} with {scans} scans, more than the limit of {limit}"


def _u16le(data: bytes | bytearray | memoryview, at: int) -> int:
    return data[at] | data[at + 1] << 8


def _u32(data: bytes | bytearray | memoryview, at: int, order: Literal["little", "big"]) -> int:
    return int.from_bytes(bytes(data[at : at + 4]), order)


def _webp_size(data: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    chunk = bytes(data[12:16])
    if chunk == b"VP8 " and len(data) >= 30 and bytes(data[23:26]) == b"\x9d\x01\x2a":
        return _u16le(data, 26) & 0x3FFF, _u16le(data, 28) & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = _u32(data, 21, "little")
        return (bits & 0x3FFF) + 1, (bits >> 14 & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return (
            int.from_bytes(bytes(data[24:27]), "little") + 1,
            int.from_bytes(bytes(data[27:30]), "little") + 1,
        )
    return None


def _bmp_size(data: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    if len(data) < 26:
        return None
    if _u32(data, 14, "little") == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sizes
        return _u16le(data, 18), _u16le(data, 20)
    width = int.from_bytes(bytes(data[18:22]), "little", signed=True)
    height = int.from_bytes(bytes(data[22:26]), "little", signed=True)
    return abs(width), abs(height)  # a negative height is a top-down bitmap


def _pnm_size(data: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """Width and height of a PBM/PGM/PPM: the first two numbers after the magic, past comments."""
    numbers: list[int] = []
    pos, n = 2, min(len(data), 1024)
    while len(numbers) < 2 and pos < n:
        c = data[pos]
        if c == 0x23:  # '#': a comment to the end of the line
            while pos < n and data[pos] not in (0x0A, 0x0D):
                pos += 1
        elif 0x30 <= c <= 0x39:
            start = pos
            while pos < n and 0x30 <= data[pos] <= 0x39:
                pos += 1
            numbers.append(int(bytes(data[start:pos])))
            continue
        elif c not in b" \t\r\n\v\f":
            return None
        pos += 1
    return (numbers[0], numbers[1]) if len(numbers) == 2 else None


MAX_WALK = 100_000
"""The most blocks (GIF) or directory entries (TIFF) a header walk reads; an image needing more is refused.

A real GIF takes about four a frame (its control block, its descriptor and the last, short block of
each; the full 255-byte data blocks between cost none), a real TIFF one an entry of each page
(about 15): 25,000 frames or 6,000 pages. The walk of a hostile header stops there, after tens of
milliseconds.
"""


class _TooLong(Exception):
    """A header walk needs more than :data:`MAX_WALK` steps."""


class _Budget:
    """The steps left to a header walk."""

    def __init__(self) -> None:
        self.left = MAX_WALK

    def step(self, steps: int = 1) -> None:
        self.left -= steps
        if self.left < 0:
            raise _TooLong


def _skip_sub_blocks(data: bytes | bytearray | memoryview, pos: int, budget: _Budget) -> int:
    """Where a chain of GIF data sub-blocks starting at ``pos`` ends (after its empty block).

    Encoders write full 255-byte blocks but the last: those cost no step (the data's size bounds
    them, a 256th of it); each shorter one costs one.
    """
    n = len(data)
    while pos < n:
        size = data[pos]
        pos += 1 + size
        if not size:
            break
        if size < 255:
            budget.step()
    return pos


def _gif_size(data: bytes | bytearray | memoryview, budget: _Budget) -> tuple[int, int] | None:
    """The canvas Pillow decodes a GIF into: its logical screen, grown to hold every frame.

    Pillow's GIF reader enlarges the image to ``max(x0 + width)`` by ``max(y0 + height)`` over the
    frames it reads: each frame's descriptor is read here (extensions and image data skipped, stray
    bytes passed over one at a time as Pillow does), to the trailer or to where the data ends.
    ``None`` for a header too short to hold a screen.
    """
    n = len(data)
    if n < 13:
        return None
    width, height = _u16le(data, 6), _u16le(data, 8)
    flags = data[10]
    pos = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)  # the global colour table
    while pos < n:
        budget.step()
        block = data[pos]
        if block == 0x21:  # an extension: its label, then data sub-blocks
            pos = _skip_sub_blocks(data, pos + 2, budget)
        elif block == 0x2C and pos + 10 <= n:  # an image descriptor: where the frame lies
            x0, y0 = _u16le(data, pos + 1), _u16le(data, pos + 3)
            width = max(width, x0 + _u16le(data, pos + 5))
            height = max(height, y0 + _u16le(data, pos + 7))
            local = data[pos + 9]
            pos += 10 + (3 << ((local & 7) + 1) if local & 0x80 else 0)
            pos = _skip_sub_blocks(data, pos + 1, budget)  # after the LZW code size byte
        elif block == 0x3B or block == 0x2C:  # the trailer, or a descriptor cut short
            break
        else:  # a stray byte: Pillow passes over it to the next block, and so does this walk
            pos += 1
    return width, height


def _tiff_size(data: bytes | bytearray | memoryview, budget: _Budget) -> tuple[int, int] | None:
    """The largest page of a TIFF (classic or BigTIFF): width and height of each image file directory.

    Pages are the chain of directories Pillow seeks through (``n_frames``), each read whole (a
    step an entry: about 15 in a real page). ``None`` where no page declares both sizes.
    """
    n = len(data)
    order: Literal["little", "big"] = "little" if bytes(data[:2]) == b"II" else "big"

    def uint(at: int, size: int) -> int:
        return int.from_bytes(bytes(data[at : at + size]), order) if at + size <= n else 0

    big = uint(2, 2) == 43
    # Classic: 2-byte entry count, 12-byte entries, 4-byte offsets. BigTIFF: 8, 20 and 8.
    count_size, entry_size, offset_size = (8, 20, 8) if big else (2, 12, 4)
    at = uint(8, 8) if big else uint(4, 4)
    largest: tuple[int, int] | None = None
    seen: set[int] = set()
    while at and at not in seen and at + count_size <= n:
        seen.add(at)
        budget.step()
        count = uint(at, count_size)
        width = height = 0
        entries = min(count, (n - at - count_size) // entry_size)
        budget.step(entries)
        for k in range(entries):
            entry = at + count_size + k * entry_size
            tag, kind = uint(entry, 2), uint(entry + 2, 2)
            value = entry + 4 + (8 if big else 4)
            size = {3: 2, 4: 4, 16: 8}.get(kind, 0)  # SHORT, LONG, LONG8
            if tag == 256:
                width = uint(value, size)
            elif tag == 257:
                height = uint(value, size)
        if width and height and (largest is None or width * height > largest[0] * largest[1]):
            largest = (width, height)
        at = uint(at + count_size + count * entry_size, offset_size)
    return largest


def image_size(data: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """``(width, height)`` as an image's header declares it, without decoding; ``None`` if unknown.

    Reads JPEG, PNG, WebP, BMP, GIF, TIFF and PBM/PGM/PPM headers. Of a GIF, the canvas its frames
    need (its logical screen grown to hold each one); of a TIFF, its largest page. Other formats, or
    a GIF or TIFF header longer than :data:`MAX_WALK` steps: ``None`` (the read paths then bound the
    size Pillow reads when it opens them, before it decodes).
    """
    try:
        return _image_size(data, _Budget())
    except _TooLong:
        return None


def _image_size(data: bytes | bytearray | memoryview, budget: _Budget) -> tuple[int, int] | None:
    head = bytes(data[:4])
    if head[:3] == b"\xff\xd8\xff":
        frame = jpeg_header(data)
        return None if frame is None else (frame.width, frame.height)
    if head == b"\x89PNG" and len(data) >= 24 and bytes(data[12:16]) == b"IHDR":
        return _u32(data, 16, "big"), _u32(data, 20, "big")
    if head == b"RIFF" and bytes(data[8:12]) == b"WEBP":
        return _webp_size(data)
    if head[:2] == b"BM":
        return _bmp_size(data)
    if head[:3] == b"GIF":
        return _gif_size(data, budget)
    if head in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):  # TIFF, BigTIFF
        return _tiff_size(data, budget)
    if head[:1] == b"P" and head[1:2] in (b"1", b"2", b"3", b"4", b"5", b"6"):
        return _pnm_size(data)
    return None


def pixel_limit(max_pixels: int | None = None) -> int | None:
    """The bound in force: ``max_pixels``, else Pillow's ``Image.MAX_IMAGE_PIXELS`` (``None``: none)."""
    return max_pixels if max_pixels is not None else Image.MAX_IMAGE_PIXELS


def pixel_excess(width: int, height: int, max_pixels: int | None = None) -> str | None:
    """Why ``width x height`` is too many pixels (one line); ``None`` within :func:`pixel_limit`'s bound."""
    limit = pixel_limit(max_pixels)
    if limit is None or width * height <= limit:
        return None
    return f"declares {width}x{height} = {width * height:,} pixels, more than the limit of {limit:,}"


def oversized(data: bytes | bytearray | memoryview, max_pixels: int | None = None) -> str | None:
    """Why an image is too large to decode, from its header; ``None`` when it is within the bound.

    Args:
        data: The image's bytes (its first few hundred are enough for every format but a JPEG with
            large metadata segments before its frame header).
        max_pixels: The bound on ``width * height``; ``None`` for :func:`pixel_limit`'s default.

    Returns:
        One line for a reject or skip reason, e.g. ``"declares 16000x16000 = 256,000,000 pixels,
        more than the limit of 89,478,485"`` (of a GIF or TIFF, its largest frame or page), or why
        no bound can hold (an ICO, a header too long to walk); ``None`` when the size is within the
        bound or unknown (the caller then bounds what Pillow reads: :func:`pixel_excess`).

    """
    if pixel_limit(max_pixels) is None:
        return None
    if (name := unbounded_format(data)) is not None:
        return f"{name} data, whose size Pillow learns only by decoding it: no pixel bound holds before that"
    try:
        size = _image_size(data, _Budget())
    except _TooLong:
        return f"a header of more than {MAX_WALK:,} blocks, frames or tags: too long to bound before decoding"
    return None if size is None else pixel_excess(*size, max_pixels)
