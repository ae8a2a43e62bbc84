"""State a :class:`~imgshards.loader.ShardDataset` shares with its DataLoader workers, in shared memory.

A DataLoader worker holds a copy of the dataset made once, when it starts (persistent workers keep
it across epochs), so anything the main process decides later, the epoch, the position in it and
the finished legs of an elastic resume, and anything a worker reports back, its skip counters and
its free batch buffers, lives in one shared ``int64`` tensor laid out as::

    [epoch, start, delivered, leg count, legs (3 each), the pass's epoch, leg count and legs,
     counters (5 per worker slot), flags (8 a slot), rank, world size,
     the latest pass (token, number, epoch), the pass number the record was set at,
     the latest pass each worker slot joined]

The first slots are the one record of the epoch, owned by :class:`EpochCursor` (no other code
writes them): :class:`~imgshards.loader.ShardLoader` moves the dataset's cursor, never a copy of
its own. The workers of a pass read the pass's own copy (:meth:`EpochCursor.begin_pass`,
:meth:`EpochCursor.pass_state`): a worker may start after the main process received the pass's
last batch from the others and moved the record to the next epoch.

Every pass is a whole pass (PyTorch's habit: each ``iter()`` of a DataLoader starts one). A pass
reads the record if it was set since the latest pass began (``set_epoch``, a loaded state, the end
of an epoch: :meth:`EpochCursor.fresh`), else the epoch after the latest pass's: a pass stopped
early (a peek, a ``break``) used its epoch. A :class:`~imgshards.loader.ShardLoader` begins each
pass in the training process (:meth:`EpochCursor.begin_pass`). A plain ``DataLoader`` calls the
dataset's ``__iter__`` in each of its workers, with nothing in the training process to say a pass
begins: its workers settle it among themselves (:meth:`EpochCursor.plain_pass`), so the epoch moves
on once a pass, not once a worker.
"""

from __future__ import annotations

import itertools
import os
import warnings
import weakref
from collections.abc import Callable

import torch

from ..errors import CorruptImageError, ResumeError
from .buffers import BufferPool, forget_buffers, keep_buffer, kept_buffer, shared_tensor

__all__ = [
    "CORRUPT",
    "FILTERED",
    "LOST",
    "MAX_EPOCH",
    "MAX_LEGS",
    "TRUNCATED",
    "UNREADABLE",
    "Counters",
    "EpochCursor",
    "SharedControl",
]

# What a worker counts: an image that did not decode, a shard that ended early, a shard not readable,
# the samples its plan held that no shard gave it (truncated or unreadable), and those a user stage dropped.
CORRUPT, TRUNCATED, UNREADABLE, LOST, FILTERED = 0, 1, 2, 3, 4

MAX_LEGS = 16  # topology changes (elastic resumes) within one epoch
_EPOCH, _RESUME, _DELIVERED, _NLEGS, _LEGS = 0, 1, 2, 3, 4
_PASS = _LEGS + 3 * MAX_LEGS  # the running pass's [epoch, leg count, legs]
_COUNTERS = _PASS + 2 + 3 * MAX_LEGS
_MAX_WORKER_SLOTS = 256
_PER_WORKER = 5
_POOL_BUFFERS = 8
_POOL = _COUNTERS + _PER_WORKER * _MAX_WORKER_SLOTS
_RANKS = _POOL + _POOL_BUFFERS * _MAX_WORKER_SLOTS  # the rank and world size the pass settled
_LATEST = _RANKS + 2  # the latest pass: (token, number, epoch) in one int64, read and written whole
_SET_AT = _LATEST + 1  # the number of the latest pass when the record was last set (seek)
_JOINED = _SET_AT + 1  # per worker slot: the latest pass (as in _LATEST) that worker took part in
# The passes a plain DataLoader's workers began lately, by number modulo _RECENT: each as in _LATEST,
# then its resume point, leg count and legs. A persistent worker that begins pass k late (after a
# quicker one began pass k+1: a peek, then at once another pass) joins pass k from here.
_RECENT = 8
_ENTRY = 3 + 3 * MAX_LEGS
_RING = _JOINED + _MAX_WORKER_SLOTS
_SIZE = _RING + _RECENT * _ENTRY
# _LATEST's fields: a worker's token of its DataLoader pass, the pass number, the pass's epoch.
_TOKEN_BITS, _NUMBER_BITS, _EPOCH_BITS = 16, 16, 31
# The last epoch a pass may read: a pass's record holds the epoch after it too.
MAX_EPOCH = (1 << _EPOCH_BITS) - 2
_CONTROLS = itertools.count()  # names the datasets' buffer pools in a process


