"""Decide, from a file's bytes, whether it is an image worth packing and under which extension.

Three levels (``--check``):

``header`` (default)
    Cheap: the format is sniffed from the magic bytes (so a PNG named ``.jpg`` is stored as ``.png``),
    and truncation is caught where the format allows it without decoding: a JPEG must have an end
    marker (EOI) after its first scan, a PNG its ``IEND`` chunk, a WebP or BMP as many bytes as its
    header declares. TIFF and PPM/PGM are checked for their magic only. The pixel count the header
    declares is bounded (``max_pixels``, default Pillow's ``Image.MAX_IMAGE_PIXELS``), every page of
    a TIFF included, and so is the size Pillow reads when it opens the other formats, before a
    pixel is decoded: a decompression bomb is rejected as ``too_many_pixels``; so is the decode time
    of a JPEG: one with more scans than ``headers.MAX_SCANS`` (100) is rejected as
    ``too_many_scans`` (see :mod:`.format.headers`). A JPEG with a second frame header, which
    libjpeg refuses and whose second size Pillow would allocate first, is ``undecodable``.
``full``
    Also decodes every image with Pillow (after the header's bound): catches corrupt entropy-coded data.
``none``
    Trusts the input: every readable file is packed; the extension comes from the magic bytes when
    they are recognised, else from the file name.
"""

from __future__ import annotations

import io
import struct
import warnings
from dataclasses import dataclass

from PIL import Image

from ..config import Check
from ..format.formats import HEIF_EXTRA, heif_opener
from ..format.headers import JpegError, oversized, pixel_excess, too_many_scans, walk_jpeg
from ..format.imageformats import BMP, HEIC, JPEG, PNG, WEBP, member_name, sniff, unsupported_format
from .reasons import Reason

__all__ = ["Check", "Inspection", "inspect_image"]  # Check: the setting, the config's (re-exported)


@dataclass(frozen=True)
class Inspection:
    """The verdict on one file: its image extension and size, or why it is rejected."""

    ext: str | None = None
    width: int = 0
    height: int = 0
    reason: Reason | None = None
    detail: str = ""


def _jpeg_header(data: bytes) -> Inspection:
    """Walk the JPEG marker segments up to the first scan, then look for the end marker."""
    try:
        frame, pos = walk_jpeg(data, to_scan=True)
    except JpegError as e:
        return Inspection(reason=Reason.TRUNCATED if e.truncated else Reason.UNDECODABLE, detail=str(e))
    # Entropy-coded data never holds 0xFFD9 (0xFF is always stuffed), so an end marker after the
    # scan starts means the image data is complete; trailing bytes after it are allowed. Searched
    # from the end, where it is in a whole file: a forward search would walk all the image data.
    if data.rfind(b"\xff\xd9", pos) < 0:
        return Inspection(reason=Reason.TRUNCATED, detail="no JPEG end marker (EOI) after the image data")
    if frame is None or not frame.width or not frame.height:
        return Inspection(reason=Reason.NOT_IMAGE, detail="JPEG without a frame header (SOF)")
    if (excess := too_many_scans(data)) is not None:  # minutes of decoding in every epoch
        return Inspection(reason=Reason.TOO_MANY_SCANS, detail=excess)
    return Inspection(ext=JPEG.name, width=frame.width, height=frame.height)


def _png_header(data: bytes) -> Inspection:
    if len(data) < 24 or data[12:16] != b"IHDR":
        return Inspection(reason=Reason.TRUNCATED, detail="ends inside the PNG header")
    width, height = struct.unpack_from(">II", data, 16)
    if data.rfind(b"IEND", max(0, len(data) - 64)) < 0:
        return Inspection(reason=Reason.TRUNCATED, detail="no PNG IEND chunk at the end")
    return Inspection(ext=PNG.name, width=width, height=height)


def _declared_length(ext: str, data: bytes) -> int:
    if ext == WEBP.name:
        return int(struct.unpack_from("<I", data, 4)[0]) + 8
    if ext == BMP.name and len(data) >= 6:
        return int(struct.unpack_from("<I", data, 2)[0])  # 0 in some writers: nothing to compare
    return 0


def _pillow_header(ext: str, data: bytes) -> Inspection:
    if len(data) < _declared_length(ext, data):
        return Inspection(reason=Reason.TRUNCATED, detail=f"shorter than its {ext.upper()} header declares")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as im:
                width, height = im.size
    except Image.DecompressionBombError as e:  # past twice Pillow's own bound, whatever ours is
        return Inspection(reason=Reason.TOO_MANY_PIXELS, detail=str(e))
    except Exception as e:  # Pillow raises many types for bad headers; each is a verdict here
        return Inspection(reason=Reason.UNDECODABLE, detail=f"{type(e).__name__}: {e}")
    return Inspection(ext=ext, width=width, height=height)


def _decode_fully(ext: str, data: bytes) -> Inspection:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as im:
                im.load()
                width, height = im.size
    except Exception as e:  # a decode failure of any type is the verdict we are after
        text = str(e)
        reason = Reason.TRUNCATED if "truncated" in text else Reason.UNDECODABLE
        return Inspection(reason=reason, detail=f"{type(e).__name__}: {text}")
    return Inspection(ext=ext, width=width, height=height)


def inspect_image(data: bytes, suffix: str, check: Check, max_pixels: int | None = None) -> Inspection:
    """Return the verdict on a file's bytes.

    Args:
        data: The whole file.
        suffix: The file name's extension, lower case with its dot (``".jpeg"``).
        check: How thoroughly to look (see the module docstring).
        max_pixels: The bound on ``width * height`` (not applied by ``check`` none); ``None`` for
            Pillow's ``Image.MAX_IMAGE_PIXELS``.

    """
    found = sniff(data)
    ext = found.name if found is not None else None
    if found is HEIC and not heif_opener():  # registers pillow-heif's opener for what follows
        return Inspection(reason=Reason.UNSUPPORTED_FORMAT, detail=f"HEIC needs pillow-heif: {HEIF_EXTRA}")
    if check is Check.NONE:
        return Inspection(ext=ext or member_name(suffix))
    if not data:
        return Inspection(reason=Reason.EMPTY, detail="zero bytes")
    if ext is None:
        if (name := unsupported_format(data)) is not None:
            return Inspection(reason=Reason.UNSUPPORTED_FORMAT, detail=f"{name} data in a {suffix} file")
        return Inspection(reason=Reason.NOT_IMAGE, detail=f"no image signature (starts with {data[:8]!r})")
    if found is JPEG:
        verdict = _jpeg_header(data)
    elif found is PNG:
        verdict = _png_header(data)
    elif excess := oversized(data, max_pixels):  # before Pillow reads more of a bomb than its header
        return Inspection(reason=Reason.TOO_MANY_PIXELS, detail=excess)
    else:
        verdict = _pillow_header(ext, data)
    if verdict.reason is None and (excess := pixel_excess(verdict.width, verdict.height, max_pixels)):
        return Inspection(reason=Reason.TOO_MANY_PIXELS, detail=excess)  # before any decode
    if verdict.reason is None and check is Check.FULL:
        return _decode_fully(ext, data)
    return verdict
