"""A dataset's epoch: where it stands, shared with the DataLoader workers, and what its passes lost.

A dataset is two things: a frozen spec of what it reads (:class:`~..pipeline.spec.Spec`), fixed
when it is made, and an :class:`EpochProgress`, what changes as it is read: the epoch cursor and the
skip counters (in the shared :class:`~.cursor.SharedControl`), the ranks it was asked for and those
settled as each pass starts (:mod:`.ranks`), this process's place in its pass (torchdata's
``Stateful`` protocol), and the count of a plain ``DataLoader``'s passes. It asks the spec what it
needs through :class:`EpochSpec`, never the dataset.

It also judges what a pass lost: :meth:`EpochProgress.pass_counts` as a pass begins,
:meth:`EpochProgress.account_pass` as it ends (the warnings about filtered, skipped and lost
samples, then ``max_lost``). A lost sample's count goes from the run that lacks it
(``pipeline/runs.py``) to the shared counters (:mod:`.cursor`) to here, and nowhere else.
"""

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from torch.utils.data import get_worker_info

from imgshards.converter.format.locate import redact_url

from ..epoch import partition
from ..epoch.position import Leg, PassPosition
from ..errors import ConfigError, ResumeError, ShardReadError
from .buffers import BufferPool
from .checkpoint import ResumeState
from .cursor import (
    CORRUPT,
    FILTERED,
    LOST,
    MAX_EPOCH,
    Counters,
    EpochCursor,
    SharedControl,
)
from .ranks import settle_ranks

__all__ = ["EpochProgress", "EpochSpec", "PassCounts", "allowed_lost"]


def allowed_lost(max_lost: float, planned: int) -> int:
    """The samples a pass that planned ``planned`` may lose: ``floor(max_lost x planned)``, exactly.

    ``max_lost`` counts as the decimal it is written as: ``max_lost=0.29`` of 100 samples allows 29,
    where the float product ``0.29 * 100`` is 28.999999999999996.
    """
    return math.floor(Fraction(str(max_lost)) * planned)


class PassCounts(NamedTuple):
    """The loss counters over every worker and pass, as a pass begins (:meth:`EpochProgress.pass_counts`)."""

    filtered: int
    corrupt: int
    lost: int


class EpochSpec(Protocol):
    """What an epoch asks of its dataset's spec (:class:`~..pipeline.spec.Spec` answers it)."""

    @property
    def split(self) -> str:
        """The split read, for messages."""
        ...

    @property
    def mode(self) -> str:
        """``"train"`` (what a pass loses is made up) or ``"eval"``, for messages."""
        ...

    @property
    def max_lost(self) -> float:
        """The share of a rank's planned samples a pass may lose."""
        ...

    def leg_batches(self, epoch: int, legs: tuple[Leg, ...], rank: int, world_size: int) -> int:
        """Batches rank ``rank`` yields in ``epoch``'s leg after ``legs``."""
        ...

    def batches_in_leg(self, epoch: int, legs: tuple[Leg, ...], world_size: int) -> int:
        """The most batches a rank yields in ``epoch``'s leg after ``legs``."""
        ...

    def rank_samples(self, epoch: int, legs: tuple[Leg, ...], rank: int, world_size: int) -> int:
        """Samples rank ``rank``'s pass plans to deliver."""
        ...

    def resume_settings(self) -> dict[str, Any]:
        """The settings that fix the order of the epochs, but for the topology."""
        ...

    def roots(self) -> list[Path | str]:
        """Where the data is, for messages."""
        ...

    def settle(self) -> None:
        """Settle what a pass read (downloads reach the cache), as the pass ends."""
        ...


def _whole_epoch(epoch: object) -> int:
    """``epoch`` as an int, or a one-line ConfigError: a fraction, a flag or a string is no epoch."""
    value: int | None = None
    if isinstance(epoch, float):
        value = int(epoch) if epoch.is_integer() else None
    elif not isinstance(epoch, bool):
        try:
            value = operator.index(epoch)  # type: ignore[arg-type]
        except TypeError:
            value = None
    if value is None or not 0 <= value <= MAX_EPOCH:
        raise ConfigError(
            f"epoch must be a whole number from 0 to {MAX_EPOCH}, got {epoch!r}: pass the epoch's "
            "number as an int (a pass reads a whole epoch; to resume inside one, load a state_dict)"
        )
    return value