class EpochCursor:
    """Where the epoch is: the one record that the loader, the dataset and every worker read.

    Named fields over the shared tensor's first slots, written only through these methods:

    - :meth:`seek`: read ``epoch`` after its finished ``legs``, from batch ``delivered`` on (a resume,
      ``set_epoch``);
    - :meth:`begin_pass`: fix what the pass starting now reads (its workers read :meth:`pass_state`);
      :meth:`plain_pass`: the same, settled by the workers of a plain ``DataLoader``;
    - :meth:`deliver`: the main process handed over one more batch;
    - :meth:`finish_epoch`: the epoch's last batch is out, the record moves to the next epoch while
      late workers still read the running pass's; :meth:`end_pass`: every worker has ended it.
    """

    def __init__(self, t: torch.Tensor) -> None:
        self._t = t

    @property
    def epoch(self) -> int:
        """The epoch the next pass reads (or the one being read)."""
        return int(self._t[_EPOCH])

    @property
    def legs(self) -> tuple[tuple[int, int, int], ...]:
        """The epoch's finished legs ``(world_size, num_workers, batches)`` (see :mod:`..epoch.elastic`)."""
        return self._read_legs(_NLEGS)

    @property
    def delivered(self) -> int:
        """Batches of this rank's current leg delivered so far: where the next pass starts."""
        return int(self._t[_DELIVERED])

    def fresh(self) -> bool:
        """The record was set (:meth:`seek`) since the latest pass began: the next pass reads it as it is."""
        return int(self._t[_SET_AT]) == _number(int(self._t[_LATEST]))

    def seek(self, epoch: int, legs: tuple[tuple[int, int, int], ...], delivered: int) -> None:
        """Make the next pass read ``epoch`` after its finished ``legs``, from batch ``delivered`` on.

        A pass running now is not changed: its workers read the pass's own record (:meth:`pass_state`).
        """
        self._write(epoch, legs, delivered)
        self._t[_SET_AT] = _number(int(self._t[_LATEST]))

    def restore(self, epoch: int, legs: tuple[tuple[int, int, int], ...]) -> None:
        """Read ``epoch`` after ``legs`` (a worker's torchdata restore: its own place is its own)."""
        self._write(epoch, legs, self.delivered)

    def begin_pass(self) -> int:
        """Begin a pass in the training process (a ShardLoader's): fix what its workers read.

        The record as it is if it is :meth:`fresh`, else the next epoch from its start (the latest
        pass, stopped early, used the record's epoch). Workers read it (:meth:`pass_state`) when their
        pass starts, which may be after the main process received the pass's first, or even last,
        batches from other workers; so it changes only between passes, while the record
        (:attr:`epoch`, :attr:`delivered`) moves on. Returns the batches delivered, where the pass starts.
        """
        if not self.fresh():
            self._write(self.epoch + 1, (), 0)
        latest = int(self._t[_LATEST])
        self._fix_pass(self.delivered)
        self._t[_LATEST] = _pack(0, _number(latest) + 1, self.epoch)
        return self.delivered

    def plain_pass(
        self, token: int | None, slot: int | None, restored: int | None = None
    ) -> tuple[int, tuple[tuple[int, int, int], ...], int]:
        """The epoch, legs and resume point of a plain ``DataLoader``'s pass this process starts now.

        A plain DataLoader calls the dataset's ``__iter__`` once a pass in each worker (in the
        training process without workers), and nothing in the training process tells a pass from
        the next; so the first worker of a pass begins it (the record if :meth:`fresh`, else the
        epoch after the latest pass's) and the others join it. ``token`` is the same for every
        worker of one DataLoader pass and almost surely another for the next (from DataLoader's
        base seed and the worker's own count of passes); ``slot`` is the worker's slot, which
        remembers the latest pass it took part in, so a pass it already took part in is never
        joined again. ``None``: the training process, where each call is a pass of its own.
        ``restored``: the epoch of a torchdata restore, which this pass reads.

        Workers of one pass that begin it at the same moment write the same values (each computes
        them from the same latest pass), and the latest pass is one ``int64``, read and written whole.
        A worker looks its token up among the last ``_RECENT`` passes, not only the latest: a
        persistent worker may begin pass k after a quicker one began pass k+1 (a peek, then at once
        another pass), and it joins pass k.
        """
        while True:  # a consistent view: the latest pass, unchanged while the rest is read
            latest = int(self._t[_LATEST])
            fresh = int(self._t[_SET_AT]) == _number(latest)
            if int(self._t[_LATEST]) == latest:
                break
        if token is not None and slot is not None:
            joined = int(self._t[_JOINED + slot % _MAX_WORKER_SLOTS])
            found = self._recent(token % (1 << _TOKEN_BITS), after=joined)
            if found is not None:
                packed, state = found
                self._t[_JOINED + slot % _MAX_WORKER_SLOTS] = packed
                return state
        legs: tuple[tuple[int, int, int], ...] = ()
        if restored is not None:
            epoch, resume = restored, 0
        elif fresh:
            epoch, legs, resume = self.epoch, self.legs, self.delivered
        else:
            epoch, resume = _epoch(latest) + 1, 0
            self._write(epoch, (), 0)  # the record follows: ``dataset.epoch`` is the pass's epoch
        self._t[_PASS] = epoch
        self._t[_PASS + 1] = len(legs)
        if legs:
            self._t[_PASS + 2 : _PASS + 2 + 3 * len(legs)] = torch.tensor([x for leg in legs for x in leg])
        self._t[_RESUME] = resume
        begun = _pack(token or 0, _number(latest) + 1, epoch)
        at = _RING + (_number(begun) % _RECENT) * _ENTRY
        self._t[at + 1] = resume
        self._t[at + 2] = len(legs)
        if legs:
            self._t[at + 3 : at + 3 + 3 * len(legs)] = torch.tensor([x for leg in legs for x in leg])
        self._t[at] = begun  # after its fields: a worker that finds it reads them as written
        self._t[_LATEST] = begun  # last: a worker that sees it reads the pass written above
        if slot is not None:
            self._t[_JOINED + slot % _MAX_WORKER_SLOTS] = begun
        return epoch, legs, resume

    def _recent(
        self, token: int, *, after: int
    ) -> tuple[int, tuple[int, tuple[tuple[int, int, int], ...], int]] | None:
        """The first recent pass of ``token`` begun after the pass ``after`` (packed), with its state."""
        best: tuple[int, int] | None = None  # (how far after ``after``, entry offset)
        for i in range(_RECENT):
            at = _RING + i * _ENTRY
            packed = int(self._t[at])
            if not packed or _token(packed) != token:
                continue
            ahead = (_number(packed) - _number(after)) % (1 << _NUMBER_BITS) if after else 1
            if 0 < ahead < 1 << (_NUMBER_BITS - 1) and (best is None or ahead < best[0]):
                best = (ahead, at)
        if best is None:
            return None
        at = best[1]
        packed = int(self._t[at])
        legs = self._read_legs(at + 2)
        return packed, (_epoch(packed), legs, int(self._t[at + 1]))

    def deliver(self) -> int:
        """Count one more batch handed over (an interrupted pass resumes after it); return the count."""
        self._t[_DELIVERED] += 1
        return self.delivered

    def finish_epoch(self) -> None:
        """The epoch's last batch is handed over: the record moves to the next epoch, the pass's does not."""
        self.seek(self.epoch + 1, (), 0)

    def end_pass(self) -> None:
        """Every worker has ended the pass: the next pass reads the record from its start."""
        self._fix_pass(0)

    def pass_state(self) -> tuple[int, tuple[tuple[int, int, int], ...], int]:
        """The running pass's epoch, finished legs and resume point (batches of its leg it skips)."""
        return int(self._t[_PASS]), self._read_legs(_PASS + 1), int(self._t[_RESUME])

    def _write(self, epoch: int, legs: tuple[tuple[int, int, int], ...], delivered: int) -> None:
        if len(legs) > MAX_LEGS:
            raise ResumeError(f"more than {MAX_LEGS} topology changes within epoch {epoch}")
        self._t[_EPOCH] = epoch
        self._t[_NLEGS] = len(legs)
        if legs:
            self._t[_LEGS : _LEGS + 3 * len(legs)] = torch.tensor([x for leg in legs for x in leg])
        self._t[_DELIVERED] = delivered

    def _fix_pass(self, resume: int) -> None:
        self._t[_PASS] = self._t[_EPOCH]
        self._t[_PASS + 1 : _COUNTERS] = self._t[_NLEGS:_PASS]
        self._t[_RESUME] = resume

    def _read_legs(self, at: int) -> tuple[tuple[int, int, int], ...]:
        flat = self._t[at + 1 : at + 1 + 3 * int(self._t[at])].tolist()
        return tuple((flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3))


