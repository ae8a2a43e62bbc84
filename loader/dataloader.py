"""``make_loader``: a ``DataLoader`` set up for :class:`ShardDataset`, with epochs and mid-epoch resume.

The resume state is two integers, ``(epoch, batches delivered this epoch)``. Everything else is
recomputed: a worker's share of the epoch and its shuffled sample order are pure functions of the
seed, epoch, rank and worker (:mod:`.partition`, :mod:`.shuffle`), and DataLoader hands out batches
round-robin over its workers, so the delivered count says exactly how many batches each worker made.
On resume each worker replays its raw (undecoded) sample stream, drops what it had delivered, and
goes on: the rest of the epoch is the same batches, in the same order, with the same augmentation.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from typing import Any, cast

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.data import DataLoader

from .batch import Batch, pool_token
from .dataset import ShardDataset
from .device import DeviceDecoder
from .errors import ConfigError, ResumeError

__all__ = ["ShardLoader", "make_loader"]

_STATE_VERSION = 1


def make_loader(
    dataset: ShardDataset,
    *,
    num_workers: int,
    pin_memory: bool = True,
    prefetch_factor: int = 2,
    persistent_workers: bool = True,
    multiprocessing_context: str | None = None,
) -> ShardLoader:
    """Return a :class:`ShardLoader` over ``dataset``.

    Args:
        dataset: What to load; it makes the batches itself, so the DataLoader runs with
            ``batch_size=None``.
        num_workers: Worker processes decoding and augmenting (``0``: in this process).
        pin_memory: Put batches in pinned memory for a fast non-blocking copy to a CUDA device
            (ignored without CUDA).
        prefetch_factor: Batches each worker prepares ahead.
        persistent_workers: Keep the workers between epochs (no start-up cost per epoch);
            :meth:`ShardLoader.set_epoch` reaches them all the same.
        multiprocessing_context: ``"fork"``, ``"spawn"`` or ``"forkserver"``; default the platform's.

    """
    if not isinstance(dataset, ShardDataset):
        raise ConfigError(f"make_loader takes a ShardDataset, got {type(dataset).__name__}")
    if num_workers < 0:
        raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
    if prefetch_factor < 1:
        raise ConfigError(f"prefetch_factor must be >= 1, got {prefetch_factor}")
    workers = num_workers > 0
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        pin_memory=pin_memory and torch.cuda.is_available(),
        prefetch_factor=prefetch_factor if workers else None,
        persistent_workers=persistent_workers and workers,
        multiprocessing_context=multiprocessing_context if workers else None,
        # DataLoader draws a base seed per pass; from its own generator it leaves the caller's
        # torch RNG alone. (The dataset seeds augmentation itself, per batch.)
        generator=torch.Generator().manual_seed(dataset.seed),
    )
    return ShardLoader(dataset, loader)


class ShardLoader:
    """Iterates a :class:`ShardDataset` through a DataLoader; knows its epoch and where it is in it.

    After a full pass the epoch advances by itself; :meth:`set_epoch` sets it (as with
    ``DistributedSampler``: calling it every epoch with the epoch number is fine too).
    ``len(loader)`` is the number of batches a full epoch yields on this rank.

    Resume: save :meth:`state_dict` with the checkpoint; in the new process build the same dataset
    and loader (same world size, workers, batch size, seed), call :meth:`load_state_dict`, iterate.
    In train mode the state is the same on every rank, so rank 0's is enough.
    """

    def __init__(self, dataset: ShardDataset, dataloader: DataLoader[Any]) -> None:
        self.dataset = dataset
        self.dataloader = dataloader
        # With dataset.decode_on the workers send raw batches, decoded here (device.py).
        self.decoder = None if dataset.decode_on is None else DeviceDecoder.of(dataset)
        self._epoch = dataset.epoch
        self._start = 0  # batches to skip at the next pass (set by load_state_dict)
        self._delivered = 0
        # Worker batch buffers handed out, to give back once nothing here refers to them.
        self._lent: list[tuple[StorageWeakRef, int]] = []

    @property
    def num_workers(self) -> int:
        """DataLoader worker processes (0: batches are made in this process)."""
        return self.dataloader.num_workers

    @property
    def epoch(self) -> int:
        """The epoch being read, or the next to read between passes."""
        return self._epoch

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` at the next pass (keeps a pending resume into that same epoch)."""
        if epoch != self._epoch:
            self._start = 0
        self._epoch = epoch
        self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Batch]:
        epoch, start = self._epoch, self._start
        self.dataset.set_epoch(epoch)
        self.dataset._set_resume(start)
        self._start = 0
        self._delivered = start
        corrupt_before = self.dataset.corrupt_skipped
        if not self.dataloader.persistent_workers:
            self._lent.clear()  # new worker processes, new buffers: old tokens must not free them
        batches = cast(Iterable[Batch], self.dataloader)
        if self.decoder is not None:
            batches = self.decoder.stream(self.dataloader)
        for batch in batches:
            self._give_back()
            token = pool_token(batch.images)
            if token is not None:
                self._lent.append((StorageWeakRef(batch.images.untyped_storage()), token))
            self._delivered += 1
            yield batch
        skipped = self.dataset.corrupt_skipped - corrupt_before
        if skipped:
            warnings.warn(
                f"epoch {epoch}: skipped {skipped} image(s) that do not decode (on_error='skip'); "
                f"{self.dataset.corrupt_skipped} so far",
                RuntimeWarning,
                stacklevel=2,
            )
        self._epoch = epoch + 1
        self._delivered = 0
        self.dataset.set_epoch(self._epoch)

    def _give_back(self) -> None:
        """Return to the workers the batch buffers no tensor of this process refers to any more."""
        still = []
        for ref, token in self._lent:
            if ref.expired():
                self.dataset._release(token)
            else:
                still.append((ref, token))
        self._lent = still

    def _fingerprint(self) -> dict[str, Any]:
        ds = self.dataset
        return {
            "samples": ds.num_samples,
            "world_size": ds.world_size,
            "num_workers": self.num_workers,
            "batch_size": ds.batch_size,
            "seed": ds.seed,
            "mode": ds.mode,
            "shuffle": ds.shuffle,
            "shuffle_buffer": ds.shuffle_buffer,
            "shuffle_initial": ds.shuffle_initial,
            "drop_last": ds.drop_last,
        }

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: the epoch, the batches delivered in it, and what fixes the order."""
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "batches": self._delivered,
            **self._fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next pass: the rest of that epoch, in the same order.

        Raises:
            ResumeError: the state comes from a loader with another world size, worker count, batch
                size, seed, split size or shuffle setting, or is not a loader state.

        """
        try:
            version, epoch, batches = state["version"], int(state["epoch"]), int(state["batches"])
        except (KeyError, TypeError, ValueError):
            raise ResumeError(f"not a ShardLoader state: {state!r}") from None
        if version != _STATE_VERSION:
            raise ResumeError(f"loader state version {version!r}; this imgshards reads {_STATE_VERSION}")
        mine = self._fingerprint()
        differ = {k: (state.get(k), v) for k, v in mine.items() if state.get(k) != v}
        if differ:
            detail = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in differ.items())
            raise ResumeError(f"cannot resume exactly: the loader differs from the saved one ({detail})")
        if not 0 <= batches <= len(self):
            raise ResumeError(f"saved state has {batches} batches delivered of an epoch of {len(self)}")
        self._epoch, self._start, self._delivered = epoch, batches, batches
        self.dataset.set_epoch(epoch)
