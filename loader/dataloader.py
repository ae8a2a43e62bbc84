"""``make_loader``: a ``DataLoader`` set up for :class:`ShardDataset`, with epochs and mid-epoch resume.

The resume state is ``(epoch, batches delivered this epoch)`` (plus, after a resume onto another
topology, the epoch's finished legs: :mod:`.epoch.elastic`). Everything else is recomputed: a worker's
share of the epoch and its shuffled sample order are pure functions of the seed, epoch, rank and worker
(:mod:`.epoch.partition`, :mod:`.epoch.order`), and DataLoader hands out batches
round-robin over its workers, so the delivered count says exactly how many batches each worker made.
On resume each worker replays its raw (undecoded) sample stream, drops what it had delivered, and
goes on: the rest of the epoch is the same batches, in the same order, with the same augmentation.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from imgshards.converter.format.errors import ImgshardsError

from .dataset import PassDataset
from .device.decoding import DeviceDecoder
from .errors import ConfigError, CorruptImageError, LoaderTimeoutError, ResumeError, WorkerError
from .pipeline.offload import DecodeOn
from .remote.cache import end_with
from .state.buffers import Batch, pool_token
from .state.checkpoint import ResumeState
from .workers import default_context, socket_safe_tempdir, worker_died

__all__ = ["ShardLoader", "make_loader"]

# The longest the DataLoader waits for a batch before it checks that its workers live (PyTorch's own
# check interval without a timeout): a dead worker is an error within seconds, not at the timeout.
_LIVENESS_SECONDS = 5.0


def make_loader(
    dataset: PassDataset,
    *,
    num_workers: int,
    pin_memory: bool = True,
    prefetch_factor: int = 2,
    persistent_workers: bool = True,
    multiprocessing_context: str | None = None,
    timeout: float = 600.0,
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
        multiprocessing_context: ``"fork"``, ``"spawn"`` or ``"forkserver"`` (or a context). By
            default workers are forked, as PyTorch does on Linux (no ``__main__`` guard needed; the
            environment of the moment), and a child that hangs inside ``os.fork()`` because another
            thread held a lock is forked again (:mod:`.workers`); elsewhere the platform's default.
        timeout: Seconds to wait for a batch from live workers before raising
            :class:`LoaderTimeoutError` (a worker stuck); ``0``: wait for ever. A worker that dies is
            a :class:`WorkerError` within seconds, whatever this says.

    """
    if not isinstance(dataset, PassDataset):
        raise ConfigError(f"make_loader takes a ShardDataset or a MixedDataset, got {type(dataset).__name__}")
    if num_workers < 0:
        raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
    if prefetch_factor < 1:
        raise ConfigError(f"prefetch_factor must be >= 1, got {prefetch_factor}")
    if timeout < 0:
        raise ConfigError(f"timeout must be >= 0 seconds (0: no timeout), got {timeout}")
    workers = num_workers > 0
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        pin_memory=pin_memory and torch.cuda.is_available(),
        prefetch_factor=prefetch_factor if workers else None,
        persistent_workers=persistent_workers and workers,
        multiprocessing_context=((multiprocessing_context or default_context()) if workers else None),
        # DataLoader checks that its workers live only when a wait for a batch times out: it waits
        # in short rounds, and _timed adds them up to the caller's timeout.
        timeout=min(timeout or _LIVENESS_SECONDS, _LIVENESS_SECONDS) if workers else 0,
        # DataLoader draws a base seed per pass; from its own generator it leaves the caller's
        # torch RNG alone. (The dataset seeds augmentation itself, per batch.)
        generator=torch.Generator().manual_seed(dataset.spec.seed),
    )
    return ShardLoader(dataset, loader, timeout=timeout)


