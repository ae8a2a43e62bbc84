"""Resume states: what fixes an epoch's order, checked when a saved state is loaded.

:class:`~imgshards.loader.ShardLoader` saves ``(epoch, finished legs, batches delivered)`` and
:class:`~imgshards.loader.ShardDataset`, through torchdata's ``Stateful`` protocol, one worker's
part of that; both carry the settings below, and a state made with other settings is refused with
the difference named (world size and worker count may differ for a ``ShardLoader``: see
:mod:`..epoch.elastic`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torch.utils.data import get_worker_info

from imgshards.converter.manifest import ShardInfo

from ..epoch.position import Leg, PassPosition
from ..errors import ConfigError, ResumeError
from .cursor import CORRUPT, FILTERED, LOST, TRUNCATED, UNREADABLE, EpochCursor, SharedControl
from .ranks import settle_ranks

__all__ = [
    "STATE_VERSION",
    "EpochState",
    "ResumeState",
    "check_settings",
    "shards_digest",
]

STATE_VERSION = 3
_READABLE_VERSIONS = (1, 2, 3)
_RECORDED_SINCE_3 = ("split", "shards")


@dataclass(frozen=True)
class ResumeState:
    """A saved place in an epoch: the one encoding of both kinds of state, and its one reading.

    A loader's state (``worker`` ``None``) holds the batches its rank delivered of the current leg;
    a worker's (torchdata's ``Stateful``, ``worker`` set) the batches that worker's pass made. Both
    carry the dataset's :meth:`resume_settings`, checked when the state is read.
    """

    epoch: int
    legs: tuple[Leg, ...]
    batches: int
    world_size: int
    num_workers: int
    worker: int | None = None

    def encode(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """The state as saved: plain ints and lists, then the settings that fix the epoch's order."""
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "stages": [list(leg) for leg in self.legs],  # the finished legs, under their first key
            "batches": self.batches,
            "world_size": self.world_size,
            "num_workers": self.num_workers,
        }
        if self.worker is not None:
            state["worker"] = self.worker
        return {**state, **settings}

    @classmethod
    def decode(cls, state: Any, settings: Mapping[str, Any], what: str) -> ResumeState:
        """Read a saved ``what`` state made with ``settings``.

        Raises:
            ResumeError: not a ``what`` state, an unreadable version, or other settings.

        """
        check_settings(state, settings, what)
        try:
            worker = state.get("worker")
            return cls(
                int(state["epoch"]),
                tuple((int(w), int(n), int(k)) for w, n, k in state.get("stages", [])),
                int(state["batches"]),
                int(state["world_size"]),
                int(state["num_workers"]),
                None if worker is None else int(worker),
            )
        except (KeyError, TypeError, ValueError):
            raise ResumeError(f"not a {what} state: {state!r}") from None


def shards_digest(shards: Iterable[ShardInfo]) -> str:
    """A short digest of a split's shards (names, sample counts, checksums): which data a state is of."""
    h = hashlib.sha256()
    for shard in shards:
        h.update(f"{shard.name}\t{shard.samples}\t{shard.sha256}\n".encode())
    return h.hexdigest()[:16]


def check_settings(state: Mapping[str, Any], mine: Mapping[str, Any], what: str) -> None:
    """Raise :class:`ResumeError` unless ``state`` is a readable ``what`` state with the settings ``mine``."""
    if not isinstance(state, Mapping) or "epoch" not in state or "version" not in state:
        raise ResumeError(f"not a {what} state: {state!r}")
    if state["version"] not in _READABLE_VERSIONS:
        raise ResumeError(
            f"{what} state version {state['version']!r}; this imgshards reads {_READABLE_VERSIONS}"
        )
    # A state saved before a setting was recorded is not checked for it.
    differ = {
        k: (state.get(k), v)
        for k, v in mine.items()
        if state.get(k) != v and (k in state or k not in _RECORDED_SINCE_3)
    }
    if differ:
        detail = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in differ.items())
        raise ResumeError(f"cannot resume: the {what} differs from the saved one ({detail})")


