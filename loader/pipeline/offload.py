"""Decoding in the training process: where (:class:`DecodeOn`) and what a worker sends (:class:`RawBatch`).

With ``ShardDataset(decode_on=...)`` a DataLoader worker still reads, shuffles and cuts its stream
into batches, but stops before decoding: it packs the batch's image bytes into one ``uint8`` tensor
(in shared memory, so crossing to the training process copies nothing) with their offsets, labels
and names, and the position that seeds the batch's augmentation (epoch, worker, batch). The
training process decodes and augments it (:mod:`.decoding`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from ..errors import ConfigError
from ..state.buffers import shared_tensor
from .collate import IMAGENET_MEAN, IMAGENET_STD, refuse_default_collate
from .tar import image_member, sample_shard

__all__ = ["DecodeOn", "RawBatch", "raw_batch"]


@dataclass(frozen=True, kw_only=True)
class DecodeOn:
    """Where and how the training process decodes batches (``ShardDataset(decode_on=...)``).

    Args:
        device: ``"cuda"`` (or ``"cuda:N"``): nvjpeg and the presets on that GPU; ``"cpu"``: the same
            batched path on the CPU (what CI tests; slower than decoding in the workers).
        dtype: Floating dtype of the normalized images (``torch.bfloat16`` halves their memory).
        channels_last: Images in channels-last memory format.
        mean: Per-channel mean of pixels in ``[0, 1]``, as for ``to_device``.
        std: Per-channel standard deviation.
        max_decoded_bytes: Decoded pixels one decode call may produce (the rest of the batch waits
            for the next call): bounds the decoder's memory whatever the images' sizes.
        ahead: Ready batches a producer thread keeps ahead of the one the training loop holds (1
            overlaps making batch ``k + 1`` with the step on batch ``k``; 0 makes each batch in the
            training thread when it is asked for).
        augment: ``"batched"`` (the presets applied to many images at once, a few launches per
            group: :mod:`.augment`) or ``"per_image"`` (the presets image by image, as the workers
            run them); ``None``: batched on a GPU, per image on the CPU (where ``decode_on="cpu"``
            then gives the workers' batches bit for bit).

    Raises:
        ConfigError: an unknown device, CUDA asked for without one, or a value out of range.

    """

    device: torch.device | str = "cuda"
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    max_decoded_bytes: int = 256 << 20
    ahead: int = 1
    augment: Literal["batched", "per_image"] | None = None

    def __post_init__(self) -> None:
        try:
            device = torch.device(self.device)
        except (RuntimeError, TypeError):
            raise ConfigError(
                f"decode_on: unknown device {self.device!r}; expected 'cpu' or 'cuda'"
            ) from None
        if device.type not in ("cpu", "cuda"):
            raise ConfigError(f"decode_on: unknown device {self.device!r}; expected 'cpu' or 'cuda'")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                f"decode_on={self.device!r} but torch sees no CUDA device; use decode_on='cpu' (the same "
                "batched path on the CPU) or leave decode_on unset to decode in the DataLoader workers"
            )
        object.__setattr__(self, "device", device)
        if not self.dtype.is_floating_point:
            raise ConfigError(f"decode_on: dtype must be a floating dtype, got {self.dtype}")
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ConfigError(f"decode_on: mean and std need 3 values, got {self.mean} and {self.std}")
        if self.augment not in (None, "batched", "per_image"):
            raise ConfigError(
                f"decode_on: unknown augment {self.augment!r}; expected 'batched', 'per_image' or None"
            )
        if self.max_decoded_bytes < 1 or self.ahead < 0:
            raise ConfigError(
                f"decode_on: need max_decoded_bytes >= 1 and ahead >= 0, got {self.max_decoded_bytes}, "
                f"{self.ahead}"
            )

    @classmethod
    def of(cls, value: DecodeOn | str | torch.device | None) -> DecodeOn | None:
        """``value`` as a :class:`DecodeOn` (a device name is its ``device``); ``None`` stays ``None``."""
        if value is None or isinstance(value, DecodeOn):
            return value
        if isinstance(value, str | torch.device):
            return cls(device=value)
        raise ConfigError(f"decode_on must be None, 'cpu', 'cuda' or a DecodeOn, got {value!r}")

    @property
    def cuda(self) -> bool:
        """Whether batches are decoded on a GPU."""
        return torch.device(self.device).type == "cuda"


@dataclass(frozen=True, kw_only=True)
class RawBatch:
    """The samples of one batch as stored: image bytes back to back, and what names each.

    Attributes:
        data: ``uint8 [total bytes]``, sample ``i``'s bytes at ``offsets[i]:offsets[i + 1]``.
        offsets: ``int64 [n + 1]``.
        labels: ``int64 [n]``.
        exts: Each sample's format (its member's extension in the shard, ``"jpg"`` for JPEG).
        keys: Each sample's key, for error messages.
        shards: Each sample's shard, for error messages.
        epoch: The epoch the batch belongs to.
        worker: The worker (its role after a resume) that made it.
        index: Its position among that worker's batches of the epoch.

    """

    data: torch.Tensor
    offsets: torch.Tensor
    labels: torch.Tensor
    exts: tuple[str, ...]
    keys: tuple[str, ...]
    shards: tuple[str, ...]
    epoch: int
    worker: int
    index: int

    def __len__(self) -> int:
        return len(self.exts)

    def sample(self, i: int) -> torch.Tensor:
        """The bytes of sample ``i``: a ``uint8`` view into :attr:`data`."""
        return self.data[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def pin_memory(self) -> RawBatch:
        """The batch itself: a raw batch is never copied into pinned memory.

        DataLoader's pin thread (``pin_memory=True``) calls this for every batch. Pinning pays only
        for a copy to a GPU that runs asynchronously; nothing reads these bytes so: the decoders
        read them on the host (nvjpeg's Huffman stage runs on the CPU), and copying each batch
        (~28 MB for 256 ImageNet JPEGs) would only cost a core and pinned memory.
        """
        return self


refuse_default_collate(RawBatch)  # DataLoader(batch_size=N) would list several


def raw_batch(
    samples: Sequence[Mapping[str, Any]], *, epoch: int, worker: int, index: int, shared: bool
) -> RawBatch:
    """Pack sample dicts into a :class:`RawBatch`; with ``shared``, its bytes in shared memory."""
    exts = [image_member(s) for s in samples]
    images = [s[ext] if ext else b"" for s, ext in zip(samples, exts, strict=True)]
    labels = [int(s["__label__"]) for s in samples]
    sizes = [len(data) for data in images]
    n, total = len(samples), sum(sizes)
    if shared:  # made shared here: torch would share each tensor on its way out by a /dev/shm name
        data, offsets = shared_tensor((total,), torch.uint8), shared_tensor((n + 1,), torch.int64)
        label_ids = shared_tensor((n,), torch.int64)
    else:
        data = torch.empty(total, dtype=torch.uint8, device="cpu")
        offsets = torch.zeros(n + 1, dtype=torch.int64, device="cpu")
        label_ids = torch.empty(n, dtype=torch.int64, device="cpu")
    label_ids.numpy()[:] = labels
    ends = offsets.numpy()
    np.cumsum(sizes, out=ends[1:])
    out = data.numpy()
    for image, start, stop in zip(images, ends[:-1], ends[1:], strict=True):
        out[start:stop] = np.frombuffer(image, dtype=np.uint8)
    return RawBatch(
        data=data,
        offsets=offsets,
        labels=label_ids,
        exts=tuple(exts),
        keys=tuple(str(s.get("__key__")) for s in samples),
        shards=tuple(sample_shard(s) for s in samples),
        epoch=epoch,
        worker=worker,
        index=index,
    )
