"""One image format per split, so that every reader sees every sample.

A WebDataset sample's image member is named by its format (``.jpg``, ``.png``...), and readers look
for the names they were told: timm's wds reader skips samples without one of its image keys,
Hugging Face ``datasets`` makes one column per extension (``None`` in the rows of other formats), and
webdataset's ``to_tuple("jpg")`` raises on a ``.tiff``. So by default ``pack`` stores each split in
one format, decided from the tree:

- **PNG** when more of the split's files are named as lossless formats (``.png``, ``.bmp``,
  ``.tif``/``.tiff``, ``.ppm``, ``.pgm``) than as lossy ones (``.jpg``/``.jpeg``, ``.webp``);
  **JPEG** otherwise (ties, the common photo folder). A pure function of the file names, so the same
  tree gives the same format on any machine and a resumed run agrees with the run it continues.
- Images already in that format (by their bytes) are stored as they are; the others are decoded and
  re-encoded: to PNG losslessly (alpha, palette and 16-bit gray kept; 32-bit integer gray, which PNG
  cannot hold, as 16-bit: values clipped to 0..65535), to JPEG at quality :data:`JPEG_QUALITY` with
  4:4:4 chroma. JPEG has no alpha: transparent images are composited onto white. Gray stays gray
  (16- and 32-bit integer gray scaled to 8 bits by :func:`eight_bit`); CMYK, palette and other modes
  become RGB. Only the first frame of a multi-frame TIFF or an animated WebP is kept. Each conversion
  is counted by reason (``"png_to_jpg"``, ``"alpha_flattened"``...) in the summary and the index.

``keep_formats`` stores every image's original bytes under its own extension instead;
:func:`reader_warnings` says which readers then miss what. The loader decodes a kept image as it
would the converted one: upright (below), transparency composited onto white by :func:`on_white`,
and more than 8 bits of gray scaled by :func:`eight_bit`.

Phone photos come as HEIC (the iPhone's default) and AVIF, which no common reader of shards decodes:
they are always converted to the split's format (JPEG when ``keep_formats`` leaves it open). AVIF
goes through Pillow itself; HEIC through the pillow-heif plugin, an extra (:data:`HEIF_EXTRA`):
without it a HEIC file is rejected with a reason naming that command.

EXIF orientation, decided once for every format: an image arrives upright. An image stored as it is
(a JPEG, or any format kept) keeps its orientation tag, which the loader applies (its libjpeg-turbo
decoders for JPEG, :func:`upright` for the rest); an image converted here
(any format, any reason) has its orientation applied to its pixels (:func:`upright`, counted as
``"exif_rotated"``), since the re-encoded file carries no tag. pillow-heif applies a HEIC's own
rotation when it opens it and leaves no tag to apply twice.
"""

from __future__ import annotations

import functools
import io
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from PIL import Image

from .imageformats import ALWAYS_CONVERTED, FORMATS, HEIC, JPEG, PNG

__all__ = [
    "ALWAYS_CONVERTED",
    "EXIF_TRANSPOSE",
    "HEIF_EXTRA",
    "JPEG_QUALITY",
    "ConvertedImage",
    "convert_image",
    "eight_bit",
    "heif_opener",
    "main_format",
    "on_white",
    "orientation",
    "reader_warnings",
    "upright",
]

HEIF_EXTRA = 'pip install -e ".[heic]"'
"""The command that installs the HEIC decoder (pillow-heif), named where a HEIC file is rejected."""

JPEG_QUALITY = 95
_LOSSLESS_SUFFIXES = frozenset(s for f in FORMATS if f.lossless for s in f.suffixes)
# Modes Pillow writes as PNG as they are ("I", 32-bit, it cannot: see _for_png).
_PNG_MODES = frozenset({"1", "L", "LA", "I;16", "P", "RGB", "RGBA"})
# Image keys of timm's ReaderWds (timm.data.readers.reader_wds, ``input_key``): samples with none
# of these are dropped with a warning.
_TIMM_KEYS = tuple(f.name for f in FORMATS if f.timm)


