"""Decode image bytes into an RGB ``uint8`` tensor ``[3, H, W]``: one function, :func:`decode`.

JPEG, nearly all of an ImageNet-like dataset, goes through libjpeg-turbo straight into a tensor
(grayscale and CMYK come out RGB): ``torchcodec.decoders.decode_jpeg``, the supported decoder
(torchvision 0.29 deprecates its own image decoders in its favour and warns on every call). Where
torchcodec is not installed, torchvision's ``decode_jpeg`` serves while torchvision still has it
(its deprecation warning silenced: one per image would bury the user's own); without either, Pillow
decodes JPEG too. Other formats go through Pillow, converted to RGB (palette, alpha, grayscale, CMYK).
The JPEG decoders return channels-last strides (``[3, H, W]`` over ``H x W x 3`` memory): the tensor
resizes of the presets read that layout fastest, so it is kept, not copied to planar.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image

from imgshards.converter.headers import (
    JpegHeader,
    jpeg_header,
    oversized,
    too_many_scans,
)  # one JPEG header walker, the converter's

from .errors import CorruptImageError

__all__ = ["JPEG_DECODER", "JpegHeader", "decode", "jpeg_header"]

# Exceptions Pillow and the JPEG decoders raise for bytes that are not a readable image.
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, RuntimeError, Image.DecompressionBombError)


def _jpeg_decoder() -> tuple[str, Callable[[bytes | bytearray | memoryview], torch.Tensor] | None]:
    """The JPEG decoder of this install: torchcodec's, else torchvision's while it has one, else none."""
    try:
        from torchcodec.decoders import decode_jpeg as codec_decode_jpeg
    except ImportError:  # also a torchcodec whose native libraries do not load here
        pass
    else:

        def by_torchcodec(data: bytes | bytearray | memoryview) -> torch.Tensor:
            # bytes as they are: torchcodec reads them through a read-only tensor, no copy.
            source = data if isinstance(data, bytes) else _tensor_of(data)
            out = codec_decode_jpeg(source, mode="RGB")
            assert isinstance(out, torch.Tensor)  # one source in, one image out
            return out

        return "torchcodec", by_torchcodec
    try:
        from torchvision.io import ImageReadMode
        from torchvision.io import decode_jpeg as vision_decode_jpeg
    except ImportError:  # a torchvision that no longer decodes images
        return "pillow", None

    def by_torchvision(data: bytes | bytearray | memoryview) -> torch.Tensor:
        buffer = data if isinstance(data, bytearray) else bytearray(data)  # it wants a writable buffer
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return vision_decode_jpeg(torch.frombuffer(buffer, dtype=torch.uint8), mode=ImageReadMode.RGB)

    return "torchvision", by_torchvision


def _tensor_of(data: bytearray | memoryview) -> torch.Tensor:
    """A uint8 tensor over ``data``'s memory, no copy.

    A view of a mapped shard is read-only: torch warns so, and the tensor is only read.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(data, dtype=torch.uint8)


JPEG_DECODER, _decode_jpeg = _jpeg_decoder()
"""Which library decodes JPEG here: ``"torchcodec"``, ``"torchvision"`` (fallback) or ``"pillow"``."""


def decode(
    data: bytes | bytearray | memoryview, ext: str, *, key: str = "?", shard: str = "?"
) -> torch.Tensor:
    """Decode one image (``ext`` is its format, as named in the shard) to RGB ``uint8 [3, H, W]``.

    The image's header is read first: one that declares more pixels than Pillow's
    ``Image.MAX_IMAGE_PIXELS`` (a decompression bomb: a few hundred bytes asking for gigabytes), or
    a JPEG with more scans than :data:`~imgshards.converter.headers.MAX_SCANS` (each scan a pass
    over the whole image: thousands of them take minutes), is refused before any decode.

    Raises:
        CorruptImageError: the bytes do not decode, declare too many pixels or hold too many scans;
            ``key`` and ``shard`` name the sample in it.

    """
    if (too_costly := oversized(data) or too_many_scans(data)) is not None:
        raise CorruptImageError.for_sample(key, shard, too_costly)
    if ext == "jpg" and _decode_jpeg is not None:
        try:
            return _decode_jpeg(data)
        except (RuntimeError, ValueError):
            pass  # refused by libjpeg (rare: truncated, empty, exotic); Pillow has the last word
    try:
        with Image.open(io.BytesIO(data)) as im:
            rgb = im.convert("RGB") if im.mode != "RGB" else im
            rgb.load()
            array = np.array(rgb)
    except _DECODE_ERRORS as e:
        raise CorruptImageError.for_sample(key, shard, f"{type(e).__name__}: {e}") from None
    return torch.from_numpy(array).permute(2, 0, 1)
