"""Augmentation presets on RGB ``uint8 [3, H, W]`` tensors, made for speed in DataLoader workers.

- ``"train"``: torchvision's reference recipe, ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip()``.
- ``"resnet"``: the scale augmentation of He et al. (2015): shorter side uniform in ``[256, 480]``, a
  random ``224`` crop, a flip, then colour: ``ColorJitter(0.4, 0.4, 0.4)`` and AlexNet's PCA
  lighting (std 0.1), as in ``fb.resnet.torch``.
- ``"eval"``: resize the shorter side to ``256``, centre crop ``224``.

``size`` scales every number (``256`` is ``round(size * 256 / 224)``). Every preset returns a
``uint8`` tensor with channels-last strides; no float image leaves a preset.

How they are fast, and where they differ from a ``torchvision.transforms.v2.Compose`` of the same
steps (which they were checked against):

- Crop before resize: the crop is drawn in source coordinates and only that region is resized
  (``RandomResizedCrop`` works so; ``"resnet"`` draws its crop side as ``shorter * 224 / S`` source
  pixels instead of resizing the whole image to ``S`` first: same distribution of views, up to
  rounding of the crop box to whole source pixels).
- The region is resized by ``torch.nn.functional.interpolate`` (bilinear, antialias) on ``uint8``
  in channels-last layout: the kernel ``torchvision.transforms.v2.functional.resize`` calls, without
  its per-call overhead (~15% of a resize at this size).
- Colour jitter and lighting are affine in RGB, so the three jitter steps (in random order, as
  torchvision's) and the lighting offset are composed into one 3x3 matrix and offset, applied in a
  single pass and clamped once at the end (``fb.resnet.torch`` does not clamp between steps either;
  torchvision does): about 4x faster than ``v2.ColorJitter`` on ``uint8``.

Randomness comes from torch's default generator, which :class:`~imgshards.loader.ShardDataset` seeds
for every batch from ``(seed, epoch, rank, worker, batch)``, so the same view of an image comes back
on a rerun and after a mid-epoch resume.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, get_args

import numpy as np
import torch
import torchvision.transforms.v2.functional as F
from torch.nn.functional import conv2d, interpolate

from .errors import ConfigError

__all__ = [
    "PRESETS",
    "PresetName",
    "RandomResizedCropFlip",
    "ResizeCenterCrop",
    "ScaleCropFlipColor",
    "Transform",
    "preset",
]

Transform = Callable[[torch.Tensor], torch.Tensor]
PresetName = Literal["train", "resnet", "eval"]
PRESETS: tuple[str, ...] = get_args(PresetName)

# torchvision's rgb_to_grayscale weights (ITU-R 601-2 luma).
_GRAY = np.array([0.2989, 0.587, 0.114])
# AlexNet's PCA of ImageNet RGB pixels (values in [0, 1]), as used by fb.resnet.torch's Lighting.
_PCA_EIGVAL = np.array([0.2175, 0.0188, 0.0045])
_PCA_EIGVEC = np.array([[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]])


def preset(name: str, *, size: int = 224) -> Transform:
    """Return the preset transform ``name`` (one of :data:`PRESETS`) producing ``size`` x ``size`` images.

    Raises:
        ConfigError: ``name`` is not a preset, or ``size`` is not positive.

    """
    if name not in PRESETS:
        raise ConfigError(f"unknown transform preset {name!r}; expected one of {list(PRESETS)} or a callable")
    if size < 1:
        raise ConfigError(f"preset size must be a positive number of pixels, got {size}")
    if name == "train":
        return RandomResizedCropFlip(size)
    if name == "resnet":
        return ScaleCropFlipColor(size)
    return ResizeCenterCrop(size)


def _resize_region(
    img: torch.Tensor, top: int, left: int, height: int, width: int, size: int
) -> torch.Tensor:
    """Resize ``img[:, top:top+height, left:left+width]`` to ``size`` x ``size`` (bilinear, antialias)."""
    region = img[None, :, top : top + height, left : left + width]
    # The uint8 bilinear kernel is fastest on channels-last; this copy of the region pays for itself.
    region = region.contiguous(memory_format=torch.channels_last)
    on_cpu = region.device.type == "cpu"
    # CUDA has no uint8 antialiased kernel: there the resize runs in float and rounds back, as
    # torchvision's does.
    out = interpolate(
        region if on_cpu else region.float(),
        size=(size, size),
        mode="bilinear",
        antialias=True,
        align_corners=False,
    )
    return out[0] if on_cpu else out.round_().clamp_(0, 255).to(torch.uint8)[0]


def _flip(img: torch.Tensor, draw: float) -> torch.Tensor:
    return img.flip(-1) if draw < 0.5 else img


class RandomResizedCropFlip:
    """``RandomResizedCrop(size, scale, ratio)`` then ``RandomHorizontalFlip()``, torchvision's algorithm."""

    def __init__(
        self,
        size: int = 224,
        *,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
    ) -> None:
        self.size, self.scale, self.ratio = size, scale, ratio

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, scale={self.scale}, ratio={self.ratio})"

    def crop_box(self, height: int, width: int, draws: list[float]) -> tuple[int, int, int, int]:
        """Return ``(top, left, h, w)`` from 22 uniform draws, as ``v2.RandomResizedCrop`` picks it."""
        area = height * width
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for k in range(10):
            target = area * (self.scale[0] + draws[2 * k] * (self.scale[1] - self.scale[0]))
            aspect = math.exp(log_lo + draws[2 * k + 1] * (log_hi - log_lo))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                return int(draws[20] * (height - h + 1)), int(draws[21] * (width - w + 1)), h, w
        # Fallback to a central crop, clamped to the ratio range.
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w, h = width, round(width / min(self.ratio))
        elif in_ratio > max(self.ratio):
            w, h = round(height * max(self.ratio)), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        """Return a random crop of ``img`` resized to ``size`` x ``size``, flipped half the time."""
        draws = torch.rand(23).tolist()
        top, left, h, w = self.crop_box(img.shape[-2], img.shape[-1], draws)
        return _flip(_resize_region(img, top, left, h, w, self.size), draws[22])


