"""The Ray engine: ``pack``'s shard tasks as Ray Core tasks across the machines of a Ray cluster.

The driver (the process running ``pack``) scans, plans, and writes the records, rejects and index,
as with the pool; each shard is one task, ``@ray.remote(max_retries=...)``, that reads its files
straight from the tree (the disk-order gather is per host: it does not apply here) and writes its
shard under a temporary name unique to the attempt, then renames it (see :mod:`.write.shard`). A task
retried after its node died, and a straggler from that node still running, both write the same
bytes: whichever rename lands last changes nothing. Only a window of about twice the cluster's CPUs
is in flight at once, so a plan of 100k shards never sits in the object store whole.

Every node must see the tree and the destination at the same paths (a shared file system), and have
the same imgshards installed. With ``--resize`` or a format conversion the bytes written depend on
Pillow's and libjpeg's versions, so each task first checks that its node's match the driver's, and
fails with :class:`~.format.errors.EngineError` naming the node if not.

This module imports Ray; :func:`~.engines.engine.make_engine` imports it only when Ray is asked for.
"""

from __future__ import annotations

import logging
import socket
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

import PIL
import ray
from PIL import features
from tqdm.auto import tqdm

from ..format.errors import EngineError, ImgshardsError, PackError
from .pool import Progress

__all__ = ["RayEngine", "RayExecutor", "codecs", "node_name"]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
# Retries of a task whose worker or node died (an exception raised by the task is not retried: it
# would only be raised again).
MAX_RETRIES = 4


def codecs() -> dict[str, Any]:
    """The versions of the libraries that shape re-encoded bytes on this node."""
    return {
        "pillow": PIL.__version__,
        "libjpeg": features.version("jpg"),
        "libjpeg_turbo": bool(features.check_feature("libjpeg_turbo")),
        "zlib": features.version("zlib"),
    }


def node_name() -> str:
    """The node this runs on, as progress and ``--json`` name it: host name and the start of Ray's node id."""
    return f"{socket.gethostname()}:{ray.get_runtime_context().get_node_id()[:8]}"


def _run(fn: Callable[[T, Any], R], task: T, expected: dict[str, Any] | None) -> tuple[R, str]:
    node = node_name()
    if expected is not None and (found := codecs()) != expected:
        diff = "; ".join(
            f"{k} {found.get(k)!r} (driver {v!r})" for k, v in expected.items() if found.get(k) != v
        )
        raise EngineError(
            f"node {node} re-encodes images with other libraries than the driver: {diff}; the shards would "
            "differ from a run elsewhere. Install the same Pillow (and its libjpeg) on every node"
        )
    return fn(task, None), node