def _pack(token: int, number: int, epoch: int) -> int:
    """A pass as one ``int64``: its token, its number (both modulo their width) and its epoch."""
    if not 0 <= epoch < 1 << _EPOCH_BITS:
        raise ResumeError(f"epoch {epoch} is out of range: at most {(1 << _EPOCH_BITS) - 1}")
    token %= 1 << _TOKEN_BITS
    number %= 1 << _NUMBER_BITS
    return (token << (_NUMBER_BITS + _EPOCH_BITS)) | (number << _EPOCH_BITS) | epoch


def _token(packed: int) -> int:
    return packed >> (_NUMBER_BITS + _EPOCH_BITS)


def _number(packed: int) -> int:
    return (packed >> _EPOCH_BITS) & ((1 << _NUMBER_BITS) - 1)


def _epoch(packed: int) -> int:
    return packed & ((1 << _EPOCH_BITS) - 1)


class Counters:
    """The counters of one worker process, a handle a pass counts in (:data:`CORRUPT`, ...)."""

    def __init__(self, control: SharedControl, worker: int) -> None:
        self._control, self._worker = control, worker

    def add(self, what: int, n: int = 1) -> None:
        """Add ``n`` to counter ``what`` of this worker."""
        self._control.count(self._worker, what, n)

    def adder(self, what: int) -> Callable[[int], None]:
        """A function adding its argument to counter ``what``."""
        return lambda n: self.add(what, n)

    def skip(self, e: CorruptImageError, *, stacklevel: int = 3) -> None:
        """Skip a sample that is not usable (on_error="skip"): count it in :data:`CORRUPT` and warn.

        The one skip of the workers' pass (an image that does not decode, a label outside the
        classes) and of the training process's decoder (``decode_on``). The warning gives no advice:
        ``on_error="skip"`` is in force. ``stacklevel`` is ``warnings.warn``'s, counted from here
        (3: the line that called this method's caller).
        """
        self.add(CORRUPT)
        warnings.warn(e.skipped(), RuntimeWarning, stacklevel=stacklevel)


