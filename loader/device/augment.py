"""The presets applied to many images at once: crop, resize, colour and flip in a few launches.

The per-image presets (:mod:`..image.presets`) launch about ten kernels an image; at 256 images a
batch that is thousands of launches, more than a GPU step can hide. Here the random parameters come
from the host (:meth:`~..image.presets.Preset.draw`, the preset's one definition of its draws: one
:class:`~..image.presets.View` an image, drawn in sample order with the workers' generator), and the
pixels go through one pass per group of images, doing what each view says:

1. **Canvas**: the decoded images are copied (one copy an image, which also converts to float)
   into one float canvas, stacked vertically, each with a one-pixel border that repeats its edge,
   so sampling just outside an image reads its edge, as a per-image resize does.
2. **Crop and resize**: :func:`torchvision.ops.roi_align` (``aligned=True``) samples each image's
   box to ``size x size`` with its own scale. Upscaling is bilinear at the pixel centres, exactly
   ``interpolate(mode="bilinear", align_corners=False)``; downscaling averages
   ``ceil(box / size)`` squared bilinear samples per output pixel (a box filter), where
   ``interpolate(antialias=True)`` weighs a triangle twice as wide. A padded batch through one
   ``interpolate`` would apply one scale to all.
3. **Colour** (views that have it, ``"resnet"``'s): each image's jitter and lighting is one 3x3
   matrix and offset (:func:`~..image.presets.color_terms`); all of it is known on the host but the
   contrast step's mean gray level, which is computed on the device and enters as one scalar per
   image. One batched matrix product applies them.
4. **Flip** by a mask, and back to ``uint8`` (rounded after the resize, truncated after the colour,
   as the per-image presets do).

Against the per-image presets on the CPU (``tests/loader/device/test_augment.py``), for the same views:
the mean absolute difference is under 2 levels of 255 and 99% of the values are within 8 levels
(the filter differs where the image is sharp; crop boxes, flips and colour are the same).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torchvision.ops import roi_align

from ..image.presets import Preset, View, color_terms

__all__ = ["augment_batch", "augment_groups", "by_width", "canvas_bytes"]


def canvas_bytes(shapes: Sequence[tuple[int, int]]) -> int:
    """Bytes of the float canvas that holds images of ``shapes`` (``(height, width)`` each)."""
    if not shapes:
        return 0
    width = max(w for _, w in shapes) + 2
    return 4 * 3 * width * sum(h + 2 for h, _ in shapes)


def by_width(shapes: Sequence[tuple[int, int]], limit: int) -> list[list[int]]:
    """Indices of ``shapes`` in groups whose canvas fits in ``limit`` bytes, images of like width together.

    Sorting by width keeps a canvas (as wide as its widest image) from holding mostly padding. A
    single image larger than ``limit`` makes a group of its own.
    """
    order = sorted(range(len(shapes)), key=lambda i: shapes[i][1])
    groups: list[list[int]] = []
    members: list[tuple[int, int]] = []
    for i in order:
        if not groups or canvas_bytes([*members, shapes[i]]) > limit:
            groups.append([])
            members = []
        groups[-1].append(i)
        members.append(shapes[i])
    return [sorted(g) for g in groups]


def augment_groups(
    images: Sequence[torch.Tensor], views: Sequence[View], preset: Preset, groups: Sequence[Sequence[int]]
) -> torch.Tensor:
    """:func:`augment_batch` group by group (:func:`by_width`), the results in the images' order."""
    parts = [augment_batch([images[i] for i in g], [views[i] for i in g], preset) for g in groups]
    if len(parts) == 1:
        return parts[0]
    order = torch.tensor([i for g in groups for i in g], device="cpu")
    inverse = torch.argsort(order).to(parts[0].device, non_blocking=True)
    return torch.cat(parts)[inverse]