@functools.cache
def heif_opener() -> bool:
    """Register pillow-heif's HEIC opener with Pillow (once); ``False`` when it is not installed."""
    try:
        import pillow_heif  # the heic extra
    except ImportError:
        return False
    pillow_heif.register_heif_opener()
    return True


EXIF_TRANSPOSE: dict[int, Image.Transpose] = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
"""EXIF orientation (tag 0x0112) -> the transposition that shows the image upright (1: none)."""


def orientation(im: Image.Image) -> int:
    """The EXIF orientation of an opened image: 1 to 8, 1 when it has none (or one out of range)."""
    value = im.getexif().get(0x0112, 1)
    return value if isinstance(value, int) and value in EXIF_TRANSPOSE else 1


def upright(im: Image.Image, turn: int) -> Image.Image:
    """``im`` with EXIF orientation ``turn`` (:func:`orientation` of its source) applied to its pixels."""
    return im.transpose(EXIF_TRANSPOSE[turn]) if turn in EXIF_TRANSPOSE else im


def main_format(paths: Iterable[str]) -> str:
    """The split's format, ``"jpg"`` or ``"png"``, from its files' names (see the module docstring)."""
    lossless = lossy = 0
    for path in paths:
        if os.path.splitext(path)[1].lower() in _LOSSLESS_SUFFIXES:
            lossless += 1
        else:
            lossy += 1
    return PNG.name if lossless > lossy else JPEG.name


@dataclass(frozen=True)
class ConvertedImage:
    """An image re-encoded into the split's format, its size, and why it was converted."""

    data: bytes
    width: int
    height: int
    reasons: tuple[str, ...]


def _has_alpha(im: Image.Image) -> bool:
    return im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info


def eight_bit(im: Image.Image) -> Image.Image:
    """``im`` with at most 8 bits a channel: integer gray of 16 or 32 bits scaled to ``L``, the rest as is.

    16-bit gray (``I;16``, ``I;16B``...) keeps its top 8 bits; 32-bit integer gray (``I``) is read as
    16-bit (clipped to 0..65535, as :func:`convert_image` stores it in a PNG) and scaled the same;
    float gray (``F``) is clipped to 0..255. Pillow's own ``convert("L")`` / ``convert("RGB")`` clip
    every value above 255 to white. The one scaling of both ``pack``'s conversion to JPEG and the
    loader's decode of a kept image, so that both give the same pixels.
    """
    if not (im.mode.startswith("I") or im.mode == "F"):
        return im
    pixels = np.asarray(im)
    if im.mode == "F":
        return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    return Image.fromarray((np.clip(pixels, 0, 65535).astype(np.uint16) >> 8).astype(np.uint8))


def _to_gray16(im: Image.Image) -> Image.Image:
    """Integer gray as ``I;16``, clipped to 0..65535: what PNG holds of 32-bit, 16-bit of any byte order."""
    return Image.fromarray(np.clip(np.asarray(im), 0, 65535).astype(np.uint16))


def on_white(im: Image.Image) -> Image.Image:
    """``im`` composited onto white as RGB if it has transparency, else ``im`` itself (no work).

    Transparency is an alpha band (``RGBA``, ``LA``, ``PA``...) or a ``transparency`` entry (a
    palette's or a color key's PNG ``tRNS``). The one flattening of both ``pack``'s conversion to
    JPEG, which has no alpha, and the loader's decode of a kept image, so that both give the same
    pixels (Pillow's ``convert("RGB")`` drops the alpha and shows what lies under it).
    """
    if not _has_alpha(im):
        return im
    rgba = im.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    white.alpha_composite(rgba)
    return white.convert("RGB")


