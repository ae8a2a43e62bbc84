"""Decode and augment whole batches in the training process: on a CUDA GPU (nvjpeg), or on the CPU.

With ``ShardDataset(..., decode_on="cuda")`` the DataLoader workers only read, shuffle and batch raw
bytes (:class:`~.offload.RawBatch`, one message per batch), and a :class:`DeviceDecoder` in the
training process turns each into a normalized :class:`~..state.buffers.Batch` on the device::

    producer thread:  RawBatch -> probe headers (host) -> decode (one batched call per chunk, on a
        decode stream of its own; the CPU decoder for the rest) -> draw each image's view (host,
        the workers' generator, sample order) -> augment (batched: a few launches per group of
        images) -> stack -> normalize  -> ring of ``ahead`` ready batches
    training thread:  next() takes a ready batch; its stream waits for that batch's event

- **Same augmentation as in the workers**: the views (crop box, flip, colour) are drawn on the host
  from a CPU generator seeded from the batch's ``(seed, epoch, rank, worker, batch)``
  (:func:`~..pipeline.augment_seed`), in sample order, from the decoded sizes: every random parameter
  is the one a worker draws. With ``augment="per_image"`` (the default on the CPU) the preset runs
  image by image and ``decode_on="cpu"`` gives ``to_device(batch from the workers)`` bit for bit;
  with ``augment="batched"`` (the default on a GPU, :mod:`.augment`) the pixels differ from the
  per-image presets by the resize filter (the tolerance is stated there).
- **Fallbacks** (:mod:`.backends`): non-JPEG, CMYK, progressive, truncated and unparsable files go
  to the workers' CPU decoder, so the GPU keeps exactly the samples the workers keep. A batched call
  the decoder refuses is halved until the refused images are alone (``log2(n)`` calls for one bad
  image); those go to the CPU decoder, and what it cannot read is a
  :class:`~..errors.CorruptImageError` (raised, or skipped and counted). Out-of-memory and device
  errors propagate, never retried.
- **Overlap**: all of a batch's host work (the DataLoader's ``next()``, probes, draws, launches, CPU
  fallbacks) runs in a producer thread (:class:`Producer`), ``ahead`` batches ahead; the training
  thread's ``next()`` takes a ready batch. On a GPU the streams and events follow :mod:`.streams`.
  A custom transform (not a preset) draws from torch's default generator, shared with the training
  thread, so it runs in the training thread, image by image.
- **Bounded memory**: a decode call gets at most ``max_decoded_bytes`` of pixels (a larger image
  goes alone), the batched augment's canvas at most four times that, and at most ``ahead + 2``
  batches exist; :attr:`DeviceDecoder.stats` has the peak and the bound (:mod:`.memory`).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import torch

from ..epoch.seeds import augment_seed
from ..errors import ConfigError, CorruptImageError, ImageShapeError
from ..image.presets import PRESETS, Preset, Transform, View
from ..pipeline.collate import to_device
from ..pipeline.offload import DecodeOn, RawBatch
from ..pipeline.runs import seeded
from ..pipeline.steps import AUGMENT, DECODE, NORMALIZE
from ..state.buffers import Batch
from .augment import augment_groups, by_width, canvas_bytes
from .backends import Backend, Probe, chunks, decode_sample, default_backend, probe
from .marks import DecoderStats, Marks
from .memory import Memory, bound, rounded
from .streams import Ordering, ordering_for, resolve

__all__ = ["DecoderStats", "DeviceDecoder", "Producer"]


class DeviceDecoder:
    """Turns raw batches into normalized batches on ``config.device`` (see the module docstring).

    ``backend`` and ``ordering`` are the two parts that touch the GPU (the batched decoder, and
    the streams and events, :mod:`.streams`); the defaults are the real ones for the device, and
    tests on a machine without a GPU put fakes in their place.
    """

    def __init__(
        self,
        config: DecodeOn,
        *,
        transform: Transform,
        seed: int,
        rank: int,
        on_corrupt: Callable[[int, CorruptImageError], None] | None,
        backend: Backend | None = None,
        ordering: Callable[[torch.device], Ordering] | None = None,
    ) -> None:
        self.config, self.transform, self.seed, self.rank = config, transform, seed, rank
        self.device = torch.device(config.device)
        # Called as on_corrupt(worker, error) for an image no decoder reads; None: raise it.
        self.on_corrupt = on_corrupt
        self.backend = backend if backend is not None else default_backend(self.device)
        self._ordering = ordering if ordering is not None else ordering_for
        # One ordering (on a GPU: two streams) per device for the decoder's life. The caching allocator
        # reuses a freed block only for the stream it was allocated on, so fresh streams every pass
        # left each pass's blocks reserved for good: 83 GB reserved for 2 GB allocated after 20
        # passes on an H100 (docs/gpu.md).
        self._orderings: dict[torch.device, Ordering] = {}
        self.stats = DecoderStats()
        self._timings: deque[Marks] = deque()
        self._lock = threading.Lock()  # stats and timings: written by the producer, read by callers
        self._warned = False
        self._pool: ThreadPoolExecutor | None = None  # the CPU decoder's threads, made when first needed
        self.batched_augment = config.augment == "batched" or (
            config.augment is None and self.config.cuda and isinstance(transform, Preset)
        )
        if self.batched_augment and not isinstance(transform, Preset):
            raise ConfigError(
                f"decode_on: augment='batched' applies the presets {list(PRESETS)}, not {transform!r}; "
                "use augment='per_image' for a custom transform"
            )

    @property
    def threaded(self) -> bool:
        """Whether batches are made in a producer thread (``ahead >= 1`` and a preset transform).

        A custom transform draws from torch's default generator, which the training thread uses
        too: it runs in the training thread, image by image, as in a worker.
        """
        return self.config.ahead > 0 and isinstance(self.transform, Preset)

    # ---- the stream: a producer thread, a ring of ready batches ------------------------------

    def stream(self, raws: Iterable[RawBatch]) -> Iterator[Batch]:
        """Decode ``raws`` in order; with :attr:`threaded`, ``config.ahead`` ready batches ahead.

        ``raws`` is iterated (``iter()`` included) in the producer thread. A CUDA device given
        without an index is the current device of the thread that starts the stream.
        """
        device = resolve(self.device)
        ordering = self._ordering_on(device)

        def produce() -> Iterator[tuple[Batch, Any]]:
            queued: deque[Any] = deque()  # the done marks of batches whose work may still run
            for k, raw in enumerate(raws):
                if len(queued) > self.config.ahead:
                    ordering.wait(queued.popleft())  # rule 4: bounded work in flight
                with ordering.working():
                    batch = self._decode(raw, ordering, device)
                    done = ordering.finish(k)
                queued.append(done)
                yield batch, done

        if not self.threaded:
            for batch, done in produce():
                ordering.hand_over((batch.images, batch.labels), done)
                self._collect_timings()
                yield batch
            return

        def setup() -> None:
            if device.type == "cuda":
                torch.cuda.set_device(device)  # a new thread starts on device 0

        producer: Producer[tuple[Batch, Any]] = Producer(
            produce, depth=self.config.ahead, name="imgshards-decode", setup=setup
        )
        try:
            for batch, done in producer:
                ordering.hand_over((batch.images, batch.labels), done)  # rule 3: batch k's own event
                self._collect_timings()
                yield batch
        finally:
            producer.close()

    def _ordering_on(self, device: torch.device) -> Ordering:
        """The decoder's ordering for ``device``, made on first use and kept for every later pass."""
        if device not in self._orderings:
            self._orderings[device] = self._ordering(device)
        return self._orderings[device]

    # ---- one batch ----------------------------------------------------------------------------

    def decode(self, raw: RawBatch) -> Batch:
        """Decode, augment and normalize one raw batch, ready for the caller's current stream."""
        device = resolve(self.device)
        ordering = self._ordering_on(device)
        with ordering.working():
            batch = self._decode(raw, ordering, device)
            done = ordering.finish(0)
        ordering.hand_over((batch.images, batch.labels), done)
        return batch

    def _decode(self, raw: RawBatch, ordering: Ordering, device: torch.device) -> Batch:
        """:meth:`decode`'s work, under ``ordering``: the work stream is current."""
        marks = Marks(self.config.cuda)
        marks.mark("")
        memory = Memory(device)
        seed = augment_seed(self.seed, raw.epoch, self.rank, raw.worker, raw.index)
        probes = [probe(raw.sample(i).numpy().data, raw.exts[i]) for i in range(len(raw))]
        preset = self.transform if isinstance(self.transform, Preset) else None
        # The workers' draws, from a generator of this batch's own: the default one is left alone.
        generator = torch.Generator().manual_seed(seed) if preset is not None else None
        parts: list[torch.Tensor] = []
        kept: list[int] = []
        scope = seeded(seed, restore=True) if preset is None else contextlib.nullcontext()
        with scope:
            for chunk in chunks(probes, self.config.max_decoded_bytes):
                decoded = self._decode_chunk(raw, chunk, probes, ordering, device, memory)
                marks.mark(DECODE)
                images, views = [], []
                for i in chunk:  # in sample order: the generator's draws are the workers'
                    image = decoded.pop(i)
                    if preset is not None and isinstance(image, torch.Tensor):
                        try:  # the preset's shape check: the workers' path refuses the same images
                            views.append(preset.draw(int(image.shape[-2]), int(image.shape[-1]), generator))
                        except ImageShapeError as e:
                            image = CorruptImageError.for_transform(raw.keys[i], raw.shards[i], str(e))
                    if isinstance(image, CorruptImageError):
                        if self.on_corrupt is None:
                            raise image
                        self.on_corrupt(raw.worker, image)
                        continue
                    images.append(image)
                    kept.append(i)
                parts.extend(self._augment(images, views, memory))
                del images, decoded
                memory.free_chunk()
                marks.mark(AUGMENT)
            batch = self._normalize(parts, raw.labels[kept] if kept else raw.labels[:0], device, memory)
            marks.mark(NORMALIZE)
        with self._lock:
            self._timings.append(marks)
            self.stats.batches += 1
            self.stats.images += len(kept)
            # This batch's work at its peak, and the finished batches that may exist meanwhile: the
            # `ahead` in the ring and the one the training loop holds.
            held = (self.config.ahead + 1) * (rounded(batch.images.nbytes) + rounded(batch.labels.nbytes))
            self.stats.peak_bytes = max(self.stats.peak_bytes, memory.peak + held)
            self.stats.bound_bytes = max(self.stats.bound_bytes, self._bound(raw, probes, batch))
        return batch

    def _decode_chunk(
        self,
        raw: RawBatch,
        chunk: Sequence[int],
        probes: Sequence[Probe],
        ordering: Ordering,
        device: torch.device,
        memory: Memory,
    ) -> dict[int, torch.Tensor | CorruptImageError]:
        """Decode samples ``chunk``: what the probe sends to the batched decoder, the rest on the CPU.

        The CPU's share starts first, on a small thread pool, and runs while the batched call does.
        """
        batched = [i for i in chunk if probes[i].batched]
        out: dict[int, torch.Tensor | CorruptImageError] = {}
        pending = {i: self._cpu_pool().submit(decode_sample, raw, i) for i in chunk if not probes[i].batched}
        if batched:
            memory.add(sum(len(raw.sample(i)) for i in batched))  # the decoder's copy of the JPEGs
            for i, image in self._decode_batched(raw, batched, ordering, device).items():
                if image is None:  # refused: the CPU decoder has the last word
                    pending[i] = self._cpu_pool().submit(decode_sample, raw, i)
                else:
                    out[i] = image
                    memory.add(image.nbytes)
        with self._lock:
            self.stats.cpu_fallback += len(pending)
            for i in pending:
                reason = probes[i].reason or "refused"
                self.stats.fallbacks[reason] = self.stats.fallbacks.get(reason, 0) + 1
        for i in sorted(pending):
            result = pending[i].result()
            if isinstance(result, torch.Tensor):
                memory.add(result.nbytes)
                result = result.to(device)
            out[i] = result
        return out

    def _cpu_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="imgshards-cpu-decode")
        return self._pool

    def _decode_batched(
        self, raw: RawBatch, items: Sequence[int], ordering: Ordering, device: torch.device
    ) -> dict[int, torch.Tensor | None]:
        """One call for ``items``; if the decoder refuses it, halves until the refused images are alone.

        An image the decoder refuses maps to ``None`` (the CPU decoder gets it): ``log2(n)`` calls
        for one bad image in ``n``, not ``n``. Only a decode error is one: an out-of-memory or
        device error (:class:`torch.OutOfMemoryError`, :class:`torch.AcceleratorError`) propagates.
        """
        with self._lock:
            self.stats.decode_calls += 1
        try:
            with ordering.decoding():
                images = self.backend([raw.sample(i) for i in items], device)
        except (torch.OutOfMemoryError, torch.AcceleratorError):
            raise
        except (RuntimeError, ValueError, CorruptImageError) as e:
            if len(items) == 1:
                return {items[0]: None}
            half = len(items) // 2
            out = {
                **self._decode_batched(raw, items[:half], ordering, device),
                **self._decode_batched(raw, items[half:], ordering, device),
            }
            if all(image is None for image in out.values()) and not self._warned:
                self._warned = True  # a decoder that refuses everything is broken, not the data
                warnings.warn(
                    f"the batched decoder on {device} refused all {len(items)} images of a call "
                    f"({type(e).__name__}: {e}); they were decoded on the CPU (decoder.stats.fallbacks "
                    "counts them as 'refused')",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return out
        ordering.decoded(images)
        return dict(zip(items, images, strict=True))

    def _augment(self, images: list[torch.Tensor], views: list[View], memory: Memory) -> list[torch.Tensor]:
        """The chunk's images augmented, as ``uint8 [k, 3, size, size]`` parts or ``[3, size, size]`` ones."""
        if not images:
            return []
        if self.batched_augment:
            preset = self.transform
            assert isinstance(preset, Preset)
            limit = max(4 * self.config.max_decoded_bytes, *(canvas_bytes([_shape(i)]) for i in images))
            groups = by_width([_shape(i) for i in images], limit)
            for group in groups:  # one group's canvas (and its border indices) and roi_align output at a time
                rows = sum(_shape(images[i])[0] + 2 for i in group)
                memory.add_transient(canvas_bytes([_shape(images[i]) for i in group]) + 36 * rows)
                memory.add_transient(4 * 3 * preset.size**2 * len(group))
            out = augment_groups(images, views, preset, groups)
            memory.add(out.nbytes, keep=True)
            return [out]
        results = []
        for k, image in enumerate(images):
            if views:
                preset = self.transform
                assert isinstance(preset, Preset)
                result = preset.apply(image, views[k])
            else:
                result = self.transform(image)
            if image.device.type != "cpu":  # the float region and its float resize
                memory.add_transient(4 * image.nbytes + 4 * result.nbytes)
            memory.add(result.nbytes, keep=True)
            results.append(result)
        return results

    def _normalize(
        self, parts: list[torch.Tensor], labels: torch.Tensor, device: torch.device, memory: Memory
    ) -> Batch:
        images = [p for part in parts for p in (part if part.dim() == 4 else part[None])]
        for image in images[1:]:
            if image.shape != images[0].shape or image.dtype != torch.uint8:
                raise ConfigError(
                    f"a batch needs uint8 images of one size, got {tuple(images[0].shape)} and "
                    f"{tuple(image.shape)} ({image.dtype}); use a transform that crops to a fixed size"
                )
        if images:
            stacked = torch.cat([p if p.dim() == 4 else p[None] for p in parts])
        else:
            stacked = torch.empty((0, 3, 0, 0), dtype=torch.uint8, device=device)
        memory.add(stacked.nbytes, keep=True)
        c = self.config
        out = to_device(
            Batch(stacked, labels),
            device,
            mean=c.mean,
            std=c.std,
            channels_last=c.channels_last,
            dtype=c.dtype,
        )
        memory.add(out.images.nbytes + out.labels.nbytes, keep=True)
        return out

    def _bound(self, raw: RawBatch, probes: Sequence[Probe], batch: Batch) -> int:
        """What the design bounds the memory by, for batches like ``batch`` (:func:`.memory.bound`)."""
        shapes = [(p.height, p.width) for p in probes]
        return bound(
            shapes,
            raw_bytes=raw.data.numel(),
            batch=batch,
            max_decoded_bytes=self.config.max_decoded_bytes,
            ahead=self.config.ahead,
            batched=self.batched_augment,
            cuda=self.config.cuda,
        )

    def _collect_timings(self) -> None:
        """Add up the stage times of batches whose work is finished (all of them on the CPU)."""
        with self._lock:
            while self._timings and (not self.config.cuda or self._timings[0].marks[-1][1].query()):
                self._timings.popleft().add_to(self.stats.seconds)

    def settle(self) -> DecoderStats:
        """Wait for the timings of every batch decoded so far and return :attr:`stats`."""
        with self._lock:
            while self._timings:
                self._timings.popleft().add_to(self.stats.seconds)
        return self.stats


def _shape(image: torch.Tensor) -> tuple[int, int]:
    return int(image.shape[-2]), int(image.shape[-1])


# ---- the producer thread ----------------------------------------------------------------------
# A producer thread that fills a bounded ring of ready items, so the consumer's ``next()`` only takes one.
#
# The training process's decoder (above) runs its whole per-batch work (the DataLoader's
# ``next()``, the header probes, the parameter draws, the decode and augment launches, the CPU
# fallbacks) in this thread: the training thread's ``next()`` costs a queue ``get`` while a batch is
# ready. An exception in the producer (an out-of-memory error, a corrupt image with
# ``on_error="raise"``) is raised in the consumer at the position where its item would have come,
# with its own type and traceback.

T = TypeVar("T")
_POLL = 0.1  # seconds between looks at the stop flag while the ring is full


class _End:
    pass


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Producer(Generic[T]):
    """Iterate ``items`` in a thread, at most ``depth`` ready items ahead of the consumer.

    Args:
        items: A callable giving the iterator to run in the thread (so that even ``iter()`` runs there).
        depth: Ready items the ring holds (>= 1); the producer makes one more and waits to put it.
        name: The thread's name.
        setup: Called first in the thread (e.g. ``torch.cuda.set_device``).

    Use as an iterator, and :meth:`close` it (or leave the ``with`` block) when done early: the
    thread stops after the item it is making.

    """

    def __init__(
        self,
        items: Callable[[], Iterable[T]],
        *,
        depth: int,
        name: str = "imgshards-producer",
        setup: Callable[[], None] | None = None,
    ) -> None:
        if depth < 1:
            raise ValueError(f"a producer's ring holds at least one item, got depth={depth}")
        self._ring: queue.Queue[T | _End | _Failed] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, args=(items, setup), name=name, daemon=True)
        self._thread.start()

    def _put(self, item: T | _End | _Failed) -> bool:
        while not self._stop.is_set():
            try:
                self._ring.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, items: Callable[[], Iterable[T]], setup: Callable[[], None] | None) -> None:
        try:
            if setup is not None:
                setup()
            for item in items():
                if not self._put(item):
                    return
        except BaseException as e:  # handed to the consumer, raised there
            self._put(_Failed(e))
            return
        self._put(_End())

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item = self._ring.get()
        if isinstance(item, _End):
            self._done = True
            raise StopIteration
        if isinstance(item, _Failed):
            self._done = True
            raise item.error
        return item

    def close(self, timeout: float = 60.0) -> None:
        """Stop the thread after its current item and wait for it (``timeout`` seconds at most)."""
        self._done = True
        self._stop.set()
        while self._thread.is_alive():
            try:  # empty the ring so a put in progress returns
                while True:
                    self._ring.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=_POLL)
            timeout -= _POLL
            if timeout <= 0:
                break

    def __enter__(self) -> Producer[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
