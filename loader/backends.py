"""The batched JPEG decoders behind ``decode_on``: nvjpeg on a GPU, the workers' decoder on the CPU.

Why torchcodec first: torchvision's ``decode_jpeg(device="cuda")`` is deprecated (it warns on every
call) and ``torchcodec.decoders.decode_jpeg`` is its successor, with the same contract (a list of
CPU byte tensors in, one nvjpeg call, a list of ``uint8 [3, H, W]`` CUDA tensors out). torchvision's
stays the fallback while torchcodec is not installed. NVIDIA DALI or nvImageCodec could sit behind
the same :data:`Backend` type; neither is installed with torch, and neither can be tested here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .decode import decode
from .errors import CorruptImageError
from .offload import RawBatch

__all__ = ["Backend", "decode_sample", "default_backend"]

# A batched JPEG decoder: the bytes of each image (CPU uint8 tensors) to RGB uint8 [3, H, W] tensors on
# the device. It raises for a batch it refuses (one bad image is enough).
Backend = Callable[[list[torch.Tensor], torch.device], list[torch.Tensor]]


def default_backend(device: torch.device) -> Backend:
    """The batched decoder for ``device``.

    On a GPU: ``torchcodec.decoders.decode_jpeg`` (nvjpeg, one call a batch), torchvision's
    ``decode_jpeg(device="cuda")`` where torchcodec is not installed (deprecated there). On the CPU:
    the DataLoader workers' own decoder, image by image, so both paths decode alike.
    """
    if torch.device(device).type == "cuda":
        return _cuda_decode
    return _host_decode


def _cuda_decode(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    try:
        from torchcodec.decoders import decode_jpeg as codec_decode_jpeg
    except ImportError:
        from torchvision.io import ImageReadMode, decode_jpeg

        return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device=device))
    return list(codec_decode_jpeg(datas, mode="RGB", device=device))


def _host_decode(datas: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    return [decode(d.numpy().tobytes(), "jpg").to(device) for d in datas]


def decode_sample(raw: RawBatch, i: int) -> torch.Tensor | CorruptImageError:
    """Sample ``i`` of ``raw`` through the workers' own CPU decoder, or why it does not decode."""
    try:
        return decode(raw.sample(i).numpy().tobytes(), raw.exts[i], key=raw.keys[i], shard=raw.shards[i])
    except CorruptImageError as e:
        return e