class EpochProgress:
    """Where a dataset's epoch is, shared with its DataLoader workers, and what its passes lost.

    The epoch, the finished legs and the position live in the shared control (:mod:`.cursor`), the
    one record that the loader, the dataset and every worker read; the skip counters live there too.
    ``state_dict`` / ``load_state_dict`` are torchdata's ``Stateful`` protocol for one worker.

    Args:
        spec: What the dataset reads (its batch counts, resume settings and roots).
        rank: The ``rank=`` the dataset was given (settled as each pass starts: :mod:`.ranks`).
        world_size: The ``world_size=`` the dataset was given.

    """

    def __init__(self, spec: EpochSpec, rank: int | None, world_size: int | None) -> None:
        self._spec = spec
        self._asked = (rank, world_size)
        # Shared with the DataLoader workers, persistent ones included (they hold a copy of this
        # object made once, at their start): the epoch and the resume point are read from here at
        # the start of every pass, and each worker adds up what it skipped in its own slots.
        self.control = SharedControl()
        self._pool: BufferPool | None = None  # made in each worker process, on its first batch
        # This process's pass, for state_dict() (``first``: the batches made); and a place loaded by
        # load_state_dict() that the next pass of this process starts from.
        self._at = PassPosition()
        self._pending: PassPosition | None = None
        # Set by a ShardLoader: it begins each pass in the training process. Else (a plain DataLoader)
        # the workers settle each pass among themselves; _passes counts this copy's passes for that.
        self.loader_passes = False
        self._passes = 0

    # ---- the epoch, shared with the workers ---------------------------------------------------

    @property
    def cursor(self) -> EpochCursor:
        """Where the epoch is (the one record, shared with the workers)."""
        return self.control.cursor

    @property
    def epoch(self) -> int:
        """The epoch the next pass reads (or the one being read)."""
        return self.control.cursor.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass read epoch ``epoch`` from its start (see the dataset's ``set_epoch``).

        Raises:
            ConfigError: ``epoch`` is not a whole number from 0 to ``MAX_EPOCH`` (an int, a numpy or
                torch integer, or a float with nothing after its point): ``1.5`` is refused, not
                read as epoch 1.

        """
        epoch = _whole_epoch(epoch)
        if epoch != self.cursor.epoch or not self.cursor.fresh():
            self.cursor.seek(epoch, (), 0)

    def leg_batches(self) -> int:
        """Batches this rank yields in the current leg of the epoch (settles the ranks for a pass)."""
        rank, world_size = self.pass_ranks()
        return self._spec.leg_batches(self.epoch, self.cursor.legs, rank, world_size)

    def rank_batches(self) -> int:
        """Batches this rank yields in the current epoch, the legs before a resume included."""
        return sum(k for _, _, k in self.cursor.legs) + self.leg_batches()

    def rank_samples(self) -> int:
        """Samples this rank's pass plans to deliver (what ``max_lost`` is a share of)."""
        rank, world_size = self.ranks()
        return self._spec.rank_samples(self.epoch, self.cursor.legs, rank, world_size)

    # ---- the rank, settled as a pass starts (.ranks) -------------------------------------------

    def settle_ranks(self) -> tuple[int, int]:
        """Settle rank and world size now (:func:`.ranks.settle_ranks`) and record them for the workers.

        The training process calls it as a pass starts and for ``len()``; a worker reads the record.
        """
        ranks = settle_ranks(*self._asked)
        self.control.record_ranks(*ranks)
        return ranks

    def ranks(self) -> tuple[int, int]:
        """The rank and world size settled when the current pass started (or now, if none has)."""
        return self.control.ranks() or self.settle_ranks()

    def pass_ranks(self) -> tuple[int, int]:
        """The rank and world size of a pass starting now: settled here in the training process.

        A DataLoader worker reads them as the training process recorded them (it may run in another
        environment: a worker started from a forkserver has no process group), and settles them
        only when the training process has not.
        """
        return self.settle_ranks() if get_worker_info() is None else self.ranks()

    # ---- a pass ---------------------------------------------------------------------------------

    def begin_pass(self) -> PassPosition:
        """Where this process's pass starts, read when a DataLoader starts it (or a torchdata restore).

        Under a :class:`~imgshards.loader.ShardLoader`, the pass it began (:meth:`.cursor.
        EpochCursor.pass_state`), as the pass began, not as it is now: the main process may have
        moved it on. Under a plain ``DataLoader`` the workers settle the pass among themselves
        (:meth:`.cursor.EpochCursor.plain_pass`): every pass a whole one, the next epoch
        unless ``set_epoch`` said otherwise since the latest pass began.
        """
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        # Settled here in the training process; a worker reads what it recorded.
        rank, world_size = self.pass_ranks()
        if self._pending is not None:  # a torchdata restore: this worker's own place, as saved
            at, self._pending = self._pending, None
            if not self.loader_passes:
                self._plain_pass(info, restored=at.epoch)  # the restored pass is this DataLoader's pass
            at = PassPosition(at.epoch, at.legs, at.first, worker, num_workers, rank, world_size)
        else:
            epoch, legs, resume = self.cursor.pass_state() if self.loader_passes else self._plain_pass(info)
            # DataLoader asks worker 0 first on every pass, but after `resume` batches the next one is
            # worker `resume % num_workers`'s: each process plays the worker whose turn it would be.
            role = partition.resumed_worker(worker, resume, num_workers)
            first = partition.delivered_by_worker(resume, num_workers)[role]
            at = PassPosition(epoch, legs, first, role, num_workers, rank, world_size)
        self._at = at
        return at

    def _plain_pass(
        self, info: Any, restored: int | None = None
    ) -> tuple[int, tuple[tuple[int, int, int], ...], int]:
        """The pass of a plain DataLoader this process starts now (see :meth:`.EpochCursor.plain_pass`)."""
        self._passes += 1
        if info is None:  # the training process: each __iter__ is a pass of its own
            return self.cursor.plain_pass(None, None, restored)
        # One value for every worker of a DataLoader pass: DataLoader's base seed (drawn anew for
        # each iterator; a worker's seed is it plus the worker id) and this copy's passes (persistent
        # workers keep their copy, so it counts their passes; new workers copy the training process's).
        token = hash((info.seed - info.id, self._passes)) & 0xFFFF
        return self.cursor.plain_pass(token, info.id, restored)

    def pool(self) -> BufferPool | None:
        """The batch buffers of this DataLoader worker, in shared memory (made on its first pass).

        ``None`` in the training process.
        """
        info = get_worker_info()
        if info is None:
            return None
        if self._pool is None:
            self._pool = self.control.pool(info.id)
        return self._pool

    def recorded(self, batches: Iterator[Any], at: PassPosition) -> Iterator[Any]:
        """``batches``, with where this process's pass is recorded for :meth:`state_dict` as each goes."""
        for k, batch in enumerate(batches, at.first):  # batch k of the worker's plan
            self._at = at.at(k + 1)
            yield batch
        # A DataLoader worker may exit once its pass is over: its downloads must reach the cache first.
        self._spec.settle()

    def pass_counts(self) -> PassCounts:
        """The counters as a pass begins, for :meth:`account_pass` to tell what that pass lost."""
        return PassCounts(self.total(FILTERED), self.total(CORRUPT), self.total(LOST))

    def account_pass(self, epoch: int, before: PassCounts) -> None:
        """End the pass of ``epoch`` that began at counters ``before``: warn about its losses, judge them.

        One ``RuntimeWarning`` each for the samples the user's stages dropped, the images skipped
        and the planned samples lost to damaged shards in this pass (in that order), then the epoch's
        record moves on (:meth:`.cursor.EpochCursor.finish_epoch`), then :meth:`check_lost`.
        :class:`~imgshards.loader.ShardLoader` calls it as it
        hands over a pass's last batch (or after the pass, if it ended short): the warnings point
        at the line of the training loop that asked for that batch (``stacklevel=3``: here, the
        loader's generator, the loop).

        Raises:
            ShardReadError: the pass lost more than ``max_lost`` allows.

        """
        skipped, lost = self.total(CORRUPT) - before.corrupt, self.total(LOST) - before.lost
        filtered = self.total(FILTERED) - before.filtered
        train = self._spec.mode == "train"
        if filtered:
            how = (
                "the raw stages' drops were made up by repeating kept samples (the image stages' left "
                "their batches smaller), so every rank kept len() batches"
                if train
                else "they are not in this pass"
            )
            warnings.warn(
                f"epoch {epoch}: the dataset's stages dropped {filtered} sample(s) on this rank; {how}; "
                f"{self.total(FILTERED)} so far (dataset.filtered_samples)",
                RuntimeWarning,
                stacklevel=3,
            )
        if skipped:
            warnings.warn(
                f"epoch {epoch}: skipped {skipped} image(s) that do not decode (on_error='skip'); "
                f"{self.total(CORRUPT)} so far",
                RuntimeWarning,
                stacklevel=3,
            )
        if lost:
            how = (
                "made up by repeating others, so every rank kept len() batches"
                if train
                else "missing from this pass: it did not cover the whole split"
            )
            warnings.warn(
                f"epoch {epoch}: {lost} planned sample(s) were lost to truncated or unreadable "
                f"shards, {how}; {self.total(LOST)} so far (imgshards verify names the damaged shards)",
                RuntimeWarning,
                stacklevel=3,
            )
        # Workers that start late (on a busy machine, after the others made the pass's last batches)
        # must still read this epoch: only the record moves on.
        self.cursor.finish_epoch()
        self.check_lost(epoch, lost)  # more lost than max_lost allows: an error, not a short epoch

    def check_lost(self, epoch: int, lost: int) -> None:
        """Raise :class:`ShardReadError` if this rank's pass of ``epoch`` lost more than ``max_lost`` allows.

        ``lost``: the samples the pass's plan held that damaged or unreadable shards did not give.
        :class:`~imgshards.loader.ShardLoader` calls it (through :meth:`account_pass`) as it hands
        over a pass's last batch, or after the pass if it ended short. A pass may lose
        :func:`allowed_lost` samples, a whole number. Each rank judges its own pass, with no
        collective operation: a rank that raises ends a ``torchrun`` or Lightning job (the launcher
        stops the other ranks), where a collective would leave them waiting on it if it never got there.
        """
        planned = self.rank_samples()
        max_lost = self._spec.max_lost
        if lost and (lost > allowed_lost(max_lost, planned) or lost >= planned):
            roots = self._spec.roots()
            verify = " and ".join(f"`imgshards verify {redact_url(str(root))}`" for root in roots)
            raise ShardReadError(
                f"epoch {epoch}: rank {self.ranks()[0]} lost {lost} of its {planned} sample(s) of split "
                f"{self._spec.split!r} at {', '.join(redact_url(str(r)) for r in roots)} to truncated or "
                f"unreadable shards, more than max_lost={max_lost:g} allows: run {verify} to name them "
                "and repack or replace them (or raise max_lost)"
            )

    # ---- torchdata's Stateful protocol (one worker's part of an epoch) ------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where this process's pass is: the epoch and the batches it made (torchdata ``Stateful``)."""
        at = self._at
        place = ResumeState(at.epoch, at.legs, at.first, self.ranks()[1], at.num_workers, at.worker)
        return place.encode(self._spec.resume_settings())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make this process's next pass continue the pass ``state`` describes (torchdata ``Stateful``).

        Raises:
            ResumeError: ``state`` is not a dataset state, or comes from other settings, world size
                or worker count.

        """
        mine = {**self._spec.resume_settings(), "world_size": self.ranks()[1]}
        place = ResumeState.decode(state, mine, "ShardDataset", self._spec.batches_in_leg)
        if place.worker is None:
            raise ResumeError("a ShardLoader state goes to loader.load_state_dict, not the dataset's")
        info = get_worker_info()
        num_workers = info.num_workers if info is not None else 1
        if place.num_workers != num_workers:
            raise ResumeError(f"num_workers: saved {place.num_workers!r}, now {num_workers}")
        self._pending = PassPosition(place.epoch, place.legs, place.batches)
        self.cursor.restore(place.epoch, place.legs)

    # ---- counters -------------------------------------------------------------

    def counters(self, worker: int) -> Counters:
        """The counters of process ``worker``, a handle its pass counts in."""
        return self.control.counters(worker)

    def total(self, what: int) -> int:
        """Counter ``what`` (:data:`.cursor.CORRUPT`, ...) over every worker, over all passes so far."""
        return self.control.total(what)
