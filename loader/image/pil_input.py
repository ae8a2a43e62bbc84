"""A transform written for torchvision's ``ImageFolder``: PIL images in, as it was written for.

``ImageFolder`` hands its ``transform=`` a PIL image; a pass hands its transform a ``uint8 [3, H, W]``
tensor (what the decoder makes, and what the presets and torchvision's v2 transforms take fastest).
Most of torchvision's transforms take either, but ``ToTensor`` (v1, and v2's deprecated one) and
``PILToTensor`` take only PIL images or arrays: v1's raises ``pic should be PIL Image or ndarray``
on a tensor, and v2's passes the tensor on unscaled, which ``Normalize`` then refuses. A transform
holding one of them is wrapped in :class:`PilInput`, decided once when the dataset is built
(:func:`user_transform`); every other callable, and every preset, gets the tensor as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from PIL import Image

__all__ = ["PilInput", "user_transform"]

# The transforms that take a PIL image (or an array), never a tensor, by class name in torchvision's
# modules: v1 and v2 both have a ToTensor and a PILToTensor.
_PIL_ONLY = frozenset({"ToTensor", "PILToTensor"})


class PilInput:
    """``transform`` given each image as an RGB PIL image, as ``ImageFolder`` gives it.

    A PIL image it returns (a pipeline without ``ToTensor``) becomes a ``uint8 [3, H, W]`` tensor.
    """

    def __init__(self, transform: Callable[[Any], Any]) -> None:
        self.transform = transform

    def __call__(self, image: torch.Tensor) -> Any:
        """``transform`` of ``image`` (``uint8 [3, H, W]``) as a PIL image."""
        # [3, H, W] with channels-last strides (the decoder's) is H x W x 3 memory: no copy to numpy.
        pixels = np.ascontiguousarray(image.permute(1, 2, 0).numpy())
        out = self.transform(Image.fromarray(pixels, "RGB"))
        if isinstance(out, Image.Image):
            return torch.from_numpy(np.asarray(out.convert("RGB")).copy()).permute(2, 0, 1)
        return out

    def __repr__(self) -> str:
        return f"PilInput({self.transform!r})"


def user_transform(transform: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``transform`` as a pass applies it: in :class:`PilInput` if it holds a PIL-only step."""
    if any(type(step).__name__ in _PIL_ONLY and _torchvision(step) for step in _steps(transform)):
        return PilInput(transform)
    return transform


def _torchvision(step: object) -> bool:
    return type(step).__module__.startswith("torchvision.transforms")


def _steps(transform: object, depth: int = 0) -> Iterator[object]:
    """``transform`` and the steps inside it (``Compose``, ``RandomApply``, ``RandomChoice``...)."""
    yield transform
    inner = getattr(transform, "transforms", None)
    if depth < 8 and isinstance(inner, list | tuple | torch.nn.ModuleList):
        for step in inner:
            yield from _steps(step, depth + 1)
