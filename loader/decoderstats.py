"""What the training process's decoder did: batches, time per stage, fallbacks, memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from time import perf_counter
from typing import Any

import torch

__all__ = ["AUGMENT", "DECODE", "NORMALIZE", "DecoderStats", "Marks"]

DECODE, AUGMENT, NORMALIZE = "decode", "augment", "normalize"


@dataclass
class DecoderStats:
    """What the decoder did so far: batches, time per stage, fallbacks, and its memory at the peak.

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

    def ms_per_batch(self, stage: str) -> float:
        """Mean milliseconds per batch spent in ``stage`` (``"decode"``, ``"augment"``, ``"normalize"``)."""
        return self.seconds[stage] / self.batches * 1000 if self.batches else 0.0


class Marks:
    """Timestamps between the stages of one batch: CUDA events on a GPU, ``perf_counter`` on the CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.marks: list[tuple[str, Any]] = []

    def mark(self, stage: str) -> None:
        """Close the stage running since the previous mark; ``stage`` is the one it belonged to."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((stage, event))
        else:
            self.marks.append((stage, perf_counter()))

    def add_to(self, seconds: dict[str, float]) -> None:
        """Add the time of each stage to ``seconds`` (on a GPU, waits for the last event)."""
        if self.cuda and self.marks:
            self.marks[-1][1].synchronize()
        for (_, start), (stage, end) in pairwise(self.marks):
            seconds[stage] += start.elapsed_time(end) / 1000 if self.cuda else end - start
