"""Batches in shared memory: the :class:`Batch` a worker makes, the buffers it reuses, how it crosses.

A DataLoader worker stacks each batch into a shared-memory buffer of its :class:`BufferPool`; the
batch crosses to the training process as a :class:`SentBatch` (a file descriptor the first time a
buffer goes, by name once the training process keeps it mapped: :func:`keep_buffer`); the training
process hands a buffer back when no tensor of its own refers to it (:func:`pool_token` tells which).
The flags that say a buffer is free live in the shared control beside the epoch cursor
(:class:`~.cursor.SharedControl`): state the workers and the training process share. The stacking
itself is :mod:`..pipeline.collate`'s.
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

import torch
import torch.multiprocessing

__all__ = [
    "Batch",
    "BufferPool",
    "SentBatch",
    "forget_buffers",
    "keep_buffer",
    "kept_buffer",
    "new_shared",
    "pool_token",
    "shared_tensor",
]


class Batch(NamedTuple):
    """A batch as the loader yields it, so ``for images, labels in loader`` works.

    Attributes:
        images: ``uint8 [B, 3, H, W]``, RGB, channels-last in memory (``NHWC``: the layout the
            decoder and the resize produce, and the one convolutions on GPUs prefer).
            :func:`to_device` gives normalized floats in either layout. A transform of the
            caller's that returns float images (``ToTensor``, ``Normalize``) gives them stacked.
        labels: ``int64 [B]``, class ids as in the index (``ImageFolder``'s).

    """

    images: torch.Tensor
    labels: torch.Tensor


_MEMFD = hasattr(os, "memfd_create")  # Linux; elsewhere torch's shared memory

_TRAILER = 16  # bytes after a pooled batch: (magic, token), two int64
_MAGIC = 0x696D6773_68617264  # "imgshard"

# In the main process: the batch buffers a ShardLoader handed back to their workers, by pool and
# token, kept mapped here. A worker that writes its next batch into one of them sends the batch by
# name (token, shape, labels): no file descriptor, which costs a socket connection to the worker's
# resource sharer per storage (3% of a core in the main process at 1,100 images/s).
_KEPT: dict[str, dict[int, torch.UntypedStorage]] = {}


def keep_buffer(pool: str, token: int, storage: torch.UntypedStorage) -> None:
    """Keep a batch buffer mapped in this (main) process before it is handed back to its worker."""
    _KEPT.setdefault(pool, {})[token] = storage


def kept_buffer(pool: str, token: int) -> torch.UntypedStorage | None:
    """The buffer :func:`keep_buffer` keeps for ``pool``'s ``token``, if any."""
    return _KEPT.get(pool, {}).get(token)


def forget_buffers(pool: str) -> None:
    """Unmap the kept buffers of ``pool`` (its workers exited; new ones send their buffers whole)."""
    _KEPT.pop(pool, None)


class BufferPool:
    """Shared-memory batch buffers that one DataLoader worker reuses once the main process lets go.

    A fresh shared-memory buffer per batch (what ``default_collate`` does) costs ~7% of a worker's
    time here in page faults. So each worker keeps up to ``len(free)`` buffers; ``free`` is its row
    of flags in memory shared with the main process. The worker clears a buffer's flag when it
    fills it; :class:`~imgshards.loader.ShardLoader` sets the flag again once no tensor in the main
    process refers to that batch any more (its storage's use count is back to the one reference the
    loader keeps), so a batch a user keeps is never overwritten. Each buffer ends with a trailer
    ``(magic, token)`` that tells the main process which flag it stands for. With no pooled buffer
    free the worker allocates a one-off buffer, so it never waits: a ``DataLoader`` that is not a
    ``ShardLoader`` just never recycles.

    A buffer handed back is one the main process keeps mapped (:func:`keep_buffer`, under the
    pool's ``name``): the batch written there next is sent by name (:meth:`sendable`), not with a
    new file descriptor. The first batch in a buffer, and a batch in a one-off buffer, carry theirs.
    """

    def __init__(self, free: torch.Tensor, first_token: int, name: str = "") -> None:
        self.free, self.first_token, self.name = free, first_token, name
        self.buffers: list[torch.UntypedStorage] = []
        self._kept: int | None = None  # the token of the buffer just taken, if the main process holds it

    def take(self, nbytes: int) -> torch.UntypedStorage:
        """Return a shared buffer of at least ``nbytes`` (plus the trailer) that nobody else holds."""
        self._kept = None
        for k, buf in enumerate(self.buffers):
            if self.free[k]:
                if buf.nbytes() < _capacity(nbytes):
                    buf = self.buffers[k] = _new_buffer(nbytes, self.first_token + k)
                else:  # handed back: the main process holds it mapped (keep_buffer)
                    self._kept = self.first_token + k
                self.free[k] = 0
                return buf
        if len(self.buffers) < len(self.free):
            k = len(self.buffers)
            self.free[k] = 0
            self.buffers.append(_new_buffer(nbytes, self.first_token + k))
            return self.buffers[k]
        return _new_buffer(nbytes, -1)

    def sendable(self, batch: Batch) -> SentBatch:
        """``batch``, made in the buffer :meth:`take` gave last, as it should travel to the main process.

        A take's buffer serves one batch: a batch made without a take since (an empty one, every
        image of it corrupt) travels whole, never by the name of the buffer the batch before it holds.
        """
        kept, self._kept = self._kept, None
        return SentBatch(batch.images, batch.labels, self.name, kept)


class SentBatch:
    """A worker's batch on its way to the main process, where it unpickles as a :class:`Batch`.

    Labels travel as bytes (a tensor would travel as a file descriptor of its own). Images travel
    as a file descriptor (torch's sharing) the first time a buffer is sent, and by name (the pool,
    the buffer's token, the view's shape and strides) once the main process keeps the buffer.
    """

    __slots__ = ("images", "kept", "labels", "pool")

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, pool: str, kept: int | None) -> None:
        self.images, self.labels, self.pool, self.kept = images, labels, pool, kept

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        labels = self.labels.numpy().tobytes()
        if self.kept is None:
            return _sent_whole, (self.images, labels)
        shape, stride = tuple(self.images.shape), tuple(self.images.stride())
        return _sent_by_name, (self.pool, self.kept, shape, stride, labels)