class ScaleCropFlipColor:
    """The ResNet recipe: shorter side uniform in ``[256, 480]``, random crop, flip, colour, lighting."""

    def __init__(
        self,
        size: int = 224,
        *,
        shorter: tuple[int, int] = (256, 480),
        jitter: float = 0.4,
        lighting: float = 0.1,
    ) -> None:
        self.size, self.jitter, self.lighting = size, jitter, lighting
        self.shorter = (round(shorter[0] * size / 224), round(shorter[1] * size / 224))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, shorter={self.shorter}, jitter={self.jitter}, "
            f"lighting={self.lighting})"
        )

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        """Return a random ``size`` x ``size`` view of ``img`` at a random scale, flipped and recoloured."""
        height, width = img.shape[-2:]
        draws = torch.rand(10).tolist()
        target = self.shorter[0] + int(draws[0] * (self.shorter[1] - self.shorter[0] + 1))
        # The size x size crop of the image resized to shorter side `target`, in source pixels.
        side = min(max(round(min(height, width) * self.size / target), 1), height, width)
        top, left = int(draws[1] * (height - side + 1)), int(draws[2] * (width - side + 1))
        out = _resize_region(img, top, left, side, side, self.size)
        out = self._color(out, draws[4:10])
        return _flip(out, draws[3])

    def _color(self, img: torch.Tensor, draws: list[float]) -> torch.Tensor:
        factors = [1 + self.jitter * (2 * d - 1) for d in draws[:3]]  # brightness, contrast, saturation
        order = sorted(range(3), key=lambda i: draws[3 + i])  # a random permutation of the three steps
        # y = A x + t, built step by step (3x3 numpy math on the CPU: torch's per-op overhead would
        # cost more than the pixels): brightness scales; contrast blends with the mean gray level;
        # saturation blends each pixel with its gray level.
        mean = img[:, ::2, ::2].float().mean(dim=(1, 2))
        lighting = torch.randn(3).numpy() * self.lighting if self.lighting else None
        if img.device.type != "cpu":
            # On a GPU the mean stays there: the matrix is built on the device, no copy, no sync.
            weight, bias = _color_matrix_on_device(mean, factors, order, lighting)
        else:
            weight, bias = _color_matrix(mean.numpy().astype(np.float64), factors, order, lighting)
        out = conv2d(img[None].float(), weight, bias)
        return out.clamp_(0, 255).to(torch.uint8)[0]


