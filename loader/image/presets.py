"""Augmentation presets on RGB ``uint8 [3, H, W]`` tensors, made for speed in DataLoader workers.

- ``"train"``: torchvision's reference recipe, ``RandomResizedCrop(224)`` + ``RandomHorizontalFlip()``.
- ``"resnet"``: the scale augmentation of He et al. (2015): shorter side uniform in ``[256, 480]``, a
  random ``224`` crop, a flip, then colour: ``ColorJitter(0.4, 0.4, 0.4)`` and AlexNet's PCA
  lighting (std 0.1), as in ``fb.resnet.torch``.
- ``"eval"``: resize the shorter side to ``256``, centre crop ``224``. An image more than
  ``max_aspect`` (100) times longer than wide, or wider than long, is refused with
  :class:`~..errors.ImageShapeError` (its whole-image resize would be unbounded: a 65500x1 image
  asks for 16,768,000x256 pixels, 12.9 GB).

``size`` scales every number (``256`` is ``round(size * 256 / 224)``). Every preset returns a
``uint8`` tensor with channels-last strides; no float image leaves a preset.

How they are fast, and where they differ from a ``torchvision.transforms.v2.Compose`` of the same
steps (which they were checked against):

- Crop before resize: the crop is drawn in source coordinates and only that region is resized
  (``RandomResizedCrop`` works so; ``"resnet"`` draws its crop side as ``shorter * 224 / S`` source
  pixels instead of resizing the whole image to ``S`` first: same distribution of views, up to
  rounding of the crop box to whole source pixels).
- The region (``"eval"``: the whole image) is resized by ``torch.nn.functional.interpolate``
  (bilinear, antialias) on ``uint8`` in channels-last layout: the kernel
  ``torchvision.transforms.v2.functional.resize`` calls, without its per-call overhead (~15% of a
  resize at this size; 7% of ``"eval"``'s resize and crop). On a GPU (no ``uint8`` kernel there)
  it runs in ``float32`` on planar memory, the layout the CUDA kernel reads fastest.
- Colour jitter and lighting are affine in RGB, so the three jitter steps (in random order, as
  torchvision's) and the lighting offset are composed into one 3x3 matrix and offset, applied in a
  single pass and clamped once at the end (``fb.resnet.torch`` does not clamp between steps either;
  torchvision does): about 4x faster than ``v2.ColorJitter`` on ``uint8``.

Randomness comes from torch's default CPU generator, which :class:`~imgshards.loader.ShardDataset`
seeds for every batch from ``(seed, epoch, rank, worker, batch)``, so the same view of an image comes
back on a rerun and after a mid-epoch resume. Every draw names the CPU (``device="cpu"``): after
``torch.set_default_device("cuda")`` the draws still come from that seeded CPU generator, not from an
unseeded CUDA one.

Each preset is defined once, as a :class:`Preset`: its parameters and its :meth:`~Preset.draw`,
the one place its random parameters (crop box, flip, colour: a :class:`View`) are drawn, from the
image's size alone, in a fixed order. Every path applies that view and draws nothing:
:meth:`~Preset.apply` (the full-resolution image; ``preset(img)`` is ``apply(img, draw(h, w))``),
:meth:`~Preset.apply_reduced` (the image decoded smaller, :mod:`.scaled`) and
:func:`~..device.augment.augment_batch` (a batch at once on a GPU, its views drawn on the host in
sample order with the workers' generator). What a view does is read from it, not from the preset's
class: its box is resized, recoloured if it has colour (:func:`color_terms` and the matrices here:
the colour steps' one definition), flipped if it says so.

A view also says how small the image may be decoded (:func:`reduction`): a 12 MP photo's view
needs a quarter of its resolution or less. :meth:`apply_reduced` applies a view drawn from the
full size to the image decoded at 1/2, 1/4 or 1/8 (:class:`~.decode.Reduced`), its box scaled
exactly: Pillow's resize takes a fractional box, and its bilinear antialiased kernel is the one
torch's ``uint8`` kernel was ported from. :mod:`.scaled` decides when; an image no view of which
can be reduced (:attr:`Preset.reducible_from`) never reaches it.
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Literal, NamedTuple, TypeVar, get_args

import numpy as np
import torch
from PIL import Image
from torch.nn.functional import conv2d, interpolate

from ..errors import ConfigError, ImageShapeError
from .decode import Reduced

__all__ = [
    "GRAY",
    "PCA_EIGVAL",
    "PCA_EIGVEC",
    "PRESETS",
    "Preset",
    "PresetName",
    "RandomResizedCropFlip",
    "ResizeCenterCrop",
    "ScaleCropFlipColor",
    "Transform",
    "View",
    "color_terms",
    "preset",
    "reduction",
]

Transform = Callable[[torch.Tensor], torch.Tensor]
PresetName = Literal["train", "resnet", "eval"]
PRESETS: tuple[str, ...] = get_args(PresetName)

# torchvision's rgb_to_grayscale weights (ITU-R 601-2 luma).
GRAY = np.array([0.2989, 0.587, 0.114])
# AlexNet's PCA of ImageNet RGB pixels (values in [0, 1]), as used by fb.resnet.torch's Lighting.
PCA_EIGVAL = np.array([0.2175, 0.0188, 0.0045])
PCA_EIGVEC = np.array([[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]])
# Saturation's blend target: each pixel's gray level in every channel, (GRAY @ x) * ones.
_GRAY_ROWS = np.outer(np.ones(3), GRAY)


class View(NamedTuple):
    """The random parameters a preset drew for one image: what :meth:`apply` does to it.

    Attributes:
        top: First source row of the region resized to the output.
        left: First source column of that region.
        height: Its rows, in source pixels.
        width: Its columns, in source pixels.
        flip: Mirror the output left to right.
        factors: Brightness, contrast and saturation factors (``"resnet"``), else ``None``.
        order: The order of those three steps, a permutation of ``(0, 1, 2)``, else ``None``.
        lighting: AlexNet's PCA lighting coefficients (``"resnet"``), else ``None``.

    """

    top: float
    left: float
    height: float
    width: float
    flip: bool = False
    factors: tuple[float, float, float] | None = None
    order: tuple[int, int, int] | None = None
    lighting: tuple[float, float, float] | None = None


def _uniform(n: int, generator: torch.Generator | None) -> list[float]:
    """``n`` uniform draws from ``generator`` (default: torch's default CPU generator), on the CPU."""
    return torch.rand(n, generator=generator, device="cpu").tolist()


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


class Preset(ABC):
    """One preset defined once: its parameters and :meth:`draw`, the one place its views are drawn.

    The paths that apply a drawn :class:`View` are here once for every preset: :meth:`apply`,
    :meth:`apply_reduced`, and :func:`~..device.augment.augment_batch` for a batch (it reads
    :attr:`size` and the views). A subclass gives its parameters, :meth:`draw`, and
    :attr:`reducible_from` (which :mod:`.scaled` asks); ``"eval"`` also its full-resolution resize.

    Attributes:
        size: The side of the square ``uint8`` output.
        reducible_from: The shorter side below which no view of an image can be decoded at half
            its resolution (:func:`reduction`: that takes a view of ``2 * size`` source pixels),
            what :mod:`.scaled` asks before it reads more than a JPEG's header.

    """

    size: int
    reducible_from: int

    @abstractmethod
    def draw(self, height: int, width: int, generator: torch.Generator | None = None) -> View:
        """The random parameters of the view of an image of ``height`` x ``width``, from ``generator``.

        Draws from ``generator`` (default: torch's default CPU generator) in a fixed order, so the
        same generator state gives the same view on every path.
        """

    def apply(self, img: torch.Tensor, view: View) -> torch.Tensor:
        """Resize ``view``'s box of ``img`` to ``size`` x ``size``, recolour and flip it as ``view`` says."""
        return _finish(self._resize_view(img, view), view)

    def apply_reduced(self, reduced: Reduced, view: View) -> torch.Tensor:
        """:meth:`apply` on the image decoded smaller, ``view`` drawn from its full size."""
        return _finish(_resize_reduced(reduced, view, self.size, self.size), view)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        """Return a random ``size`` x ``size`` view of ``img``: ``apply(img, draw(h, w))``."""
        return self.apply(img, self.draw(img.shape[-2], img.shape[-1]))

    def _resize_view(self, img: torch.Tensor, view: View) -> torch.Tensor:
        """``view``'s box of ``img`` (whole source pixels) resized to ``size`` x ``size``."""
        return _resize_region(
            img, int(view.top), int(view.left), int(view.height), int(view.width), self.size
        )


class RandomResizedCropFlip(Preset):
    """``RandomResizedCrop(size, scale, ratio)`` then ``RandomHorizontalFlip()``, torchvision's algorithm."""

    def __init__(
        self,
        size: int = 224,
        *,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
    ) -> None:
        self.size, self.scale, self.ratio = size, scale, ratio
        self.reducible_from = 2 * size  # the shorter side of an image some view could be halved on

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

    def draw(self, height: int, width: int, generator: torch.Generator | None = None) -> View:
        """The crop box and flip of an image of ``height`` x ``width`` (23 draws from ``generator``)."""
        draws = _uniform(23, generator)
        top, left, h, w = self.crop_box(height, width, draws)
        return View(top, left, h, w, flip=draws[22] < 0.5)


class ScaleCropFlipColor(Preset):
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
        # A view spans at most shorter * size / shorter[0] source pixels: halved, at least size.
        self.reducible_from = 2 * self.shorter[0]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(size={self.size}, shorter={self.shorter}, jitter={self.jitter}, "
            f"lighting={self.lighting})"
        )

    def draw(self, height: int, width: int, generator: torch.Generator | None = None) -> View:
        """The scale, crop, flip and colour of an image of ``height`` x ``width``.

        10 uniform draws, then 3 normal ones for the lighting (none without lighting), from
        ``generator``: the order in which the per-image preset has always drawn them.
        """
        draws = _uniform(10, generator)
        target = self.shorter[0] + int(draws[0] * (self.shorter[1] - self.shorter[0] + 1))
        # The size x size crop of the image resized to shorter side `target`, in source pixels.
        side = min(max(round(min(height, width) * self.size / target), 1), height, width)
        top, left = int(draws[1] * (height - side + 1)), int(draws[2] * (width - side + 1))
        factors, order = self._jitter(draws[4:10])
        lighting = None
        if self.lighting:
            lighting = tuple(
                (torch.randn(3, generator=generator, device="cpu").numpy() * self.lighting).tolist()
            )
        return View(top, left, side, side, draws[3] < 0.5, factors, order, lighting)  # type: ignore[arg-type]

    def _jitter(self, draws: Sequence[float]) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """The jitter's factors (brightness, contrast, saturation) and its steps' order, from 6 draws."""
        factors = tuple(1 + self.jitter * (2 * d - 1) for d in draws[:3])
        order = tuple(sorted(range(3), key=lambda i: draws[3 + i]))
        return factors, order

    def _color(
        self, img: torch.Tensor, draws: list[float], lighting: np.ndarray | None = None
    ) -> torch.Tensor:
        """Recolour ``img`` with the jitter given by 6 uniform draws (factors, then the order's keys)."""
        factors, order = self._jitter(draws)
        return _recolor(img, list(factors), list(order), lighting)


class ResizeCenterCrop(Preset):
    """Resize the shorter side to ``round(size * 256 / 224)``, centre crop ``size``: torchvision's eval.

    The whole image is resized, so the work grows with its aspect ratio: one more than
    ``max_aspect`` to 1 (either way) is refused with :class:`~..errors.ImageShapeError`, which bounds
    the resized image to ``max_aspect * resize**2`` pixels (19.7 MB at the defaults).
    """

    def __init__(self, size: int = 224, *, max_aspect: float = 100.0) -> None:
        if not max_aspect >= 1:
            raise ConfigError(f"max_aspect is the longer side over the shorter, at least 1; got {max_aspect}")
        self.size, self.max_aspect = size, max_aspect
        self.resize = round(size * 256 / 224)
        self.reducible_from = 2 * self.resize  # a view spans shorter * size / resize source pixels

    def __repr__(self) -> str:
        name, aspect = type(self).__name__, self.max_aspect
        return f"{name}(size={self.size}, resize={self.resize}, max_aspect={aspect:g})"

    def check(self, height: int, width: int) -> None:
        """Refuse an image whose whole-image resize would be unbounded: more than ``max_aspect`` to 1.

        Raises:
            ImageShapeError: naming the size, the resize it would take and the limit.

        """
        longer, shorter = max(height, width), min(height, width)
        if shorter >= 1 and longer <= self.max_aspect * shorter:
            return
        if shorter < 1:
            raise ImageShapeError(f"a {width}x{height} image is empty: there is nothing to resize")
        stretched = int(self.resize * longer / shorter)
        new_w, new_h = (stretched, self.resize) if width > height else (self.resize, stretched)
        raise ImageShapeError(
            f"a {width}x{height} image would be resized to {new_w:,}x{new_h:,} = {new_w * new_h:,} pixels "
            f"before its centre crop: its aspect ratio {longer / shorter:,.0f}:1 is more than the eval "
            f"preset's limit of {self.max_aspect:g}:1"
        )

    def draw(self, height: int, width: int, generator: torch.Generator | None = None) -> View:
        """The source region the centre crop of the resized image shows (no draws: ``generator`` unused).

        Sizes and offsets as ``torchvision.transforms.v2.functional`` computes them (``resize``'s
        shorter-side rule, ``center_crop``'s rounding), mapped back to source pixels.

        Raises:
            ImageShapeError: the image is refused by :meth:`check`, as the preset itself refuses it.

        """
        self.check(height, width)
        new_h, new_w, top, left = self._resized(height, width)
        sy, sx = height / new_h, width / new_w
        return View(top * sy, left * sx, self.size * sy, self.size * sx)

    def _resized(self, height: int, width: int) -> tuple[int, int, int, int]:
        """An image's size once resized, and where its centre crop starts in it: ``(h, w, top, left)``.

        The size by ``v2.functional.resize``'s shorter-side rule, the offsets by ``center_crop``'s rounding.
        """
        if width <= height:
            new_h, new_w = int(self.resize * height / width), self.resize
        else:
            new_h, new_w = self.resize, int(self.resize * width / height)
        return new_h, new_w, round((new_h - self.size) / 2.0), round((new_w - self.size) / 2.0)

    def _resize_view(self, img: torch.Tensor, view: View) -> torch.Tensor:
        """Resize the whole of ``img`` and take its centre crop (``view`` is implied by its size).

        Raises:
            ImageShapeError: ``img`` is more than ``max_aspect`` to 1 (:meth:`check`), before any resize.

        """
        height, width = img.shape[-2], img.shape[-1]
        self.check(height, width)
        # The whole image is resized, as torchvision does: a resize of only the centre region would
        # shift the sampling grid by a fraction of a pixel, and eval numbers should match torchvision's.
        # Its kernel, called as v2.functional.resize calls it, and center_crop's offsets, pixel for
        # pixel (tests/loader/image/test_presets.py), without their wrappers: 27 us an image less (7%).
        # The reduced path needs no whole-image resize: Pillow clips a box's filter at the image's
        # edges, not the box's, so the view's box of it is the same sampling grid.
        new_h, new_w, top, left = self._resized(height, width)
        out = img if (new_h, new_w) == (height, width) else _resize(img, new_h, new_w)
        return out[:, top : top + self.size, left : left + self.size]


# ---- applying a view: the resizes, then the colour ----------------------------------------


def reduction(view: View, size: int) -> int:
    """How much smaller than its full size an image may be decoded for ``view``: 8, 4, 2, or 1 (not).

    The largest of 1/8, 1/4, 1/2 (libjpeg's DCT scales) at which the view's box still spans at least
    the ``size`` output pixels in both axes: the resize to ``size`` then still shrinks, or keeps, it.
    """
    for scale in (8, 4, 2):
        if view.height >= size * scale and view.width >= size * scale:
            return scale
    return 1


def _resize_region(
    img: torch.Tensor, top: int, left: int, height: int, width: int, size: int
) -> torch.Tensor:
    """Resize ``img[:, top:top+height, left:left+width]`` to ``size`` x ``size`` (bilinear, antialias)."""
    return _resize(img[:, top : top + height, left : left + width], size, size)


def _resize_reduced(reduced: Reduced, view: View, height: int, width: int) -> torch.Tensor:
    """Resize ``view``'s box, in full-image pixels, of the ``reduced`` image to ``height`` x ``width``.

    Pillow's bilinear antialiased resize, whose ``box`` may be fractional: the box is the view's,
    scaled exactly, not rounded to the reduced image's pixels. Returns channels-last strides, as
    every preset does.
    """
    box = reduced.box(view.top, view.left, view.height, view.width)
    out = reduced.image.resize((width, height), Image.Resampling.BILINEAR, box=box)
    return torch.from_numpy(np.array(out)).permute(2, 0, 1)


def _resize(img: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Resize ``img`` to ``height`` x ``width``, bilinear and antialiased (torchvision's kernel)."""
    # A batch of one with a batch stride that fits the region: a region as wide as the image, put
    # under img[None], has a batch stride of 1 or 3 that makes torch read a channels-last region as
    # planar and resize it by its planar kernel (2.3x slower) into a planar result.
    region = img.permute(1, 2, 0)[None].permute(0, 3, 1, 2)
    interp = functools.partial(
        interpolate, size=(height, width), mode="bilinear", antialias=True, align_corners=False
    )
    if region.device.type == "cpu":
        # The uint8 bilinear kernel is fastest on channels-last; this copy of the region pays for itself.
        return interp(region.contiguous(memory_format=torch.channels_last))[0]
    # CUDA has no uint8 antialiased kernel: there the resize runs in float and rounds back, as
    # torchvision's does. Its antialiased kernel reads planar (NCHW) memory: given channels-last it
    # is slower, so the one copy the float conversion makes anyway is planar.
    out = interp(region.to(torch.float32, memory_format=torch.contiguous_format))
    return out.round_().clamp_(0, 255).to(torch.uint8)[0]


def _finish(out: torch.Tensor, view: View) -> torch.Tensor:
    """Recolour the resized view ``out`` if ``view`` has colour, and flip it if it says so."""
    if view.factors is not None:
        assert view.order is not None
        lighting = np.array(view.lighting, dtype=np.float32) if view.lighting is not None else None
        out = _recolor(out, list(view.factors), list(view.order), lighting)
    return out.flip(-1) if view.flip else out


def _recolor(
    img: torch.Tensor, factors: list[float], order: list[int], lighting: np.ndarray | None
) -> torch.Tensor:
    """The jitter steps in ``order`` and the ``lighting`` offset applied to ``img`` in one pass, clamped."""
    # y = A x + t, built by _jitter_steps (3x3 numpy math on the CPU: torch's per-op overhead would
    # cost more than the pixels), then applied to the pixels in one pass.
    mean = img[:, ::2, ::2].float().mean(dim=(1, 2))
    if img.device.type != "cpu":
        # On a GPU the mean stays there: the matrix is built on the device, no copy, no sync.
        weight, bias = _color_matrix_on_device(mean, factors, order, lighting)
        out = conv2d(img[None].float(), weight, bias)
        return out.clamp_(0, 255).to(torch.uint8)[0]
    weight, bias = _color_matrix(mean.numpy().astype(np.float64), factors, order, lighting)
    return _conv_channels_last(img, weight, bias)


def _conv_channels_last(img: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``conv2d(img[None].float(), weight, bias)`` clamped to ``uint8``, on the CPU, in and out channels-last.

    The same sums as that one line (on one thread, as in a worker, torch's 1x1 convolution reads
    planar memory: given channels-last it makes a planar copy first; on two threads the result is
    the same too, checked on 100 of the bench tree's images), but numpy moves the pixels between
    the layouts, in ``uint8``, and casts them: about twice as fast as torch's copies across layouts
    and its ``float`` to ``uint8`` cast. The result keeps the channels-last strides every preset
    returns, so the batch takes it row for row (a planar result made the worker transpose it,
    ~140 us an image).
    """
    planar = torch.from_numpy(np.ascontiguousarray(img.numpy()).astype(np.float32))  # [3, H, W]
    out = conv2d(planar[None], weight, bias)[0].clamp_(0, 255).numpy().astype(np.uint8)
    channels, height, width = out.shape
    hwc = np.empty((height, width, channels), dtype=np.uint8)
    for c in range(channels):
        hwc[:, :, c] = out[c]
    return torch.from_numpy(hwc).permute(2, 0, 1)


Matrix = TypeVar("Matrix", np.ndarray, torch.Tensor)


def _jitter_steps(
    a: Matrix,
    t: Matrix,
    mean: Matrix,
    factors: Sequence[float],
    order: Sequence[int],
    gray: Matrix,
    eye: Matrix,
    gray_rows: Matrix,
) -> tuple[Matrix, Matrix]:
    """The jitter steps in ``order`` applied to ``y = a x + t``: numpy on the host, tensors on a device.

    Brightness scales; contrast blends with the mean gray level (of ``a mean + t``); saturation
    blends each pixel with its gray level (``gray_rows``: every row the ``gray`` weights).
    """
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
    return a, t


def _color_matrix(
    mean: np.ndarray, factors: list[float], order: list[int], lighting: np.ndarray | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The jitter steps in ``order`` (and lighting) as one conv weight ``[3, 3, 1, 1]`` and bias."""
    a, t = _jitter_steps(np.eye(3), np.zeros(3), mean, factors, order, GRAY, np.eye(3), _GRAY_ROWS)
    if lighting is not None:
        t = t + 255 * (PCA_EIGVEC @ (lighting * PCA_EIGVAL))
    return torch.from_numpy(a.astype(np.float32)[:, :, None, None]), torch.from_numpy(t.astype(np.float32))


def _color_matrix_on_device(
    mean: torch.Tensor, factors: list[float], order: list[int], lighting: np.ndarray | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_color_matrix` with the image mean on its device: same steps, device tensors throughout.

    Every per-image number enters as a Python scalar (a kernel argument), never as a tensor copied
    from the host, which would wait for the device.
    """
    gray, eye, gray_rows, pca = _device_constants(mean.device)
    t = torch.zeros(3, dtype=torch.float64, device=mean.device)
    a, t = _jitter_steps(eye.clone(), t, mean.double(), factors, order, gray, eye, gray_rows)
    if lighting is not None:
        coef = (255 * lighting * PCA_EIGVAL).tolist()
        t = t + pca[:, 0] * coef[0] + pca[:, 1] * coef[1] + pca[:, 2] * coef[2]
    return a.float()[:, :, None, None], t.float()


def color_terms(view: View) -> np.ndarray:
    """The colour of ``view`` for a batch: ``A`` (row-major), ``u``, ``w`` and ``l``, 18 float64s.

    The steps :func:`_color_matrix` builds, for an image whose mean is not known on the host (the
    batched device path, :mod:`..device.augment`): of the matrix ``A`` and offset ``t`` built step by
    step, only the contrast step reads the image (its mean gray level ``g``): before it ``t`` is 0,
    so ``g = w . mean`` with ``w`` known here, and the steps after it carry ``(1 - f) g`` through as
    ``u g``. So ``y = A x + u (w . mean) + l``. A view without colour gives ``A = I`` and the rest 0.
    """
    a = np.eye(3)
    w = np.zeros(3)
    u = np.zeros(3)
    if view.factors is not None and view.order is not None:
        for step in view.order:
            f = view.factors[step]
            m = f * np.eye(3) if step != 2 else f * np.eye(3) + (1 - f) * _GRAY_ROWS
            if step == 1:
                w = GRAY @ a
                u = (1 - f) * np.ones(3)
            else:
                u = m @ u
            a = m @ a
    light = np.zeros(3)
    if view.lighting is not None:
        light = 255 * (PCA_EIGVEC @ (np.array(view.lighting, dtype=np.float32) * PCA_EIGVAL))
    return np.concatenate([a.ravel(), u, w, light])


_CONSTANTS: dict[torch.device, tuple[torch.Tensor, ...]] = {}


def _device_constants(device: torch.device) -> tuple[torch.Tensor, ...]:
    """The gray weights, the identity, the gray-projection rows and the PCA vectors, on ``device``."""
    if device not in _CONSTANTS:
        host = (GRAY, np.eye(3), _GRAY_ROWS, PCA_EIGVEC)
        _CONSTANTS[device] = tuple(torch.from_numpy(c).to(device) for c in host)
    return _CONSTANTS[device]