def _labels(data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(0, dtype=torch.int64, device="cpu")
    return torch.frombuffer(bytearray(data), dtype=torch.int64)


def _sent_whole(images: torch.Tensor, labels: bytes) -> Batch:
    return Batch(images, _labels(labels))


def _sent_by_name(
    pool: str, token: int, shape: tuple[int, ...], stride: tuple[int, ...], labels: bytes
) -> Batch:
    storage = kept_buffer(pool, token)
    if storage is None:  # the worker's promise broken: a bug of this module, never the data's
        raise RuntimeError(f"batch buffer {token} of pool {pool} was sent by name but is not kept here")
    images = torch.empty(0, dtype=torch.uint8, device="cpu").set_(storage, 0, shape, stride)
    return Batch(images, _labels(labels))


def _capacity(nbytes: int) -> int:
    return -(-nbytes // 8) * 8 + _TRAILER


def _trailer(storage: torch.UntypedStorage) -> torch.Tensor:
    # On the storage's own device: the default device (set_default_device) may be another.
    view = torch.empty(0, dtype=torch.int64, device=storage.device)
    return view.set_(storage, storage.nbytes() // 8 - 2, (2,), (1,))


def _new_buffer(nbytes: int, token: int) -> torch.UntypedStorage:
    storage = new_shared(_capacity(nbytes))
    _trailer(storage).copy_(torch.tensor([_MAGIC, token], device="cpu"))
    return storage


def pool_token(images: torch.Tensor) -> int | None:
    """The pool token of a batch's buffer, or ``None`` if it is not a pooled worker buffer.

    Only a CPU tensor can be one: ``is_shared()`` is true of every CUDA storage, whose last bytes
    are no trailer of ours (and reading them would copy from the device).
    """
    if images.device.type != "cpu" or not images.is_shared():
        return None
    storage = images.untyped_storage()
    if storage.nbytes() < _TRAILER or storage.nbytes() % 8:
        return None
    magic, token = _trailer(storage).tolist()
    return token if magic == _MAGIC and token >= 0 else None


def new_shared(nbytes: int) -> torch.UntypedStorage:
    """A CPU storage of ``nbytes`` in shared memory that never has a name in ``/dev/shm``.

    torch's own (``UntypedStorage._new_shared``) creates ``/dev/shm/torch_<pid>_...``, allocates
    its pages and unlinks the name, all in one call (8 ms for a 38 MB batch). A process killed inside
    that call leaves the segment and its memory behind until the next reboot: multiprocessing
    terminates the DataLoader workers that way as a training process ends on Ctrl-C, and 1 run in 25
    left one (``bench/shm_on_exit.py``). So under the ``file_descriptor`` sharing strategy (Linux's
    default) the storage is a memfd: it has no name, and its memory goes with the last process that
    maps it, however that process ends. torch sends it to another process by its descriptor, as it
    does its own. Under ``file_system`` (where torch_shm_manager removes the names) or without
    ``memfd_create``, torch's own.
    """
    if nbytes == 0:  # torch sends an empty storage as such, without shared memory
        return torch.UntypedStorage(0, device="cpu")
    if not _MEMFD or torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        shared: torch.UntypedStorage = torch.UntypedStorage._new_shared(nbytes)
        return shared
    fd = os.memfd_create("imgshards", os.MFD_CLOEXEC)
    storage: torch.UntypedStorage  # from a private constructor of torch's, which its stubs do not list
    try:
        # The pages now, as torch does: memory that is not there fails here, not as a SIGBUS later.
        os.posix_fallocate(fd, 0, nbytes)
        # What torch makes of a descriptor it receives (reductions.rebuild_storage_fd): maps a dup of it.
        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, nbytes)  # type: ignore[attr-defined]
    finally:
        os.close(fd)
    # The storage keeps its dup open, without close-on-exec: a program this process runs gets none.
    os.set_inheritable(storage._share_fd_cpu_()[0], False)
    return storage


def shared_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A contiguous CPU tensor in shared memory made by :func:`new_shared`: zeros, as new pages are."""
    itemsize = torch.empty(0, dtype=dtype, device="cpu").element_size()
    storage = new_shared(math.prod(shape) * itemsize)
    return torch.empty(0, dtype=dtype, device="cpu").set_(storage).view(shape)
