"""Decode image bytes into an RGB ``uint8`` tensor ``[3, H, W]``.

JPEG, nearly all of an ImageNet-like dataset, goes through libjpeg-turbo in
``torchvision.io.decode_jpeg`` straight into a tensor (grayscale and CMYK come out RGB). Other formats
go through Pillow, converted to RGB (palette, alpha, grayscale, CMYK). The result of
``decode_jpeg`` has channels-last strides (``[3, H, W]`` over ``H x W x 3`` memory): the tensor
resizes of the presets read that layout fastest, so it is kept, not copied to planar.
"""

from __future__ import annotations

import io
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

from .errors import CorruptImageError

__all__ = ["JpegHeader", "decode", "jpeg_header"]

# Exceptions Pillow and torchvision raise for bytes that are not a readable image.
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, RuntimeError, Image.DecompressionBombError)


def decode(data: bytes | bytearray, ext: str, *, key: str = "?", shard: str = "?") -> torch.Tensor:
    """Decode one image (``ext`` is its format, as named in the shard) to RGB ``uint8 [3, H, W]``.

    Raises:
        CorruptImageError: the bytes do not decode; ``key`` and ``shard`` name the sample in it.

    """
    if ext == "jpg":
        try:
            # decode_jpeg wants a writable buffer: the reader's bytearray, or a copy of bytes.
            buffer = data if isinstance(data, bytearray) else bytearray(data)
            return decode_jpeg(torch.frombuffer(buffer, dtype=torch.uint8), mode=ImageReadMode.RGB)
        except (RuntimeError, ValueError):
            pass  # refused by torchvision (rare: truncated, empty, exotic); Pillow has the last word
    try:
        with Image.open(io.BytesIO(data)) as im:
            rgb = im.convert("RGB") if im.mode != "RGB" else im
            rgb.load()
            array = np.array(rgb)
    except _DECODE_ERRORS as e:
        raise CorruptImageError.for_sample(key, shard, f"{type(e).__name__}: {e}") from None
    return torch.from_numpy(array).permute(2, 0, 1)


class JpegHeader(NamedTuple):
    """What a JPEG's frame header says: size, colour components, and whether it is progressive."""

    height: int
    width: int
    components: int
    progressive: bool


# Start-of-frame markers (SOF0-SOF15 but DHT, JPG and DAC, which share the range).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = frozenset([0x01, *range(0xD0, 0xD8)])  # TEM, RST0-7: no length field


def jpeg_header(data: bytes | bytearray | memoryview) -> JpegHeader | None:
    """Read the frame header of a JPEG without decoding it; ``None`` if there is none to read.

    Walks the marker segments up to the first start-of-frame (each segment's length is checked
    against the data), so it costs a few hundred bytes of reading, not a decode.
    """
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    pos = 2
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        length = data[pos + 2] << 8 | data[pos + 3]
        if length < 2 or pos + 2 + length > n:
            return None
        if marker in _SOF:
            if length < 8:
                return None
            seg = pos + 4  # precision, height (2), width (2), components
            height = data[seg + 1] << 8 | data[seg + 2]
            width = data[seg + 3] << 8 | data[seg + 4]
            return JpegHeader(height, width, data[seg + 5], marker in (0xC2, 0xC6, 0xCA, 0xCE))
        if marker == 0xDA:  # start of scan before any frame header
            return None
        pos += 2 + length
    return None
