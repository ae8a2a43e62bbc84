"""What the training process's decoder did: batches, time per step, fallbacks, memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from time import perf_counter
from typing import Any

import torch

from ..pipeline.steps import AUGMENT, DECODE, NORMALIZE

__all__ = ["DecoderStats", "Marks"]


@dataclass
class DecoderStats:
    """What the decoder did so far: batches, time per step, fallbacks, and its memory at the peak.

    Times are the device's: GPU time between CUDA events on a GPU, wall time on the CPU.
    """

    batches: int = 0
    images: int = 0
    seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys((DECODE, AUGMENT, NORMALIZE), 0.0)
    )
    cpu_fallback: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)  # why, as the probe says ("progressive"...)
    decode_calls: int = 0
    peak_bytes: int = 0
    bound_bytes: int = 0

    def ms_per_batch(self, step: str) -> float:
        """Mean milliseconds per batch spent in ``step`` (``"decode"``, ``"augment"``, ``"normalize"``)."""
        return self.seconds[step] / self.batches * 1000 if self.batches else 0.0


class Marks:
    """Timestamps between the steps of one batch: CUDA events on a GPU, ``perf_counter`` on the CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.marks: list[tuple[str, Any]] = []

    def mark(self, step: str) -> None:
        """Close the step running since the previous mark; ``step`` is the one it belonged to."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((step, event))
        else:
            self.marks.append((step, perf_counter()))

    def add_to(self, seconds: dict[str, float]) -> None:
        """Add the time of each step to ``seconds`` (on a GPU, waits for the last event)."""
        if self.cuda and self.marks:
            self.marks[-1][1].synchronize()
        for (_, start), (step, end) in pairwise(self.marks):
            seconds[step] += start.elapsed_time(end) / 1000 if self.cuda else end - start
