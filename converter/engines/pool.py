"""Worker processes for packing and verifying: started small, and gone when their parent is."""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import resource
import signal
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeVar

from tqdm.auto import tqdm

__all__ = [
    "PER_CORE",
    "Progress",
    "add_progress",
    "default_workers",
    "progress",
    "run_tasks",
    "shared_counter",
    "start_pool",
    "worker_count",
    "worker_state",
]

_state: dict[str, Any] = {}
T = TypeVar("T")
R = TypeVar("R")


def default_workers() -> int:
    """Worker processes to use by default: the cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# Worker processes a core at most. Packing and verifying read and hash (the disk may stall a
# worker), so a second worker a core can keep each busy; more only add processes, each a fork of
# the parent. ``-j 100000`` once forked 100,000 of them for a tree of one shard.
PER_CORE = 2


def worker_count(asked: int | None, work: int | None = None) -> int:
    """How many workers to start: the one cap on ``-j`` for ``pack``, ``verify`` and ``index``.

    ``asked`` (``None``: one per core, :func:`default_workers`), but at most ``work`` (the
    tasks there are, when known: a worker with none is a fork for nothing), at most
    :data:`PER_CORE` per core this process may run on, and at most half the processes the user may
    still start (``RLIMIT_NPROC``), so a large ``-j`` never meets ``fork()`` failing mid-run.
    """
    cores = default_workers()
    most = PER_CORE * cores
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY:
        most = min(most, max(1, soft // 2))
    if work is not None:
        most = min(most, max(1, work))
    return max(1, min(asked or cores, most))


def worker_state() -> dict[str, Any]:
    """Objects handed to every worker at start (shared counters, for instance)."""
    return _state


def _init(state: dict[str, Any]) -> None:
    _state.update(state)
    if sys.platform == "linux":
        # A worker must not outlive a killed parent: it would go on writing into a destination that
        # a re-run is cleaning up. PR_SET_PDEATHSIG = 1.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def _context() -> Any:
    return mp.get_context("fork" if sys.platform == "linux" else "spawn")


def shared_counter() -> Any:
    """An integer counter the workers can add to (hand it to them through ``start_pool``'s state)."""
    return _context().Value("q", 0)


# A worker killed while it holds the counter's lock (the OOM killer, a user's kill -9) must not hang
# the others or the parent: the count only feeds a progress bar, so a worker that cannot get the lock
# soon leaves its count out, and the parent reads the value without the lock (one aligned int64).
_LOCK_WAIT = 1.0


def add_progress(counter: Any, n: int) -> None:
    """Add ``n`` to a :func:`shared_counter` unless its lock stays taken (a dead holder)."""
    lock = counter.get_lock()
    if lock.acquire(timeout=_LOCK_WAIT):
        try:
            counter.get_obj().value += n
        finally:
            lock.release()


def progress(counter: Any) -> int:
    """The value of a :func:`shared_counter`, read without its lock."""
    return int(counter.get_obj().value)


def start_pool(workers: int, state: dict[str, Any] | None = None) -> ProcessPoolExecutor:
    """Start ``workers`` processes now, before the caller grows large, and return the pool.

    On Linux the workers are forked at once, while the parent is still small, so that they do not
    inherit (and count in their RSS) the scan of a million paths made afterwards. Elsewhere they
    are spawned.
    """
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=_context(),
        initializer=_init,
        initargs=(state or {},),
    )
    noop: Callable[[], int] = os.getpid
    pool.submit(noop).result()  # with fork, the first task launches every worker
    return pool


@dataclass(frozen=True)
class Progress:
    """A progress bar of files: its label, its total, and whether to show it."""

    desc: str
    total: int
    enabled: bool


def run_tasks(
    pool: ProcessPoolExecutor,
    workers: int,
    fn: Callable[[T], R],
    tasks: Iterator[T],
    counter: Any,
    bar: Progress,
) -> Iterator[tuple[T, R]]:
    """Run ``fn`` over ``tasks`` in the pool and yield each task with its result as they finish.

    Only a few tasks per worker are queued at a time (each holds its paths). The progress bar shows
    the files the workers count in ``counter``.
    """
    counter.get_obj().value = 0  # no worker is running a task yet
    in_flight: dict[Future[R], T] = {}
    with tqdm(total=bar.total, desc=bar.desc, unit=" img", disable=not bar.enabled, smoothing=0.1) as shown:
        while True:
            for task in tasks:
                in_flight[pool.submit(fn, task)] = task
                if len(in_flight) >= 2 * workers:
                    break
            if not in_flight:
                break
            done, _ = wait(in_flight, timeout=0.25, return_when=FIRST_COMPLETED)
            shown.n = progress(counter)
            shown.refresh()
            for future in done:
                yield in_flight.pop(future), future.result()
