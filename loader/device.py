"""Decode and augment whole batches in the training process: on a CUDA GPU (nvjpeg), or on the CPU.

With ``ShardDataset(..., decode_on="cuda")`` the DataLoader workers only read, shuffle and batch raw
bytes (:class:`~.offload.RawBatch`, one message per batch), and a :class:`DeviceDecoder` in the
training process turns each into a normalized :class:`~.batch.Batch` on the device::

    RawBatch -> decode (nvjpeg, one call per chunk of the batch; the CPU decoder for the rest)
        -> preset per image, on the device -> stack -> normalize (exactly as ``to_device``)

- **Same augmentation as in the workers**: torch's generator is seeded from the batch's
  ``(seed, epoch, rank, worker, batch)`` (:func:`~.pipeline.augment_seed`) and the images are
  transformed in sample order, so every random parameter is the one a worker would draw. On the CPU
  (``decode_on="cpu"``, run on one thread as a worker runs) the images are bit-identical to
  ``to_device(batch from the workers)``; on a GPU the crop, flip and colour parameters are the
  same, the pixels differ by the float resize's rounding.
- **Fallbacks**: non-JPEG samples, CMYK JPEGs (nvjpeg does not convert them) and JPEGs whose header
  does not parse go to the CPU decoder (:func:`~.decode.decode`), as does any JPEG nvjpeg refuses (a
  refused batch call is retried image by image). What the CPU decoder cannot read either is a
  :class:`~.errors.CorruptImageError`: raised or skipped and counted, as ``on_error`` says.
- **Overlap** (CUDA): batch ``k + 1`` is decoded on a side stream while the training step runs on
  batch ``k``; the training stream waits for it on an event, never the host.
- **Bounded memory**: one decode call gets at most ``max_decoded_bytes`` of decoded pixels (from the
  JPEG headers; a single larger image goes alone), and at most ``ahead + 1`` finished batches are
  held. :attr:`DeviceDecoder.stats` reports the bytes the loader's tensors took at their peak.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from time import perf_counter
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

from .batch import Batch, to_device
from .decode import decode, jpeg_header
from .epoch.seeds import augment_seed
from .errors import ConfigError, CorruptImageError
from .offload import DecodeOn, RawBatch
from .pipeline.read import seeded
from .presets import Transform
from .state.cursor import CORRUPT

if TYPE_CHECKING:
    from .dataset import ShardDataset

__all__ = ["DecoderStats", "DeviceDecoder"]

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
    decode_calls: int = 0
    peak_bytes: int = 0
    bound_bytes: int = 0

    def ms_per_batch(self, stage: str) -> float:
        """Mean milliseconds per batch spent in ``stage`` (``"decode"``, ``"augment"``, ``"normalize"``)."""
        return self.seconds[stage] / self.batches * 1000 if self.batches else 0.0


class _Marks:
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


class DeviceDecoder:
    """Turns raw batches into normalized batches on ``config.device`` (see the module docstring)."""

    def __init__(
        self,
        config: DecodeOn,
        *,
        transform: Transform,
        seed: int,
        rank: int,
        on_corrupt: Callable[[int, CorruptImageError], None] | None,
    ) -> None:
        self.config, self.transform, self.seed, self.rank = config, transform, seed, rank
        self.device = torch.device(config.device)
        # Called as on_corrupt(worker, error) for an image no decoder reads; None: raise it.
        self.on_corrupt = on_corrupt
        self.stats = DecoderStats()
        self._timings: deque[_Marks] = deque()
        self._held = 0  # bytes of finished batches handed out or waiting

    @classmethod
    def of(cls, dataset: ShardDataset) -> DeviceDecoder:
        """The decoder for ``dataset``'s settings; skipped images count in ``dataset.corrupt_skipped``."""
        assert dataset.decode_on is not None

        def on_corrupt(worker: int, e: CorruptImageError) -> None:
            dataset._control.count(worker, CORRUPT)
            warnings.warn(f"skipped: {e}", RuntimeWarning, stacklevel=3)

        return cls(
            dataset.decode_on,
            transform=dataset.transform,
            seed=dataset.seed,
            rank=dataset.rank,
            on_corrupt=None if dataset.on_error == "raise" else on_corrupt,
        )

    # ---- the stream: overlap on a GPU ---------------------------------------------------------

    def stream(self, raws: Iterable[RawBatch]) -> Iterator[Batch]:
        """Decode ``raws`` in order; on a GPU, ``config.ahead`` batches ahead on a side stream."""
        if not self.config.cuda:
            for raw in raws:
                yield self.decode(raw)
                self._collect_timings()
            return
        side = torch.cuda.Stream(self.device)
        pending: deque[tuple[Batch, torch.cuda.Event, int]] = deque()
        source = iter(raws)

        def launch() -> bool:
            raw = next(source, None)
            if raw is None:
                return False
            with torch.cuda.stream(side):
                batch = self.decode(raw)
                done = torch.cuda.Event()
                done.record(side)
            pending.append((batch, done, _nbytes(batch)))
            return True

        handed: torch.cuda.Event | None = None
        try:
            while pending or launch():
                batch, done, nbytes = pending.popleft()
                consumer = torch.cuda.current_stream(self.device)
                consumer.wait_event(done)  # the training stream waits on the device, not the host
                if handed is not None:
                    # The host waits only for the decode of the batch handed out before: the side
                    # stream never has more than `ahead + 1` batches queued, so memory stays bounded.
                    handed.synchronize()
                handed = done
                # Made on the side stream, used on the training stream: the allocator must know.
                batch.images.record_stream(consumer)
                batch.labels.record_stream(consumer)
                while len(pending) < self.config.ahead:  # queued now, decoded during the step on `batch`
                    self._held = nbytes + sum(n for _, _, n in pending)
                    if not launch():
                        break
                self._collect_timings()
                yield batch
        finally:
            self._held = 0

    # ---- one batch ----------------------------------------------------------------------------

    def decode(self, raw: RawBatch) -> Batch:
        """Decode, augment and normalize one raw batch on the device (on the current stream)."""
        marks = _Marks(self.config.cuda)
        marks.mark("")
        images: list[torch.Tensor] = []
        kept: list[int] = []
        live = peak = 0  # bytes of this batch's tensors on the device
        seed = augment_seed(self.seed, raw.epoch, self.rank, raw.worker, raw.index)
        probes = [_probe(raw, i) for i in range(len(raw))]
        with seeded(seed, restore=True), _one_thread(not self.config.cuda):
            for chunk in self._chunks(probes):
                decoded = self._decode_chunk(raw, chunk, probes)
                marks.mark(DECODE)
                chunk_bytes = sum(_nbytes_of(d) for d in decoded.values())
                peak = max(peak, live + chunk_bytes)
                for i in chunk:  # in sample order: the generator's draws are the workers'
                    image = decoded.pop(i)
                    if isinstance(image, CorruptImageError):
                        if self.on_corrupt is None:
                            raise image
                        self.on_corrupt(raw.worker, image)
                        continue
                    out = self.transform(image)
                    images.append(out)
                    kept.append(i)
                    live += out.nbytes
                peak = max(peak, live + chunk_bytes)
                marks.mark(AUGMENT)
            batch = self._normalize(images, raw.labels[kept] if kept else raw.labels[:0])
            peak = max(peak, live * 2 + batch.images.nbytes)  # the stacked copy, then the output
            marks.mark(NORMALIZE)
        self._timings.append(marks)
        self.stats.batches += 1
        self.stats.images += len(kept)
        self.stats.peak_bytes = max(self.stats.peak_bytes, peak + self._held)
        self.stats.bound_bytes = max(self.stats.bound_bytes, self._bound(probes, batch))
        return batch

    def _chunks(self, probes: Sequence[_Probe]) -> Iterator[list[int]]:
        """Consecutive runs of the batch that decode to at most ``max_decoded_bytes`` together."""
        chunk: list[int] = []
        size = 0
        for i, probe in enumerate(probes):
            if chunk and size + probe.nbytes > self.config.max_decoded_bytes:
                yield chunk
                chunk, size = [], 0
            chunk.append(i)
            size += probe.nbytes
        if chunk:
            yield chunk

    def _decode_chunk(
        self, raw: RawBatch, chunk: Sequence[int], probes: Sequence[_Probe]
    ) -> dict[int, torch.Tensor | CorruptImageError]:
        """Decode samples ``chunk``: JPEGs the batched decoder takes in one call, the rest on the CPU."""
        batched = [i for i in chunk if probes[i].batched]
        cpu = [i for i in chunk if not probes[i].batched]
        out: dict[int, torch.Tensor | CorruptImageError] = {}
        if batched:
            self.stats.decode_calls += 1
            try:
                images = decode_jpeg(
                    [raw.sample(i) for i in batched], mode=ImageReadMode.RGB, device=self.device
                )
                out.update(zip(batched, images, strict=True))
            except (RuntimeError, ValueError):
                for i in batched:  # one refused image fails the call: find it, the others stay here
                    try:
                        out[i] = decode_jpeg(raw.sample(i), mode=ImageReadMode.RGB, device=self.device)
                    except (RuntimeError, ValueError):
                        cpu.append(i)
        for i in sorted(cpu):
            self.stats.cpu_fallback += 1
            data = raw.sample(i).numpy().tobytes()
            try:
                out[i] = decode(data, raw.exts[i], key=raw.keys[i], shard=raw.shards[i]).to(self.device)
            except CorruptImageError as e:
                out[i] = e
        return out

    def _normalize(self, images: list[torch.Tensor], labels: torch.Tensor) -> Batch:
        for image in images[1:]:
            if image.shape != images[0].shape or image.dtype != torch.uint8:
                raise ConfigError(
                    f"a batch needs uint8 images of one size, got {tuple(images[0].shape)} and "
                    f"{tuple(image.shape)} ({image.dtype}); use a transform that crops to a fixed size"
                )
        stacked = torch.stack(images) if images else torch.empty((0, 3, 0, 0), dtype=torch.uint8)
        c = self.config
        return to_device(
            Batch(stacked, labels),
            self.device,
            mean=c.mean,
            std=c.std,
            channels_last=c.channels_last,
            dtype=c.dtype,
        )

    def _bound(self, probes: Sequence[_Probe], batch: Batch) -> int:
        """What the design bounds this decoder's memory by, for batches like ``batch``.

        One decode call's pixels (``max_decoded_bytes``, or one larger image alone), the augmented
        images and their stacked copy (uint8), and the finished batches held (``ahead + 1``).
        """
        n = len(probes)
        per_image = batch.images[0].numel() if len(batch.images) else 0
        out = n * per_image * batch.images.element_size()
        largest = max((p.nbytes for p in probes), default=0)
        return max(self.config.max_decoded_bytes, largest) + 2 * n * per_image + (self.config.ahead + 1) * out

    def _collect_timings(self) -> None:
        """Add up the stage times of batches whose work is finished (all of them on the CPU)."""
        while self._timings and (not self.config.cuda or self._timings[0].marks[-1][1].query()):
            self._timings.popleft().add_to(self.stats.seconds)

    def settle(self) -> DecoderStats:
        """Wait for the timings of every batch decoded so far and return :attr:`stats`."""
        while self._timings:
            self._timings.popleft().add_to(self.stats.seconds)
        return self.stats