def _color_matrix(
    mean: np.ndarray, factors: list[float], order: list[int], lighting: np.ndarray | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The jitter steps in ``order`` (and lighting) as one conv weight ``[3, 3, 1, 1]`` and bias."""
    a, t = np.eye(3), np.zeros(3)
    for step in order:
        f = factors[step]
        if step == 0:
            a, t = f * a, f * t
        elif step == 1:
            gray_mean = float(_GRAY @ (a @ mean + t))
            a, t = f * a, f * t + (1 - f) * gray_mean
        else:
            s = f * np.eye(3) + (1 - f) * np.outer(np.ones(3), _GRAY)
            a, t = s @ a, s @ t
    if lighting is not None:
        t = t + 255 * (_PCA_EIGVEC @ (lighting * _PCA_EIGVAL))
    return torch.from_numpy(a.astype(np.float32)[:, :, None, None]), torch.from_numpy(t.astype(np.float32))


def _color_matrix_on_device(
    mean: torch.Tensor, factors: list[float], order: list[int], lighting: np.ndarray | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_color_matrix` with the image mean on its device: same steps, device tensors throughout.

    Every per-image number enters as a Python scalar (a kernel argument), never as a tensor copied
    from the host, which would wait for the device.
    """
    gray, eye, gray_rows, pca = _device_constants(mean.device)
    a, t = eye.clone(), torch.zeros(3, dtype=torch.float64, device=mean.device)
    mean = mean.double()
    for step in order:
        f = factors[step]
        if step == 0:
            a, t = f * a, f * t
        elif step == 1:
            gray_mean = gray @ (a @ mean + t)
            a, t = f * a, f * t + (1 - f) * gray_mean
        else:
            s = f * eye + (1 - f) * gray_rows
            a, t = s @ a, s @ t
    if lighting is not None:
        coef = (255 * lighting * _PCA_EIGVAL).tolist()
        t = t + pca[:, 0] * coef[0] + pca[:, 1] * coef[1] + pca[:, 2] * coef[2]
    return a.float()[:, :, None, None], t.float()


_CONSTANTS: dict[torch.device, tuple[torch.Tensor, ...]] = {}


def _device_constants(device: torch.device) -> tuple[torch.Tensor, ...]:
    """The gray weights, the identity, the gray-projection rows and the PCA vectors, on ``device``."""
    if device not in _CONSTANTS:
        host = (_GRAY, np.eye(3), np.outer(np.ones(3), _GRAY), _PCA_EIGVEC)
        _CONSTANTS[device] = tuple(torch.from_numpy(c).to(device) for c in host)
    return _CONSTANTS[device]


class ResizeCenterCrop:
    """Resize the shorter side to ``round(size * 256 / 224)``, centre crop ``size``: torchvision's eval."""

    def __init__(self, size: int = 224) -> None:
        self.size = size
        self.resize = round(size * 256 / 224)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={self.size}, resize={self.resize})"

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        """Return the centre ``size`` x ``size`` crop of ``img`` resized."""
        # The whole image is resized, as torchvision does: a resize of only the centre region would
        # shift the sampling grid by a fraction of a pixel, and eval numbers should match torchvision's.
        return F.center_crop(F.resize(img, [self.resize], antialias=True), [self.size, self.size])
