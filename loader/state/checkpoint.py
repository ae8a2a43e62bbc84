"""Resume states: what fixes an epoch's order, checked when a saved state is loaded.

:class:`~imgshards.loader.ShardLoader` saves ``(epoch, finished legs, batches delivered)`` and
:class:`~imgshards.loader.ShardDataset`, through torchdata's ``Stateful`` protocol, one worker's
part of that; both carry the settings below, and a state made with other settings is refused with
the difference named (world size and worker count may differ for a ``ShardLoader``: see
:mod:`..epoch.elastic`).
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from imgshards.converter.format.manifest import ShardInfo

from ..epoch.position import Leg
from ..errors import ResumeError
from .cursor import MAX_EPOCH, MAX_LEGS

__all__ = [
    "MAX_EPOCH",
    "MAX_WORKERS",
    "MAX_WORLD_SIZE",
    "STATE_VERSION",
    "LegBatches",
    "ResumeState",
    "check_settings",
    "shards_digest",
]

STATE_VERSION = 5
_READABLE_VERSIONS = (1, 2, 3, 4, 5)
# A worker's sample order changed with versions 4 (the shuffle's numbers drawn in blocks) and 5 (the
# interleave picks a block at a time, each stage from a stream of its own: epoch/order.py): an
# older state's epoch is replayed in another order, so it resumes only where an epoch starts.
_SAME_ORDER_SINCE = 5
# The settings a version before STATE_VERSION did not save yet (split and shards: since version 3); a
# state of that version is not checked for them. Every other setting every version saves: a state
# without one was edited, and is refused naming it (a state of dataset A with its shards removed
# would otherwise resume dataset B, skipping samples).
_RECORDED_SINCE = {"split": 3, "shards": 3}

# The bounds a saved state's numbers are checked against before any is used; the epoch's is the
# shared cursor's (MAX_EPOCH, imported from .cursor).
MAX_WORLD_SIZE = 1 << 16  # ranks; the elastic replay of a leg loops over its ranks and workers
MAX_WORKERS = 1 << 10  # DataLoader workers a rank

LegBatches = Callable[[int, tuple[Leg, ...], int], int]
"""``(epoch, finished legs, world size)`` -> the most batches a rank yields in the leg after those legs."""


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
    def decode(
        cls, state: Any, settings: Mapping[str, Any], what: str, leg_batches: LegBatches
    ) -> ResumeState:
        """Read a saved ``what`` state made with ``settings``, every field checked before it is used.

        A saved state is untrusted input (a file anyone may have edited): each number must be an
        integer (not a bool) in its range, and the finished legs must fit the split. ``leg_batches``
        says how many batches a leg of the split has (the dataset's ``batches_in_leg``, its spec's
        :meth:`~..pipeline.spec.Spec.batches_in_leg`): a leg delivered from none to that many, the
        state's batches too.

        Raises:
            ResumeError: not a ``what`` state, an unreadable version, other settings, or a field out of
                range (one line naming the field, its value and the range).

        """
        check_settings(state, settings, what)
        for name in ("batches", "world_size", "num_workers"):
            if name not in state:
                raise ResumeError(f"not a {what} state: it has no {name!r}: {state!r}")
        epoch = _integer(what, "epoch", state["epoch"], 0, MAX_EPOCH)
        world_size = _integer(what, "world_size", state["world_size"], 1, MAX_WORLD_SIZE)
        worker = state.get("worker")
        # A loader without DataLoader workers saves 0; a worker's own state counts itself.
        fewest = 0 if worker is None else 1
        num_workers = _integer(what, "num_workers", state["num_workers"], fewest, MAX_WORKERS)
        if worker is not None:
            worker = _integer(what, "worker", worker, 0, num_workers - 1)
        legs = _legs(what, state.get("stages", []), epoch, leg_batches)
        if legs and state.get("mode") == "eval":
            raise ResumeError(
                f"cannot resume: {what} state field 'stages' is {state['stages']!r}; an eval pass has "
                "no finished legs (it resumes only at its own topology): save the state again"
            )
        most = leg_batches(epoch, legs, world_size)
        batches = _integer(what, "batches", state["batches"], 0, most)
        if state["version"] < _SAME_ORDER_SINCE and (batches or legs):
            raise ResumeError(
                f"cannot resume: this {what} state (version {state['version']}) was saved mid-epoch by an "
                "imgshards whose shuffle order differs, so the rest of its epoch would repeat and skip "
                f"samples; resume it with that version, or start epoch {epoch} over with "
                f"loader.set_epoch({epoch}) (or load a state saved where an epoch starts)"
            )
        return cls(epoch, legs, batches, world_size, num_workers, worker)


def _integer(what: str, name: str, value: Any, low: int, high: int) -> int:
    """``value`` of field ``name`` as an int, if it is an integer (not a bool) from ``low`` to ``high``."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and low <= int(value) <= high:
        return int(value)
    raise ResumeError(
        f"cannot resume: {what} state field {name!r} is {value!r}, not an integer from {low} to {high}; "
        "resume from a state that state_dict() saved"
    )


def _legs(what: str, value: Any, epoch: int, leg_batches: LegBatches) -> tuple[Leg, ...]:
    """The finished legs of a saved state's ``stages``, each checked against the legs before it."""
    if not isinstance(value, Sequence) or isinstance(value, str | bytes) or len(value) > MAX_LEGS:
        raise ResumeError(
            f"cannot resume: {what} state field 'stages' is {value!r}, not a list of at most {MAX_LEGS} "
            "legs; resume from a state that state_dict() saved"
        )
    legs: tuple[Leg, ...] = ()
    for i, leg in enumerate(value):
        name = f"stages[{i}]"
        if not isinstance(leg, Sequence) or isinstance(leg, str | bytes) or len(leg) != 3:
            raise ResumeError(
                f"cannot resume: {what} state field {name!r} is {leg!r}, not [world_size, num_workers, "
                "batches]; resume from a state that state_dict() saved"
            )
        w = _integer(what, f"{name}[0] (world_size)", leg[0], 1, MAX_WORLD_SIZE)
        n = _integer(what, f"{name}[1] (num_workers)", leg[1], 1, MAX_WORKERS)
        # A finished leg delivered no more than the batches it had, after the legs before it.
        k = _integer(what, f"{name}[2] (batches)", leg[2], 0, leg_batches(epoch, legs, w))
        legs = (*legs, (w, n, k))
    return legs


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
    version = state["version"]
    for k in mine:
        if k not in state and version >= _RECORDED_SINCE.get(k, 1):
            raise ResumeError(
                f"cannot resume: this {what} state has no field {k!r}, which every version-{version} state "
                "saves (it was edited, or is not an imgshards state); resume from a state that state_dict() "
                "saved"
            )
    # A state saved before a setting was recorded is not checked for it.
    differ = {k: (state.get(k), v) for k, v in mine.items() if k in state and state[k] != v}
    if differ:
        detail = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in differ.items())
        raise ResumeError(f"cannot resume: the {what} differs from the saved one ({detail})")
