"""The device memory of the training process's decoder, as the CUDA caching allocator counts it.

The decoder adds up the tensors of each batch (:class:`Memory`), each rounded as the allocator
rounds a block (:func:`rounded`), and compares the peak with what its design bounds it by
(``DeviceDecoder``'s ``_bound``). On a GPU, ``torch.cuda.max_memory_allocated`` and
``memory_reserved`` are the measured figures (``imgshards bench --decode-on cuda`` reports them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..state.buffers import Batch
from .augment import canvas_bytes

__all__ = ["LARGE", "LARGE_SEGMENT", "SMALL", "SMALL_SEGMENT", "Memory", "bound", "rounded"]

# The CUDA caching allocator's granularity: blocks of up to 1 MiB round up to 512 bytes, larger ones
# to 2 MiB; it reserves segments of 2 MiB (small blocks) and 20 MiB (blocks up to 10 MiB).
SMALL, LARGE = 512, 2 << 20
SMALL_SEGMENT, LARGE_SEGMENT = 2 << 20, 20 << 20


def rounded(nbytes: int) -> int:
    """``nbytes`` as the caching allocator rounds a block of that size."""
    step = SMALL if nbytes <= 1 << 20 else LARGE
    return -(-max(nbytes, 1) // step) * step


class Memory:
    """The bytes one batch's tensors take on the device at their peak, each rounded as allocated.

    ``add`` counts a tensor that lives until its chunk is done (``keep``: until the batch is),
    ``add_transient`` one that lives only while one image or group is augmented; :meth:`free_chunk`
    drops a chunk's.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.live = self.chunk = self.peak = 0

    def add(self, nbytes: int, *, keep: bool = False) -> None:
        """Count a tensor of ``nbytes`` until its chunk is done (``keep``: until the batch is)."""
        if keep:
            self.live += rounded(nbytes)
        else:
            self.chunk += rounded(nbytes)
        self.peak = max(self.peak, self.live + self.chunk)

    def add_transient(self, nbytes: int) -> None:
        """Count a tensor of ``nbytes`` that lives only while one image or group is augmented."""
        self.peak = max(self.peak, self.live + self.chunk + rounded(nbytes))

    def free_chunk(self) -> None:
        """The chunk's decoded images are gone."""
        self.chunk = 0


def bound(
    shapes: Sequence[tuple[int, int]],
    *,
    raw_bytes: int,
    batch: Batch,
    max_decoded_bytes: int,
    ahead: int,
    batched: bool,
    cuda: bool,
) -> int:
    """What the decoder's design bounds its memory by, for a batch of images of ``shapes`` like ``batch``.

    Per batch in work: the decoder's copy of the JPEGs (``raw_bytes``), one decode call's pixels
    (``max_decoded_bytes``, or one larger image alone), the float working set of the augment (the
    batched canvas, at most ``4 * max_decoded_bytes`` or one image's, its border indices, and
    ``roi_align``'s output;
    per image on a GPU: an image's float region and its resize), the augmented images and their
    stacked copy (``uint8``), the normalized output; each allocation rounded as the caching
    allocator rounds it. Batches: the one in work, ``ahead`` ready in the ring, and the one the
    training loop holds. On a GPU, the allocator's reserve: a 20 MiB and a 2 MiB segment for each
    of the decoder's two streams.
    """
    n = max(len(shapes), 1)
    per_image = batch.images[0].numel() if len(batch.images) else 0
    largest = max((3 * h * w for h, w in shapes), default=0)
    slack = SMALL if largest <= 1 << 20 else LARGE  # what rounding adds to one image at most
    decoded = max(max_decoded_bytes, largest) + n * slack
    if batched:
        canvas = max((canvas_bytes([s]) for s in shapes), default=0)
        # The canvas, and its border indices (36 bytes a row, at most what a row of canvas holds).
        float_set = 2 * rounded(max(4 * max_decoded_bytes, canvas)) + rounded(4 * n * per_image)
    else:
        float_set = rounded(4 * largest) + rounded(4 * per_image) if cuda else 0
    uint8 = n * rounded(per_image) + 2 * rounded(n * per_image)  # augmented, sorted back, stacked
    out = rounded(n * per_image * batch.images.element_size()) + rounded(8 * n)
    small = 64 << 10  # boxes, masks, colour terms, normalization constants: each a block of its own
    in_work = rounded(raw_bytes) + decoded + float_set + uint8 + out + small
    reserve = 2 * (LARGE_SEGMENT + SMALL_SEGMENT) if cuda else 0
    return in_work + (ahead + 1) * out + reserve
