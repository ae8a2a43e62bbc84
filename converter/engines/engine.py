"""Where ``pack``'s work runs: the local process pool, or Ray Core tasks across machines.

``pack`` plans on the driver and keeps the plan, the records, the rejects and the index there; an
engine only runs its tasks. An :class:`Engine` offers two things:

* :meth:`Engine.executor`, a :class:`concurrent.futures.Executor` for the scan (listing class
  directories) and the resume checks (hashing finished shards, reading their files again);
* :meth:`Engine.map`, which runs ``fn(task, counter)`` over a stream of shard tasks, a bounded number
  at a time, and yields each task with its result and the node that ran it, in the order they finish.

:class:`PoolEngine` is the local process pool of :mod:`.engines.pool` (with its shared progress counter and
the disk-order gather). The Ray engine lives in :mod:`.engines.rayengine`, imported only when asked for, so
``import imgshards.converter`` never imports Ray.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from typing import Any, Protocol, TypeVar

from ..config import ENGINES
from ..format.errors import EngineError
from .pool import Progress, run_tasks, shared_counter, start_pool, worker_count, worker_state

__all__ = ["ENGINES", "Engine", "PoolEngine", "make_engine"]  # ENGINES: PackConfig.engine's, the config's

T = TypeVar("T")
R = TypeVar("R")


class Engine(Protocol):
    """Runs ``pack``'s tasks. ``gathers``: whether the per-host disk-order gather applies."""

    name: str
    gathers: bool

    def executor(self) -> Executor:
        """An executor for the scan and the resume checks (module-level functions, picklable)."""
        ...

    def map(
        self, fn: Callable[[T, Any], R], tasks: Iterator[T], bar: Progress, *, same_codecs: bool = False
    ) -> Iterator[tuple[T, R, str]]:
        """Run ``fn(task, counter)`` over ``tasks``; yield ``(task, result, node)`` as each finishes.

        ``counter`` is a progress counter for :func:`~.engines.pool.add_progress`, or ``None``.
        ``same_codecs``: the tasks re-encode images, so every node must encode as the driver does.
        """
        ...

    def close(self) -> None:
        """Stop the engine's workers (those it started)."""
        ...


class PoolEngine:
    """The local process pool: ``workers`` forked processes, started at once while the parent is small."""

    name = "pool"
    gathers = True

    def __init__(self, workers: int | None = None) -> None:
        self.workers = worker_count(workers)  # the shards are not planned yet: the machine caps it
        self.counter = shared_counter()
        self.node = socket.gethostname()
        self._pool = start_pool(self.workers, {"counter": self.counter})

    def executor(self) -> Executor:
        """The pool itself."""
        return self._pool

    def map(
        self, fn: Callable[[T, Any], R], tasks: Iterator[T], bar: Progress, *, same_codecs: bool = False
    ) -> Iterator[tuple[T, R, str]]:
        """Run ``fn`` in the pool, a few tasks per worker queued at a time; every node is this host."""
        calls = ((fn, task) for task in tasks)
        for (_, task), result in run_tasks(self._pool, self.workers, _call, calls, self.counter, bar):
            yield task, result, self.node

    def close(self) -> None:
        """Stop the worker processes; tasks not started are dropped."""
        self._pool.shutdown(cancel_futures=True)


def _call(call: tuple[Callable[[Any, Any], R], Any]) -> R:
    fn, task = call
    return fn(task, worker_state().get("counter"))


def make_engine(name: str, *, workers: int | None = None, ray_address: str | None = None) -> Engine:
    """The engine called ``name`` (one of :data:`ENGINES`), started.

    Args:
        name: ``"pool"`` or ``"ray"``.
        workers: Worker processes of the pool (``None``: one per core); unused by Ray.
        ray_address: The Ray cluster to join (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``);
            ``None`` joins the cluster this process is already connected to, or starts a local one.

    Raises:
        ValueError: ``name`` is not an engine, or ``ray_address`` is given to the pool.
        EngineError: Ray is not installed, or no cluster can be joined or started.

    """
    if name == "pool":
        if ray_address is not None:
            raise ValueError("ray_address applies to engine 'ray' only")
        return PoolEngine(workers)
    if name == "ray":
        try:
            from .rayengine import RayEngine  # Ray is imported only here: the converter stays light
        except ModuleNotFoundError as e:
            if e.name != "ray":
                raise
            raise EngineError("engine 'ray' needs Ray: pip install 'imgshards[ray]'") from None
        return RayEngine(ray_address)
    raise ValueError(f"engine must be one of {', '.join(ENGINES)}; got {name!r}")