class SharedControl:
    """The epoch cursor, the skip counters and the batch-buffer flags of one dataset, in shared memory."""

    def __init__(self) -> None:
        self._t = shared_tensor((_SIZE,), torch.int64)
        self.cursor = EpochCursor(self._t)
        # The name of this dataset's batch buffers in the main process (made there, pickled to workers).
        self.name = f"{os.getpid()}-{next(_CONTROLS)}"
        # A dataset dropped in the main process unmaps the buffers it kept for its workers.
        weakref.finalize(self, forget_buffers, self.name)

    def counters(self, worker: int) -> Counters:
        """The counters of worker process ``worker``, for its pass to count in."""
        return Counters(self, worker)

    def count(self, worker: int, what: int, n: int = 1) -> None:
        """Add ``n`` to counter ``what`` (:data:`CORRUPT`, ...) of worker process ``worker``."""
        self._t[_COUNTERS + _PER_WORKER * (worker % _MAX_WORKER_SLOTS) + what] += n

    def total(self, what: int) -> int:
        """Counter ``what`` added up over every worker process, over all passes so far."""
        return int(self._t[_COUNTERS + what : _POOL : _PER_WORKER].sum())

    def record_ranks(self, rank: int, world_size: int) -> None:
        """Record the rank and world size the training process settled as a pass starts (:mod:`.ranks`)."""
        self._t[_RANKS : _RANKS + 2] = torch.tensor([rank, world_size])

    def ranks(self) -> tuple[int, int] | None:
        """The rank and world size last recorded, ``None`` before any (a world size is at least 1)."""
        rank, world_size = self._t[_RANKS : _RANKS + 2].tolist()
        return (rank, world_size) if world_size else None

    def pool(self, worker: int) -> BufferPool:
        """The batch-buffer pool of worker process ``worker`` (make one per process, on first use)."""
        first = _POOL + _POOL_BUFFERS * (worker % _MAX_WORKER_SLOTS)
        return BufferPool(self._t[first : first + _POOL_BUFFERS], first_token=first, name=self.name)

    def release(self, token: int, storage: torch.UntypedStorage) -> None:
        """Hand a worker's batch buffer back to it; it stays mapped here for the batch written there next.

        Call it once no tensor of the main process refers to that batch any more.
        """
        assert _POOL <= token < _RANKS, token
        keep_buffer(self.name, token, storage)  # before the flag: the worker may send by name at once
        self._t[token] = 1

    def kept_buffer(self, token: int) -> torch.UntypedStorage | None:
        """The batch buffer ``token`` as the main process keeps it mapped (:meth:`release`), if it does."""
        return kept_buffer(self.name, token)

    def forget_buffers(self) -> None:
        """Unmap the buffers kept for the workers: they exited, new ones send their buffers whole."""
        forget_buffers(self.name)
