"""What the training process's decoder did in a bench run (``imgshards bench --decode-on``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..device.marks import DecoderStats

__all__ = ["DECODE_ON", "DeviceRun"]

# Where a bench run decodes: in the DataLoader workers (the default), or in the training process.
DECODE_ON = ("workers", "cpu", "cuda")


@dataclass(frozen=True, kw_only=True)
class DeviceRun:
    """The decoder's work over a run: per-batch step times, fallbacks and memory.

    Times are the device's (GPU time between CUDA events, wall time on the CPU), over every batch
    the run decoded, the first and those decoded ahead included. ``peak_bytes`` is what the
    loader's own tensors took at their peak, ``bound_bytes`` what its design bounds that by;
    ``cuda_max_allocated`` is torch's peak of allocated GPU memory over the run (the bench's
    process holds no model, so all of it is the loader's), ``cuda_max_reserved`` the caching
    allocator's peak reserve (what ``nvidia-smi`` shows of it, but nvjpeg's own buffers), and
    ``fallbacks`` why images went to the CPU decoder.
    """

    device: str
    batches: int
    seconds: dict[str, float]
    cpu_fallback: int
    decode_calls: int
    peak_bytes: int
    bound_bytes: int
    cuda_max_allocated: int | None
    cuda_max_reserved: int | None = None
    fallbacks: dict[str, int] | None = None

    @classmethod
    def of(cls, stats: DecoderStats, device: torch.device) -> DeviceRun:
        """The figures of ``stats``; on CUDA with torch's peak allocation since the last reset."""
        cuda = device.type == "cuda"
        return cls(
            device=str(device),
            batches=stats.batches,
            seconds=dict(stats.seconds),
            cpu_fallback=stats.cpu_fallback,
            decode_calls=stats.decode_calls,
            peak_bytes=stats.peak_bytes,
            bound_bytes=stats.bound_bytes,
            cuda_max_allocated=torch.cuda.max_memory_allocated(device) if cuda else None,
            cuda_max_reserved=torch.cuda.max_memory_reserved(device) if cuda else None,
            fallbacks=dict(stats.fallbacks),
        )

    @classmethod
    def combine(cls, parts: Sequence[DeviceRun]) -> DeviceRun:
        """Add up the runs of one configuration (the halves of a bench's schedule)."""
        first = parts[0]
        peaks = [p.cuda_max_allocated for p in parts if p.cuda_max_allocated is not None]
        reserved = [p.cuda_max_reserved for p in parts if p.cuda_max_reserved is not None]
        fallbacks: dict[str, int] = {}
        for p in parts:
            for reason, n in (p.fallbacks or {}).items():
                fallbacks[reason] = fallbacks.get(reason, 0) + n
        return cls(
            device=first.device,
            batches=sum(p.batches for p in parts),
            seconds={k: sum(p.seconds[k] for p in parts) for k in first.seconds},
            cpu_fallback=sum(p.cpu_fallback for p in parts),
            decode_calls=sum(p.decode_calls for p in parts),
            peak_bytes=max(p.peak_bytes for p in parts),
            bound_bytes=max(p.bound_bytes for p in parts),
            cuda_max_allocated=max(peaks) if peaks else None,
            cuda_max_reserved=max(reserved) if reserved else None,
            fallbacks=fallbacks,
        )

    def ms_per_batch(self, step: str) -> float:
        """Mean milliseconds per batch in ``step`` (``"decode"``, ``"augment"``, ``"normalize"``)."""
        return self.seconds[step] / self.batches * 1000 if self.batches else 0.0