def jpeg_ready(im: Image.Image) -> Image.Image:
    """``im`` as an L or RGB image JPEG can store: transparency on white, deep gray scaled to 8 bits.

    The one conversion of what pack stores as JPEG, ``--resize``'s re-encode included.
    """
    return _for_jpeg(im)[0]


def _for_jpeg(im: Image.Image) -> tuple[Image.Image, bool]:
    """An L or RGB image JPEG can store, and whether transparency was composited onto white."""
    if _has_alpha(im):
        return on_white(im), True
    if im.mode in ("L", "RGB"):
        return im, False
    if im.mode == "1":
        return im.convert("L"), False
    if im.mode.startswith("I") or im.mode == "F":
        return eight_bit(im), False
    return im.convert("RGB"), False


def _for_png(im: Image.Image) -> Image.Image:
    if im.mode in _PNG_MODES:
        return im
    if im.mode.startswith("I"):  # I;16B and the like (Pillow's convert("I;16") zeroes them), and I
        return _to_gray16(im)
    if im.mode == "F":
        return eight_bit(im)
    return im.convert("RGBA" if _has_alpha(im) else "RGB")


def convert_image(data: bytes, source: str, target: str) -> ConvertedImage:
    """Re-encode ``data`` (an image in format ``source``) as ``target`` (``"jpg"`` or ``"png"``), upright.

    Raises:
        Exception: whatever Pillow raises for data it cannot decode (the caller rejects the file).

    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # palette-with-transparency notices and the like
        if source == HEIC.name and not heif_opener():
            raise ValueError(f"HEIC needs pillow-heif: {HEIF_EXTRA}")
        with Image.open(io.BytesIO(data)) as opened:
            opened.load()
            reasons = [f"{source}_to_{target}"]
            turn = orientation(opened)
            im = upright(opened, turn)
            if turn != 1:
                reasons.append("exif_rotated")
            out = io.BytesIO()
            icc = im.info.get("icc_profile")
            if target == JPEG.name:
                image, flattened = _for_jpeg(im)
                if flattened:
                    reasons.append("alpha_flattened")
                keep_icc = icc if image.mode == im.mode else None  # a profile describes its own mode
                image.save(out, format=JPEG.pillow, quality=JPEG_QUALITY, subsampling=0, icc_profile=keep_icc)
            elif target == PNG.name:
                image = _for_png(im)
                extra = {"transparency": im.info["transparency"]} if "transparency" in im.info else {}
                if image.mode != im.mode:
                    extra = {}
                keep_icc = icc if image.mode == im.mode else None
                image.save(out, format=PNG.pillow, icc_profile=keep_icc, **extra)
            else:
                raise ValueError(f"target format must be jpg or png, got {target!r}")
            return ConvertedImage(out.getvalue(), image.width, image.height, tuple(reasons))


def reader_warnings(formats: Mapping[str, int]) -> list[str]:
    """What common readers miss in a split whose images are stored under these extensions (counts)."""
    if len(formats) <= 1 and not set(formats) - set(_TIMM_KEYS):
        return []
    total = sum(formats.values())
    shown = ", ".join(f"{ext} {n:,}" for ext, n in sorted(formats.items(), key=lambda kv: -kv[1]))
    notes = [f"images kept in {len(formats)} formats ({shown})"]
    dropped = {ext: n for ext, n in formats.items() if ext not in _TIMM_KEYS}
    if dropped:
        lost = sum(dropped.values())
        notes.append(
            f"timm's wds reader skips the {lost:,} {'/'.join(sorted(dropped))} samples "
            f"(it reads {', '.join(_TIMM_KEYS)})"
        )
    if len(formats) > 1:
        main, n = max(formats.items(), key=lambda kv: kv[1])
        notes.append(
            f"Hugging Face datasets makes one image column per format: {total - n:,} of {total:,} rows "
            f"have no {main!r} image"
        )
        notes.append(
            "webdataset's to_tuple() must list every extension: "
            f'to_tuple("{";".join(sorted(formats))}", "cls")'
        )
    return notes
