"""Decode a large JPEG at the scale a preset's view of it needs: :func:`scaled_decoder`.

A 12 MP photo's ``RandomResizedCrop(224)`` view never needs more than a quarter of its resolution,
``eval``'s resize to 256 never more than an eighth: decoding all of it spends most of a worker's
time on pixels the resize then averages away. For a JPEG whose shorter side could give some view
at half resolution (the preset's ``reducible_from``, read from the frame header), the view is drawn
from the header's (upright) size first, with the same draws from the same generator as the preset
makes on the decoded image; the image is then decoded at the largest DCT scale the view allows
(:func:`~.presets.reduction`) and the view applied to it (``apply_reduced``).

Everything else goes the usual way, :func:`~.decode.decode` then the transform, unchanged: a
smaller image (one header read more, a few microseconds), a view that needs full resolution, a
CMYK JPEG (libjpeg-turbo's and Pillow's conversions to RGB differ), and any JPEG the reduced decode
cannot take (refused, corrupt). The generator's state is put back before such a fallback, so the
transform then draws exactly what it would have: the view of every image stays the same function
of (seed, epoch, sample), and a corrupt image consumes no draws, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import ImageShapeError
from .decode import OpenJpeg, Reduced, jpeg_header, open_jpeg
from .presets import Preset, Transform, View, reduction

__all__ = ["HALF_FROM_PIXELS", "ScaledDecoder", "scaled_decoder"]
Timer = Callable[[Callable[..., Any]], Callable[..., Any]]

# Below this many pixels a half-scale decode does not pay: Pillow's decode at 1/2 and its resize
# cost what torchcodec's whole decode and torch's resize cost, or more. Measured here on one
# thread, train preset, a 600x700 view: 683x512 0.81x (its largest view), 1024x768 1.01x,
# 1280x960 1.08x, 1600x1200 1.16x, 12 MP 2.78x. Such an image is decoded at 1/4 or 1/8 only.
HALF_FROM_PIXELS = 1 << 20


class ScaledDecoder:
    """Decode and transform a JPEG at a reduced scale where ``preset``'s view allows; else ``None``.

    ``decode_timer`` and ``augment_timer`` wrap the decode and the resize (a step clock's), so the
    two are timed apart as on the usual path. An image of fewer than ``half_from`` pixels is decoded
    at 1/4 or 1/8 only (:data:`HALF_FROM_PIXELS`).
    """

    def __init__(
        self, preset: Preset, decode_timer: Timer, augment_timer: Timer, *, half_from: int = HALF_FROM_PIXELS
    ) -> None:
        self.preset = preset
        self.half_from = half_from
        self._decode: Callable[[OpenJpeg], tuple[Reduced, View] | None] = decode_timer(self._reduced_decode)
        self._apply: Callable[[Reduced, View], torch.Tensor] = augment_timer(preset.apply_reduced)

    def __call__(self, data: bytes | bytearray | memoryview, ext: str) -> torch.Tensor | None:
        """The transformed image of ``data``, decoded reduced; ``None``: take the usual path."""
        if ext != "jpg":
            return None
        frame = jpeg_header(data)
        if frame is None or min(frame.height, frame.width) < self._reducible_from(frame.height * frame.width):
            return None  # the usual JPEG: one header read, the cost of this module to it
        if frame.components not in (1, 3):
            return None
        state = torch.get_rng_state()
        with open_jpeg(data) as jpeg:  # the reduced image lives as long as the opened one
            found = None if jpeg is None else self._decode(jpeg)
            if found is None:
                torch.set_rng_state(state)  # the transform draws again, the same draws
                return None
            return self._apply(*found)

    def _reducible_from(self, pixels: int) -> int:
        """The shorter side from which some view of an image of ``pixels`` is decoded smaller."""
        quarter = pixels < self.half_from  # not halved: a quarter needs twice the side
        return self.preset.reducible_from * (2 if quarter else 1)

    def _reduced_decode(self, jpeg: OpenJpeg) -> tuple[Reduced, View] | None:
        """Draw the view from ``jpeg``'s size; decode it at the scale the view allows (``None``: 1)."""
        try:
            view = self.preset.draw(jpeg.height, jpeg.width)
        except ImageShapeError:
            return None  # refused after the decode, as it always was
        scale = reduction(view, self.preset.size)
        if scale == 1 or (scale == 2 and jpeg.height * jpeg.width < self.half_from):
            return None
        reduced = jpeg.decode(scale)
        return None if reduced is None else (reduced, view)


def _untimed(f: Callable[..., Any]) -> Callable[..., Any]:
    return f


def scaled_decoder(
    transform: Transform,
    decode_timer: Timer = _untimed,
    augment_timer: Timer = _untimed,
    *,
    half_from: int = HALF_FROM_PIXELS,
) -> ScaledDecoder | None:
    """A :class:`ScaledDecoder` for ``transform`` if it is one of the presets; ``None`` for any other."""
    if isinstance(transform, Preset):  # what it needs it asks the preset: its size, draws, reduced apply
        return ScaledDecoder(transform, decode_timer, augment_timer, half_from=half_from)
    return None