class ShardLoader:
    """Iterates a :class:`ShardDataset` through a DataLoader; the epoch and the position are the dataset's.

    Every ``iter(loader)`` is a whole pass of ``len(loader)`` batches, as with PyTorch's DataLoader,
    and reads the next epoch: a pass that delivered ``len(loader)`` batches completes its epoch as it
    hands over the last one, whether or not the loop asks for more (Lightning,
    ``islice(loader, len(loader))``), and a pass stopped early (a peek, a ``break``) used its epoch
    too. :meth:`set_epoch` (or the dataset's, the same thing) sets the epoch of the next pass, as with
    ``DistributedSampler``; calling it every epoch with the epoch number is fine too. Only
    :meth:`load_state_dict` makes the next pass continue an epoch where a saved one stopped.

    Resume: save :meth:`state_dict` with the checkpoint; in the new process build the same dataset
    and loader (same batch size, seed, shuffle settings), call :meth:`load_state_dict`, iterate. In
    train mode the state is the same on every rank, so rank 0's is enough. The world size and the
    worker count may differ (train mode): the rest of the epoch then delivers each of its samples
    not yet delivered exactly once (see :mod:`.epoch.elastic`).
    """

    def __init__(self, dataset: PassDataset, dataloader: DataLoader[Any], *, timeout: float = 0) -> None:
        self.dataset = dataset
        self.dataloader = dataloader
        self.timeout = timeout  # seconds without a batch from live workers (0: no limit)
        # The dataset's epoch, shared with the workers: this loader begins each pass, moves the cursor
        # as it hands batches over, and accounts for what each pass lost.
        self.progress = dataset.progress
        self.progress.loader_passes = True  # the workers read the pass this loader fixed
        # With decode_on the workers send raw batches, decoded here (device/decoding.py).
        decode_on = dataset.spec.decode_on
        self.decoder = None if decode_on is None else _decoder(dataset, decode_on)
        # Worker batch buffers handed out, to give back once nothing here refers to them: the
        # storage, its token, and the references to it that are not a batch's (see _give_back).
        self._lent: list[tuple[torch.UntypedStorage, int, int]] = []

    @property
    def num_workers(self) -> int:
        """DataLoader worker processes (0: batches are made in this process)."""
        return self.dataloader.num_workers

    @property
    def epoch(self) -> int:
        """The epoch being read, or the next to read once a pass finished it (the dataset's).

        After a pass stopped early it still names that pass's epoch, as :meth:`state_dict` does (a
        checkpoint saved then resumes it); the next ``iter()`` reads the epoch after it.
        """
        return self.progress.epoch

    def __len__(self) -> int:
        return self.progress.rank_batches()

    def set_epoch(self, epoch: int) -> None:
        """Read epoch ``epoch`` at the next pass (keeps a pending resume into that same epoch)."""
        self.progress.set_epoch(epoch)

    def __iter__(self) -> Iterator[Batch]:
        progress, cursor = self.progress, self.progress.cursor
        # What the workers read as their pass starts: a loaded state's place, or an epoch from its start.
        delivered = cursor.begin_pass()
        epoch, total = progress.epoch, progress.leg_batches()  # settles the rank for this pass
        if self.decoder is not None:
            self.decoder.rank = progress.ranks()[0]  # its augment seeds: the rank of this pass
        counts = progress.pass_counts()  # what this pass lost is told and judged against them as it ends
        if not self.dataloader.persistent_workers:
            self._lent.clear()  # new worker processes, new buffers: old tokens must not free them
            progress.control.forget_buffers()
        done = delivered >= total
        if self.num_workers > 0:
            self.dataloader.worker_init_fn = functools.partial(_end_with, os.getpid())
        # Raw batches with decode_on (decoded here), else finished ones.
        source = _timed(self.dataloader, self.timeout, self.num_workers)
        batches: Iterable[Batch] = source if self.decoder is None else self.decoder.stream(source)
        for batch in batches:
            self._give_back()
            # Only the workers' own batches come from their buffer pools; decoded ones never do.
            token = pool_token(batch.images) if self.decoder is None else None
            if token is not None:
                self._lent.append(self._lend(batch.images.untyped_storage(), token))
            delivered = cursor.deliver()  # the one record: an interrupted pass resumes here
            if delivered >= total and not done:
                # Before handing over the last batch: a loop that stops at len(loader) never comes back.
                done = True
                progress.account_pass(epoch, counts)  # warns, moves the record on, judges max_lost
            yield batch
        if not done:  # fewer batches than planned (eval with lost samples) or an empty epoch
            progress.account_pass(epoch, counts)
        cursor.end_pass()  # every worker has ended this pass: the next reads the next epoch

    def _lend(self, storage: torch.UntypedStorage, token: int) -> tuple[torch.UntypedStorage, int, int]:
        # A storage's use count is its references: ours, the kept buffer's if the batch came in a
        # kept buffer (sent by name) and torch gave it another Python object, and every tensor
        # (view, numpy array...) of the batch.
        kept = self.progress.control.kept_buffer(token)
        other = kept is not None and kept is not storage and kept.data_ptr() == storage.data_ptr()
        return storage, token, 2 if other else 1

    def _give_back(self) -> None:
        """Return to the workers the batch buffers no tensor of this process refers to any more."""
        still = []
        for storage, token, own in self._lent:
            if torch._C._storage_Use_Count(storage._cdata) <= own:
                self.progress.control.release(token, storage)
            else:
                still.append((storage, token, own))
        self._lent = still

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: epoch, finished legs, batches delivered, and what fixes the order."""
        cursor, world_size = self.progress.cursor, self.progress.ranks()[1]
        place = ResumeState(cursor.epoch, cursor.legs, cursor.delivered, world_size, self.num_workers)
        return place.encode(self.dataset.spec.resume_settings())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next pass: the rest of that epoch.

        With the saved world size and worker count, the rest is the same batches in the same order.
        With others (train mode), it is every sample of the epoch not yet delivered, exactly once,
        in equal batch counts on every rank (see :mod:`.epoch.elastic`).

        Raises:
            ResumeError: the state comes from a loader with another batch size, seed, split size or
                shuffle setting (or another topology in eval mode), or is not a loader state.

        """
        spec, progress = self.dataset.spec, self.progress
        place = ResumeState.decode(state, spec.resume_settings(), "ShardLoader", spec.batches_in_leg)
        legs, batches = place.legs, place.batches
        # 0 workers is one worker in this process: the same plan as 1.
        topology = (place.world_size, max(place.num_workers, 1))
        world_size = progress.ranks()[1]
        if topology != (world_size, max(self.num_workers, 1)) and batches:
            if not spec.train:
                w, n = topology
                raise ResumeError(
                    f"an eval pass resumes only at the saved topology: world_size: saved {w}, now "
                    f"{world_size}; num_workers: saved {n}, now {self.num_workers}"
                )
            legs, batches = (*legs, (*topology, batches)), 0
        progress.cursor.seek(place.epoch, legs, 0)
        if not 0 <= batches <= progress.leg_batches():
            raise ResumeError(f"saved state has {batches} batches delivered of an epoch of {len(self)}")
        progress.cursor.seek(place.epoch, legs, batches)