def augment_batch(images: Sequence[torch.Tensor], views: Sequence[View], preset: Preset) -> torch.Tensor:
    """Apply ``views`` (one per image, from ``preset.draw``) to RGB ``uint8 [3, H, W]`` images at once.

    Each view's box is resized to the preset's ``size``, recoloured if the view has colour, flipped
    if it says so: what :meth:`~..image.presets.Preset.apply` does to one image.

    Returns:
        ``uint8 [len(images), 3, size, size]`` on the images' device.

    """
    if not images:
        raise ValueError("augment_batch needs at least one image")
    device = images[0].device
    canvas, boxes = _canvas(images, views)
    size = preset.size
    out: torch.Tensor = roi_align(
        canvas, boxes, output_size=(size, size), spatial_scale=1.0, sampling_ratio=-1, aligned=True
    )
    out = out.round_().clamp_(0, 255)  # the per-image resize's uint8 output
    if any(v.factors is not None for v in views):
        out = _recolor(out, views)
    flips = [v.flip for v in views]
    if any(flips):
        mask = torch.tensor(flips, device="cpu").to(device, non_blocking=True).view(-1, 1, 1, 1)
        out = torch.where(mask, out.flip(-1), out)
    return out.to(torch.uint8)


def _canvas(images: Sequence[torch.Tensor], views: Sequence[View]) -> tuple[torch.Tensor, torch.Tensor]:
    """The images stacked in one float canvas with replicated one-pixel borders, and each view's box.

    Image ``i`` fills rows ``top_i + 1 .. top_i + H_i`` and columns ``1 .. W_i``; rows ``top_i`` and
    ``top_i + H_i + 1`` and columns ``0`` and ``W_i + 1`` repeat its edges.
    """
    device = images[0].device
    heights = np.array([int(img.shape[-2]) for img in images])
    widths = np.array([int(img.shape[-1]) for img in images])
    tops = np.concatenate([[0], np.cumsum(heights + 2)[:-1]])
    rows, cols = int((heights + 2).sum()), int(widths.max()) + 2
    # Zeros, not empty: a sample on a pixel's far edge reads the next one with weight 0, and 0 times
    # an uninitialized NaN would be NaN.
    canvas = torch.zeros((1, 3, rows, cols), dtype=torch.float32, device=device)
    plane = canvas[0]
    for img, top, h, w in zip(images, tops, heights, widths, strict=True):
        plane[:, top + 1 : top + 1 + h, 1 : 1 + w].copy_(img)
    # Border columns: the left one for every row at once, the right one at each row's own width.
    owner = np.repeat(np.arange(len(images)), heights + 2)
    right = torch.from_numpy(widths[owner] + 1).to(device, non_blocking=True)
    every = torch.arange(rows, device=device)
    plane[:, :, 0] = plane[:, :, 1]
    plane[:, every, right] = plane[:, every, right - 1]
    # Border rows, after the columns so that the corners repeat the corner pixels.
    first = torch.from_numpy(tops).to(device, non_blocking=True)
    last = torch.from_numpy(tops + heights + 1).to(device, non_blocking=True)
    plane[:, first] = plane[:, first + 1]
    plane[:, last] = plane[:, last - 1]
    box = np.array(
        [
            [0, 1 + v.left, t + 1 + v.top, 1 + v.left + v.width, t + 1 + v.top + v.height]
            for v, t in zip(views, tops, strict=True)
        ],
        dtype=np.float32,
    )
    return canvas, torch.from_numpy(box).to(device, non_blocking=True)


def _recolor(x: torch.Tensor, views: Sequence[View]) -> torch.Tensor:
    """Jitter and lighting of each image, as :meth:`~..image.presets.Preset.apply` computes them.

    ``y = A x + u (w . mean) + l``, with ``A, u, w, l`` drawn up on the host
    (:func:`~..image.presets.color_terms`) and the mean of each image computed here.
    """
    host = np.stack([color_terms(v) for v in views])  # [k, 18]: A (9), u (3), w (3), l (3)
    terms = torch.from_numpy(host).to(x.device, non_blocking=True)
    a, u, w, light = terms[:, :9].view(-1, 3, 3), terms[:, 9:12], terms[:, 12:15], terms[:, 15:18]
    mean = x[:, :, ::2, ::2].mean(dim=(2, 3)).double()  # of the uint8 resize output, as the preset
    t = u * (w * mean).sum(dim=1, keepdim=True) + light
    k, _, h, width = x.shape
    y = torch.baddbmm(t.float()[:, :, None], a.float(), x.reshape(k, 3, h * width))
    return y.view(k, 3, h, width).clamp_(0, 255).trunc_()
