"""Decode image bytes into an RGB ``uint8`` tensor ``[3, H, W]``.

JPEG, nearly all of an ImageNet-like dataset, goes through libjpeg-turbo in
``torchvision.io.decode_jpeg`` straight into a tensor (grayscale and CMYK come out RGB). Other formats
go through Pillow, converted to RGB (palette, alpha, grayscale, CMYK). The result of
``decode_jpeg`` has channels-last strides (``[3, H, W]`` over ``H x W x 3`` memory): the tensor
resizes of the presets read that layout fastest, so it is kept, not copied to planar.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

from imgshards.converter.headers import JpegHeader, jpeg_header  # one JPEG header walker, the converter's

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