class EpochState:
    """The part of :class:`~imgshards.loader.ShardDataset` that says where its epoch is.

    The epoch, the finished legs and the position live in the dataset's shared control, the one
    record that the loader, the dataset and every worker read; the skip counters live there too.
    ``state_dict`` / ``load_state_dict`` are torchdata's ``Stateful`` protocol for one worker.
    """

    _control: SharedControl
    _progress: PassPosition
    _pending: PassPosition | None
    _asked: tuple[int | None, int | None]  # the rank= and world_size= the dataset was given

    def resume_settings(self) -> dict[str, Any]:
        """The settings that fix the order of this dataset's epochs, but for the topology.

        ``split`` and ``shards`` (:func:`shards_digest`) tell the data itself: a state of another
        split or dataset of the same size would otherwise resume there, skipping samples it never
        delivered.
        """
        raise NotImplementedError

    # ---- the epoch, shared with the workers ---------------------------------------------------

    @property
    def cursor(self) -> EpochCursor:
        """Where the epoch is (the one record, shared with the workers)."""
        return self._control.cursor

    @property
    def epoch(self) -> int:
        """The epoch the next pass reads (or the one being read)."""
        return self._control.cursor.epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass read epoch ``epoch`` from its start; the same as :meth:`ShardLoader.set_epoch`.

        Setting the epoch the next pass reads anyway keeps where it starts: a state just loaded
        (``load_state_dict`` then ``set_epoch`` with the saved epoch, as a loop calling it every
        epoch does) still resumes mid-epoch.
        """
        if epoch < 0:
            raise ConfigError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.cursor.epoch or not self.cursor.fresh():
            self.cursor.seek(epoch, (), 0)

    # ---- the rank, settled as a pass starts (.ranks) -------------------------------------------

    @property
    def rank(self) -> int:
        """The rank of this process, as settled when the current pass started (or now, if none has)."""
        return self._ranks()[0]

    @property
    def world_size(self) -> int:
        """The number of ranks, as settled when the current pass started (or now, if none has)."""
        return self._ranks()[1]

    def settle_ranks(self) -> tuple[int, int]:
        """Settle rank and world size now (:func:`.ranks.settle_ranks`) and record them for the workers.

        The training process calls it as a pass starts and for ``len()``; a worker reads the record.
        """
        ranks = settle_ranks(*self._asked)
        self._control.record_ranks(*ranks)
        return ranks

    def _ranks(self) -> tuple[int, int]:
        return self._control.ranks() or self.settle_ranks()

    def _pass_ranks(self) -> tuple[int, int]:
        """The rank and world size of a pass starting now: settled here in the training process.

        A DataLoader worker reads them as the training process recorded them (it may run in another
        environment: a worker started from a forkserver has no process group), and settles them
        only when the training process has not.
        """
        return self.settle_ranks() if get_worker_info() is None else self._ranks()

    # ---- torchdata's Stateful protocol (one worker's part of an epoch) ------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where this process's pass is: the epoch and the batches it made (torchdata ``Stateful``).

        Called by ``torchdata.stateful_dataloader.StatefulDataLoader`` in each worker after each
        batch; :meth:`load_state_dict` in a new worker continues from there without decoding what
        it skips. With :func:`~imgshards.loader.make_loader`, save ``loader.state_dict()`` instead.
        """
        at = self._progress
        place = ResumeState(at.epoch, at.legs, at.first, self.world_size, at.num_workers, at.worker)
        return place.encode(self.resume_settings())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make this process's next pass continue the pass ``state`` describes (torchdata ``Stateful``).

        Raises:
            ResumeError: ``state`` is not a dataset state, or comes from other settings, world size
                or worker count.

        """
        mine = {**self.resume_settings(), "world_size": self.world_size}
        place = ResumeState.decode(state, mine, "ShardDataset")
        if place.worker is None:
            raise ResumeError("a ShardLoader state goes to loader.load_state_dict, not the dataset's")
        info = get_worker_info()
        num_workers = info.num_workers if info is not None else 1
        if place.num_workers != num_workers:
            raise ResumeError(f"num_workers: saved {place.num_workers!r}, now {num_workers}")
        self._pending = PassPosition(place.epoch, place.legs, place.batches)
        self.cursor.restore(place.epoch, place.legs)

    # ---- counters -------------------------------------------------------------------------------

    @property
    def corrupt_skipped(self) -> int:
        """Images skipped because they did not decode, over all passes so far (all workers)."""
        return self._control.total(CORRUPT)

    @property
    def truncated_shards(self) -> int:
        """Reads of a shard that ended before its index said it would, over all passes so far."""
        return self._control.total(TRUNCATED)

    @property
    def unreadable_shards(self) -> int:
        """Times a remote shard was skipped because it could not be read, over all passes so far."""
        return self._control.total(UNREADABLE)

    @property
    def lost_samples(self) -> int:
        """Planned samples that damaged or unreadable shards did not give, over all passes so far.

        In train mode they were made up by repeating others; in eval mode they are missing.
        """
        return self._control.total(LOST)

    @property
    def filtered_samples(self) -> int:
        """Samples the user's stages dropped, over all passes so far (all workers).

        In train mode the raw stages' drops were made up by repeating kept samples (a batch keeps
        its size); in eval mode they are missing from the pass, as are the image stages' drops.
        """
        return self._control.total(FILTERED)