def _call(fn: Callable[..., R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
    return fn(*args, **kwargs)


# Shard tasks spread over the nodes, as Ray Data spreads its reads. By default Ray fills one node
# first and hands a leased worker task after task: a node whose worker started late could write no
# shard at all, and a cluster packed at one node's speed.
_run_remote: Any = ray.remote(max_retries=MAX_RETRIES, scheduling_strategy="SPREAD")(_run)
_call_remote: Any = ray.remote(max_retries=MAX_RETRIES)(_call)


def _unwrapped(e: ray.exceptions.RayError, what: str) -> Exception:
    """The error to raise for a failed task: the task's own for bad input, else a :class:`PackError`."""
    if isinstance(e, ray.exceptions.RayTaskError) and isinstance(e.cause, ImgshardsError | OSError):
        return e.cause  # a user's problem (a full disk, a node's libraries): its one-line message
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return PackError(
        f"{what} failed on the Ray cluster ({type(e).__name__}: {first}); run the same command again: "
        "it resumes from the shards already written"
    )


class RayExecutor(Executor):
    """A :class:`~concurrent.futures.Executor` of Ray tasks; ``map`` keeps a bounded window in flight."""

    def __init__(self, window: int) -> None:
        self.window = window

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        """Run ``fn(*args, **kwargs)`` as a Ray task (one CPU)."""
        future: Future[R] = _call_remote.remote(fn, args, kwargs).future()
        return future

    def map(
        self,
        fn: Callable[..., R],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[R]:
        """Like :meth:`Executor.map` (results in order), ``window`` tasks at a time."""
        pending: deque[Future[R]] = deque()
        try:
            for args in zip(*iterables, strict=False):
                pending.append(self.submit(fn, *args))
                if len(pending) >= self.window:
                    yield self._result(pending.popleft(), fn, timeout)
            while pending:
                yield self._result(pending.popleft(), fn, timeout)
        finally:
            for future in pending:
                future.cancel()

    @staticmethod
    def _result(future: Future[R], fn: Callable[..., R], timeout: float | None) -> R:
        try:
            return future.result(timeout)
        except ray.exceptions.RayError as e:
            raise _unwrapped(e, f"a task ({getattr(fn, '__name__', fn)})") from None


def _check_reachable(address: str | None) -> None:
    """Fail at once on a ``HOST:PORT`` nothing listens on (Ray itself retries it for minutes)."""
    if address is None or address == "auto" or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except (OSError, ValueError) as e:
        raise EngineError(
            f"no Ray cluster answers at {address} ({getattr(e, 'strerror', None) or e}); start one with "
            "`ray start --head` there, or pass the address `ray start` printed"
        ) from None


class RayEngine:
    """Ray Core tasks on the cluster at ``address`` (see :func:`~.engines.engine.make_engine`)."""

    name = "ray"
    gathers = False

    def __init__(self, address: str | None = None) -> None:
        self._owned = not ray.is_initialized()
        if self._owned:
            _check_reachable(address)
            try:
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                where = f"at {address}" if address else "here"
                raise EngineError(
                    f"cannot join or start a Ray cluster {where} ({e}); start one with `ray start --head` "
                    "(then `ray start --address=HEAD:6379` on the other machines), or pass --ray-address"
                ) from None
        cpus = int(ray.cluster_resources().get("CPU", 0))
        if cpus < 1:
            raise EngineError("the Ray cluster has no CPU to run tasks on; add a node with `ray start`")
        self.window = 2 * cpus
        self._executor = RayExecutor(self.window)
        self._in_flight: dict[ray.ObjectRef[tuple[Any, str]], Any] = {}  # a task's (result, node) -> task

    def executor(self) -> Executor:
        """Ray tasks, ``window`` at a time."""
        return self._executor

    def map(
        self, fn: Callable[[T, Any], R], tasks: Iterator[T], bar: Progress, *, same_codecs: bool = False
    ) -> Iterator[tuple[T, R, str]]:
        """Run ``fn(task, None)`` as Ray tasks; yield ``(task, result, node)`` as each finishes.

        The progress bar counts the files of the finished shards (``task.paths``), and shows the
        shards done per node. ``same_codecs``: each task first checks its node's :func:`codecs`.
        """
        expected = codecs() if same_codecs else None
        per_node: Counter[str] = Counter()
        in_flight = self._in_flight
        with tqdm(total=bar.total, desc=bar.desc, unit=" img", disable=not bar.enabled) as shown:
            while True:
                for task in tasks:
                    in_flight[_run_remote.remote(fn, task, expected)] = task
                    if len(in_flight) >= self.window:
                        break
                if not in_flight:
                    break
                done, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.25)
                for ref in done:
                    task = in_flight.pop(ref)
                    try:
                        result, node = ray.get(ref)
                    except ray.exceptions.RayError as e:
                        raise _unwrapped(e, f"shard {getattr(task, 'name', task)}") from None
                    per_node[node] += 1
                    shown.update(len(getattr(task, "paths", ())))
                    shown.set_postfix(dict(sorted(per_node.items())), refresh=False)
                    yield task, result, node
        log.info("shards written per node: %s", dict(sorted(per_node.items())))

    def close(self) -> None:
        """Cancel the tasks still in flight; leave the cluster if this engine joined it."""
        for ref in self._in_flight:
            ray.cancel(ref, force=True)
        self._in_flight.clear()
        if self._owned:
            ray.shutdown()