@contextlib.contextmanager
def _one_thread(cpu: bool) -> Iterator[None]:
    """On the CPU, run torch on one thread, as in a DataLoader worker.

    Float reductions (a resize, the colour matrix's mean) round differently with another number of
    threads, and ops this small gain little from more threads; on a busy machine they lose much.
    """
    threads = torch.get_num_threads()
    if cpu:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if cpu:
            torch.set_num_threads(threads)


class _Probe(NamedTuple):
    """What a sample's header says before decoding: whether nvjpeg takes it, its decoded bytes."""

    batched: bool
    nbytes: int


def _probe(raw: RawBatch, i: int) -> _Probe:
    data = raw.sample(i).numpy().data
    if raw.exts[i] == "jpg" and (header := jpeg_header(data)) is not None:
        # nvjpeg's RGB output does not convert CMYK/YCCK (4 components): the CPU decoder does.
        return _Probe(header.components in (1, 3), 3 * header.height * header.width)
    try:  # another format, or a JPEG whose header does not parse: Pillow reads only the header here
        with Image.open(io.BytesIO(data)) as im:
            return _Probe(False, 3 * im.width * im.height)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):  # the CPU decoder says why
        return _Probe(False, 0)


def _nbytes(batch: Batch) -> int:
    return batch.images.nbytes + batch.labels.nbytes


def _nbytes_of(item: torch.Tensor | CorruptImageError) -> int:
    return item.nbytes if isinstance(item, torch.Tensor) else 0
