"""Stacking a batch: images into one channels-last buffer (a worker's shared one), and ``to_device``.

The :class:`~..state.buffers.Batch` this makes, and the shared-memory buffers it is stacked into,
are :mod:`..state.buffers`'s: the training process hands them back to the workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data._utils.collate import default_collate_fn_map

from ..errors import BatchingError, ConfigError
from ..state.buffers import Batch, BufferPool, SentBatch, new_shared

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "BatchRows",
    "collate",
    "refuse_default_collate",
    "to_device",
]

# Per-channel statistics of ImageNet RGB pixels in [0, 1], torchvision's reference values.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def refuse_default_collate(*types: type) -> None:
    """Make ``default_collate`` refuse a list of ``types`` (whole batches) in one line naming the fix.

    ``DataLoader(dataset, batch_size=N)`` (or its default ``batch_size=1``) lists ``N`` of the
    dataset's batches and collates them; torch's own message names only a class of ours, from deep
    inside a worker's traceback. ``default_collate_fn_map`` is torch's table of what
    ``default_collate`` does with each type; only these types are added to it.
    """
    for t in types:
        default_collate_fn_map[t] = _refuse_collate


def _refuse_collate(batch: Sequence[Any], *, collate_fn_map: Any = None) -> Any:
    del collate_fn_map
    images = getattr(batch[0], "images", None)
    each = f" ({len(images)} images each here)" if isinstance(images, torch.Tensor) else ""
    raise BatchingError(
        f"DataLoader(batch_size=...) batches again the batches an imgshards dataset makes itself{each}; "
        "pass DataLoader(dataset, batch_size=None), or use make_loader(dataset, num_workers=...), and "
        "set the batch size on the dataset: ShardDataset(..., batch_size=N)"
    )


refuse_default_collate(Batch, SentBatch)


def collate(
    images: Sequence[torch.Tensor],
    labels: Sequence[int],
    *,
    pool: BufferPool | None = None,
    rows: BatchRows | None = None,
) -> Batch:
    """Stack ``uint8 [3, H, W]`` images into one channels-last batch, in ``pool``'s shared memory if given.

    Images of another dtype (a transform of the caller's that returns floats) are stacked as they are,
    in shared memory in a worker.

    In a DataLoader worker the batch goes straight into shared memory, so sending it to the main
    process copies nothing. Images that are the rows ``rows`` handed out, in order (the decode
    stage wrote each image there as it made it), are that batch as they stand: no copy.

    Raises:
        ConfigError: the images differ in size (the transform must produce one fixed size) or
            dtype, or are not image tensors.

    """
    # Worker batches live on the CPU whatever the default device (set_default_device) says.
    if not images:
        return Batch(
            torch.empty((0, 3, 0, 0), dtype=torch.uint8, device="cpu"),
            torch.empty(0, dtype=torch.int64, device="cpu"),
        )
    out = rows.holding(images) if rows is not None else None
    if out is None:
        first = images[0]
        for img in images:
            _check_image(first, img)
        if first.dtype != torch.uint8:  # a transform of the caller's that returns floats (Normalize...)
            out = _stacked(images, shared=pool is not None)
        else:
            into = BatchRows(len(images), pool=pool)
            for img in images:
                into.put(img)
            out = into.holding(images=into.rows)
            assert out is not None
    return Batch(out, torch.tensor(labels, dtype=torch.int64, device="cpu"))


def _check_image(first: Any, img: Any) -> None:
    """Raise :class:`ConfigError` unless ``img`` stacks with ``first``: one size, one dtype, ``[C, H, W]``."""
    if not isinstance(img, torch.Tensor) or img.dim() != 3:
        what = f"a {type(img).__name__}" if not isinstance(img, torch.Tensor) else f"shape {tuple(img.shape)}"
        raise ConfigError(
            f"a batch needs image tensors [C, H, W], but the transform returned {what}; end it with "
            "ToTensor() (v1) or ToImage() (v2), or use a preset"
        )
    if img.dtype != first.dtype:
        raise ConfigError(
            f"a batch needs images of one dtype, but the transform returned {first.dtype} and {img.dtype}"
        )
    if img.shape != first.shape:
        raise ConfigError(
            f"a batch needs images of one size, got {tuple(first.shape)} and {tuple(img.shape)}; use a "
            "transform that crops to a fixed size (a preset does)"
        )


def _stacked(images: Sequence[torch.Tensor], *, shared: bool) -> torch.Tensor:
    """``images`` stacked (in shared memory in a worker, as ``default_collate`` does: no copy to send)."""
    first = images[0]
    if not shared:
        return torch.stack(list(images))
    storage = new_shared(len(images) * first.numel() * first.element_size())
    out = torch.empty(0, dtype=first.dtype, device="cpu").set_(storage).view(len(images), *first.shape)
    return torch.stack(list(images), out=out)


class BatchRows:
    """A channels-last ``uint8`` batch buffer filled one image at a time, as the images are made.

    :meth:`put` copies an image into the next row and returns that row, so the image's own memory
    is freed at once (and reused, still in cache, by the next decode) instead of a batch of images
    waiting for a stack: decoding, augmenting and stacking 64 at a time took 3% longer than writing
    each image into its row as it came (one process, 1,600 ImageNet-like JPEGs). :func:`collate`
    then takes the rows, if they come back in order, as the batch without copying them again.
    """

    __slots__ = ("_out", "capacity", "pool", "rows")

    def __init__(self, capacity: int, *, pool: BufferPool | None = None) -> None:
        self.capacity, self.pool = capacity, pool
        self.rows: list[torch.Tensor] = []
        self._out: torch.Tensor | None = None

    def put(self, image: torch.Tensor) -> torch.Tensor:
        """``image`` copied into the next row, and that row; ``image`` itself if it does not fit there."""
        if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8 or image.dim() != 3:
            return image  # collate says what is wrong with it, or stacks it (floats)
        out = self._out
        if out is None:
            if not self.capacity:
                return image
            out = self._out = self._buffer(*image.shape)
        if len(self.rows) == len(out) or image.shape != out.shape[1:]:
            return image  # collate says what is wrong with it
        row = out[len(self.rows)]
        row.copy_(image)
        self.rows.append(row)
        return row

    def holding(self, images: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """The batch of ``images`` if they are the rows :meth:`put` handed out, in order; else None."""
        if self._out is None or len(images) > len(self.rows):
            return None
        if any(img is not row for img, row in zip(images, self.rows, strict=False)):
            return None
        return self._out[: len(images)]

    def _buffer(self, channels: int, height: int, width: int) -> torch.Tensor:
        nhwc = (self.capacity, height, width, channels)
        if self.pool is None:
            out = torch.empty(nhwc, dtype=torch.uint8, device="cpu")
        else:
            storage = self.pool.take(self.capacity * height * width * channels)
            out = torch.empty(0, dtype=torch.uint8, device="cpu").set_(
                storage, 0, nhwc, (height * width * channels, width * channels, channels, 1)
            )
        return out.permute(0, 3, 1, 2)


def to_device(
    batch: Batch,
    device: torch.device | str,
    *,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    channels_last: bool = False,
    dtype: torch.dtype = torch.float32,
) -> Batch:
    """Copy a batch to ``device`` as ``uint8`` (non-blocking) and normalize it there.

    Only ``uint8`` crosses the bus; the float conversion and ``(x / 255 - mean) / std`` run on the
    device. The copy overlaps with compute when the batch is in pinned memory (``make_loader``'s
    ``pin_memory=True`` on a CUDA machine). Works the same on ``"cpu"``. Float images (a transform
    of the caller's normalized them already) are only copied, as ``dtype``.

    Args:
        batch: A batch from the loader.
        device: Where to put it.
        mean: Per-channel mean of pixels in ``[0, 1]``.
        std: Per-channel standard deviation of pixels in ``[0, 1]``.
        channels_last: Return images in channels-last memory format (for ``channels_last`` models,
            AMP on tensor cores); otherwise contiguous ``NCHW``.
        dtype: Floating dtype of the images.

    Returns:
        ``Batch(images dtype [B, 3, H, W], labels int64 [B])`` on ``device``.

    """
    if len(mean) != 3 or len(std) != 3:
        raise ConfigError(f"mean and std need 3 values (R, G, B), got {list(mean)} and {list(std)}")
    if not dtype.is_floating_point:
        raise ConfigError(f"to_device normalizes to a floating dtype, got {dtype}")
    device = torch.device(device)
    if batch.images.is_floating_point():  # a transform of the caller's made and normalized them
        images = batch.images.to(device, dtype=dtype, non_blocking=True)
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        return Batch(images.contiguous(memory_format=fmt), batch.labels.to(device, non_blocking=True))
    images = batch.images.to(device, non_blocking=True)
    labels = batch.labels.to(device, non_blocking=True)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = images.to(dtype=dtype, memory_format=fmt)
    scale = torch.tensor([255 * s for s in std], dtype=dtype, device="cpu").view(1, 3, 1, 1)
    shift = torch.tensor([255 * m for m in mean], dtype=dtype, device="cpu").view(1, 3, 1, 1)
    scale, shift = scale.to(device, non_blocking=True), shift.to(device, non_blocking=True)
    x.sub_(shift).div_(scale)
    return Batch(x, labels)