def _decoder(dataset: PassDataset, decode_on: DecodeOn) -> DeviceDecoder:
    """The decoder for ``dataset``'s settings; skipped images count in ``dataset.corrupt_skipped``."""

    def on_corrupt(worker: int, e: CorruptImageError) -> None:
        # The workers' skip (count, warn), its warning one frame further out as this one adds a frame.
        dataset.progress.counters(worker).skip(e, stacklevel=4)

    spec = dataset.spec
    return DeviceDecoder(
        decode_on,
        transform=spec.transform,
        seed=spec.seed,
        rank=dataset.rank,
        on_corrupt=None if spec.on_error == "raise" else on_corrupt,
    )


def _timed(loader: DataLoader[Any], timeout: float, workers: int) -> Iterator[Any]:
    """``loader``'s batches; ``timeout`` seconds without one is :class:`LoaderTimeoutError`.

    The DataLoader waits in rounds of at most :data:`_LIVENESS_SECONDS` and checks after each that
    its workers live; a round that ends empty is added up here. A dead worker is a
    :class:`WorkerError` naming it, its exit code or signal, and the likely cause.
    """
    it = iter(loader)
    waited = 0.0
    while True:
        start = time.monotonic()
        try:
            batch = next(it)
        except StopIteration:
            return
        except ImgshardsError as e:
            # DataLoader re-raises a worker's error as "Caught X in DataLoader worker process N.
            # Original Traceback: ..." with the worker's traceback; imgshards' errors are one line
            # naming the shard, the cause and the fix, and that line is what the loop gets.
            raise _own_line(e) from None
        except RuntimeError as e:
            message = str(e)
            if message.startswith("DataLoader worker"):  # "... exited unexpectedly", "... is killed by"
                died = worker_died(getattr(it, "_workers", []))
                raise (died or WorkerError(message)) from None
            # DataLoader raises a plain RuntimeError("DataLoader timed out after N seconds").
            if not message.startswith("DataLoader timed out"):
                raise
            waited += time.monotonic() - start
            if timeout and waited >= timeout:
                raise LoaderTimeoutError(
                    f"no batch came from the {workers} DataLoader worker(s) in {timeout:g} s: a worker "
                    "is stuck; make_loader(timeout=...) sets the wait (0: none)"
                ) from None
            continue
        waited = 0.0
        yield batch


def _own_line(error: ImgshardsError) -> ImgshardsError:
    """``error`` as its worker raised it: its own last line, without DataLoader's wrapping."""
    message = str(error)
    if not message.startswith("Caught ") or "\nOriginal Traceback" not in message:
        return error
    last = message.rstrip().rsplit("\n", 1)[-1]  # "imgshards.loader.errors.X: the line"
    name, _, line = last.partition(": ")
    if name.rsplit(".", 1)[-1] != type(error).__name__ or not line:
        return error
    try:
        return type(error)(line)
    except TypeError:  # a subclass built otherwise: keep DataLoader's message
        return error


def _end_with(owner: int, worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: end this worker when process ``owner``, which started it, ends.

    DataLoader's own watchdog is not enough. It notices only the death of the worker's parent, and the
    parent of a worker started from a forkserver is the server, which lives on as long as any of its
    workers does. And it takes the parent to watch from the worker's first pass on: a forked worker
    whose training process was killed (SIGKILL, SIGTERM, ``os._exit``) while the worker was still
    starting its pass (under load, with a first batch already from another worker) took pid 1 for
    its parent and waited for work for ever, holding the trainer's pipes (1 run of the workers test
    in many). So every worker watches its owner from here (:func:`~.remote.cache.end_with`: a
    thread waiting on a pidfd), which also ends one killed while it waits on the network.
    """
    del worker_id
    end_with(owner)
    socket_safe_tempdir()  # a spawned or forkserver worker: its own (a forked one has its parent's)
