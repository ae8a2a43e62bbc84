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
  re-encoded: to PNG losslessly (alpha, palette and 16-bit gray kept), to JPEG at quality
  :data:`JPEG_QUALITY` with 4:4:4 chroma. JPEG has no alpha: transparent images are composited onto
  white. Gray stays gray; CMYK, palette and other modes become RGB. Only the first frame of a
  multi-frame TIFF or an animated WebP is kept. Each conversion is counted by reason
  (``"png_to_jpg"``, ``"alpha_flattened"``...) in the summary and the index.

``keep_formats`` stores every image's original bytes under its own extension instead;
:func:`reader_warnings` says which readers then miss what.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from PIL import Image

__all__ = ["JPEG_QUALITY", "ConvertedImage", "convert_image", "main_format", "reader_warnings"]

JPEG_QUALITY = 95
_LOSSLESS_SUFFIXES = frozenset({".png", ".bmp", ".tif", ".tiff", ".ppm", ".pgm"})
_PNG_MODES = frozenset({"1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"})
# Image keys of timm's ReaderWds (timm.data.readers.reader_wds, ``input_key``): samples with none
# of these are dropped with a warning.
_TIMM_KEYS = ("jpg", "png", "webp")


def main_format(paths: Iterable[str]) -> str:
    """The split's format, ``"jpg"`` or ``"png"``, from its files' names (see the module docstring)."""
    lossless = lossy = 0
    for path in paths:
        if os.path.splitext(path)[1].lower() in _LOSSLESS_SUFFIXES:
            lossless += 1
        else:
            lossy += 1
    return "png" if lossless > lossy else "jpg"


@dataclass(frozen=True)
class ConvertedImage:
    """An image re-encoded into the split's format, its size, and why it was converted."""

    data: bytes
    width: int
    height: int
    reasons: tuple[str, ...]


def _has_alpha(im: Image.Image) -> bool:
    return im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in im.info


def _to_gray8(im: Image.Image) -> Image.Image:
    """16- and 32-bit gray to 8 bits, scaled (Pillow's ``convert("L")`` clips at 255)."""
    pixels = np.asarray(im)
    if im.mode.startswith("I;16"):
        return Image.fromarray((pixels.astype(np.uint16) >> 8).astype(np.uint8))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _for_jpeg(im: Image.Image) -> tuple[Image.Image, bool]:
    """An L or RGB image JPEG can store, and whether transparency was composited onto white."""
    if _has_alpha(im):
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        white.alpha_composite(rgba)
        return white.convert("RGB"), True
    if im.mode in ("L", "RGB"):
        return im, False
    if im.mode == "1":
        return im.convert("L"), False
    if im.mode.startswith("I") or im.mode == "F":
        return _to_gray8(im), False
    return im.convert("RGB"), False


def _for_png(im: Image.Image) -> Image.Image:
    if im.mode in _PNG_MODES:
        return im
    if im.mode.startswith("I;16"):
        return im.convert("I;16")
    if im.mode == "F":
        return _to_gray8(im)
    return im.convert("RGBA" if _has_alpha(im) else "RGB")


def convert_image(data: bytes, source: str, target: str) -> ConvertedImage:
    """Re-encode ``data`` (an image in format ``source``) as ``target`` (``"jpg"`` or ``"png"``).

    Raises:
        Exception: whatever Pillow raises for data it cannot decode (the caller rejects the file).

    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # palette-with-transparency notices and the like
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            reasons = [f"{source}_to_{target}"]
            out = io.BytesIO()
            icc = im.info.get("icc_profile")
            if target == "jpg":
                image, flattened = _for_jpeg(im)
                if flattened:
                    reasons.append("alpha_flattened")
                keep_icc = icc if image.mode == im.mode else None  # a profile describes its own mode
                image.save(out, format="JPEG", quality=JPEG_QUALITY, subsampling=0, icc_profile=keep_icc)
            elif target == "png":
                image = _for_png(im)
                extra = {"transparency": im.info["transparency"]} if "transparency" in im.info else {}
                if image.mode != im.mode:
                    extra = {}
                keep_icc = icc if image.mode == im.mode else None
                image.save(out, format="PNG", icc_profile=keep_icc, **extra)
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
