"""How the decoder's work is ordered on a GPU: a decode stream, a work stream, and events.

The rules, and the race each one closes (see pytorch/vision#9606: corrupted pixels on an H100):

1. **The decode stream runs no kernel.** The batched decoder allocates its outputs on the current
   stream but writes them on a stream of its own, which waits for nobody. Blocks freed on the
   current stream by kernels still queued there could be handed to the decoder at once and
   overwritten under them. So decode calls run with a stream of their own current (:meth:`decoding`),
   on which nothing else is launched, and the host waits for it to be idle before each call.
2. **Everything else runs on the work stream**, after an event recorded on the decode stream once a
   call returned (:meth:`decoded`), and each decoded image is marked as used there
   (``record_stream``): when it is freed, the allocator reuses its block only once the work stream
   has passed that point, so a block reaches the decoder again only when nothing reads it.
3. **Batch ``k`` is handed over on its own event** (:meth:`finish` returns it, :meth:`hand_over`
   makes the consumer's stream wait for it, on the device, and marks the batch as used there).
4. **Memory stays bounded**: before decoding batch ``k`` the producer waits, on the host, for batch
   ``k - ahead - 1`` to be finished on the device (:meth:`wait`), so at most ``ahead + 1`` batches of
   work are queued whatever the training loop does.

:class:`HostOrdering` is the same protocol on the CPU, where there is nothing to order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch

__all__ = ["CudaOrdering", "HostOrdering", "Ordering", "ordering_for", "resolve"]


class Ordering(Protocol):
    """The ordering rules of the module docstring, as the decoder calls them."""

    def decoding(self) -> contextlib.AbstractContextManager[None]:
        """Context in which a decode call runs (rule 1)."""
        ...

    def decoded(self, images: Sequence[torch.Tensor]) -> None:
        """After a decode call returned ``images``: order the work stream after it (rule 2)."""
        ...

    def working(self) -> contextlib.AbstractContextManager[None]:
        """Context in which everything but decode calls runs (rule 2)."""
        ...

    def finish(self, index: int) -> Any:
        """Mark the end of batch ``index``'s work; return what :meth:`hand_over` waits on."""
        ...

    def hand_over(self, tensors: Sequence[torch.Tensor], done: Any) -> None:
        """In the consumer's thread: its stream waits for ``done``; ``tensors`` are used there (rule 3)."""
        ...

    def wait(self, done: Any) -> None:
        """On the host, wait until the work that ``done`` marks is finished (rule 4)."""
        ...


class HostOrdering:
    """On the CPU every operation runs when it is called: nothing to order.

    The work runs as in a DataLoader worker, on one torch thread: float reductions (a resize, the
    colour matrix's mean) round differently with another number of threads, and ops this small
    gain little from more threads (on a busy machine they lose much). ``torch.set_num_threads``
    may apply to the whole process: the caller's setting is put back after each batch.
    """

    def decoding(self) -> contextlib.AbstractContextManager[None]:
        """No stream to switch to."""
        return contextlib.nullcontext()

    def decoded(self, images: Sequence[torch.Tensor]) -> None:
        """Nothing to wait for."""

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """Torch on one thread, as in a worker (the caller's setting comes back after)."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def finish(self, index: int) -> Any:
        """Nothing to mark."""
        return index

    def hand_over(self, tensors: Sequence[torch.Tensor], done: Any) -> None:
        """Nothing to wait for."""

    def wait(self, done: Any) -> None:
        """Nothing to wait for."""


class CudaOrdering:
    """The rules on one CUDA device: two streams of the decoder's own, events between them.

    Create it in the thread that runs the decoder's work (the producer); :meth:`hand_over` runs in
    the consumer's thread, on that thread's current stream for the device.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.decode_stream = torch.cuda.Stream(device)  # rule 1: nothing else ever runs on it
        self.work_stream = torch.cuda.Stream(device)

    @contextlib.contextmanager
    def decoding(self) -> Iterator[None]:
        """The decode stream current, once it is idle (it is, unless a decoder launched on it)."""
        self.decode_stream.synchronize()
        with torch.cuda.stream(self.decode_stream):
            yield

    def decoded(self, images: Sequence[torch.Tensor]) -> None:
        """The work stream waits for the decode stream; the images are marked as used on it."""
        event = torch.cuda.Event()
        event.record(self.decode_stream)
        self.work_stream.wait_event(event)
        for image in images:
            if image.device.type == "cuda":
                image.record_stream(self.work_stream)

    def working(self) -> contextlib.AbstractContextManager[None]:
        """The work stream current."""
        return torch.cuda.stream(self.work_stream)

    def finish(self, index: int) -> torch.cuda.Event:
        """An event on the work stream after batch ``index``'s last kernel."""
        event = torch.cuda.Event()
        event.record(self.work_stream)
        return event

    def hand_over(self, tensors: Sequence[torch.Tensor], done: torch.cuda.Event) -> None:
        """The consumer's current stream waits for ``done`` (on the device); the tensors are used there."""
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(done)
        for t in tensors:
            t.record_stream(consumer)

    def wait(self, done: torch.cuda.Event) -> None:
        """The host waits for ``done``."""
        done.synchronize()


def ordering_for(device: torch.device) -> Ordering:
    """The real ordering for ``device``: :class:`CudaOrdering` on a GPU, :class:`HostOrdering` elsewhere."""
    return CudaOrdering(device) if device.type == "cuda" else HostOrdering()


def resolve(device: torch.device) -> torch.device:
    """``"cuda"`` as the calling thread's current device (``torch.cuda.set_device``), else ``device``."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
