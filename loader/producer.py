"""A producer thread that fills a bounded ring of ready items, so the consumer's ``next()`` only takes one.

The training process's decoder (:mod:`.device`) runs its whole per-batch work (the DataLoader's
``next()``, the header probes, the parameter draws, the decode and augment launches, the CPU
fallbacks) in this thread: the training thread's ``next()`` costs a queue ``get`` while a batch is
ready. An exception in the producer (an out-of-memory error, a corrupt image with
``on_error="raise"``) is raised in the consumer at the position where its item would have come,
with its own type and traceback.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

__all__ = ["Producer"]

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
