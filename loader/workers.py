"""How DataLoader workers start, and what is said when one dies.

Workers are forked, as PyTorch's own default does on Linux, whatever the process runs: a script
needs no ``if __name__ == "__main__":`` guard, a worker sees the environment of the moment its loader
starts (credentials set after a first loader included), and the dataset reaches it as built, not
pickled. A forkserver or spawn would run the user's script again in every worker (``__mp_main__``),
and a forkserver keeps the environment of the moment it started.

Forking while other threads run has one known failure: a thread that held a lock the child needs at
that moment (an interpreter lock, a library's ``pthread_atfork`` handler) never releases it in the
child, which hangs inside ``os.fork()`` before it runs a line of its own (seen in a resumed Lightning
DDP rank: gloo's threads, a trainer's). :class:`WatchedFork` covers it: each child reports on a pipe
as soon as it runs its first line; one that does not within :data:`READY_SECONDS` is killed and
forked again. It had run nothing, so the new one is exactly the worker the old one would have been.
The check costs the common path one pipe and one read per worker start.

On other platforms (macOS, Windows: no safe fork) the platform's own start method serves, as
PyTorch does; there a script that starts workers needs the ``__main__`` guard.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.popen_fork
import multiprocessing.process
import multiprocessing.util
import os
import select
import shutil
import signal
import sys
import tempfile
from typing import Any

from .errors import WorkerError

__all__ = ["READY_SECONDS", "WatchedFork", "default_context", "socket_safe_tempdir", "worker_died"]

# How long a forked child has to run its first line before it counts as hung in os.fork(). Under
# load it takes milliseconds; a false alarm costs one more fork, never a sample.
READY_SECONDS = 3.0
# Forks of one worker before giving up: a lock that a thread holds for good fails every one.
ATTEMPTS = 3


class _WatchedPopen(multiprocessing.popen_fork.Popen):
    """``fork`` Popen that forks again a child that does not report ready within :data:`READY_SECONDS`."""

    def _launch(self, process_obj: Any) -> None:
        for _ in range(ATTEMPTS):
            ready_r, ready_w = os.pipe()
            process_obj._imgshards_ready_fd = ready_w
            try:
                super()._launch(process_obj)  # type: ignore[misc]
            finally:
                os.close(ready_w)
                del process_obj._imgshards_ready_fd
            try:
                started, _, _ = select.select([ready_r], [], [], READY_SECONDS)
                if started and os.read(ready_r, 1):
                    return
            finally:
                os.close(ready_r)
            self._discard()
        raise WorkerError(
            f"a DataLoader worker did not start: {ATTEMPTS} forks in a row hung before running a line "
            f"({READY_SECONDS:g} s each); a thread of this process holds a lock the child needs. "
            "Pass make_loader(multiprocessing_context='forkserver') and guard the script with "
            "`if __name__ == '__main__':`"
        )

    def _discard(self) -> None:
        """Kill and reap the hung child; close the pipes its launch opened."""
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        if self.finalizer is not None:
            self.finalizer()


class _WatchedProcess(multiprocessing.context.ForkProcess):
    _start_method = "fork"

    @staticmethod
    def _Popen(process_obj: Any) -> _WatchedPopen:
        return _WatchedPopen(process_obj)

    def _bootstrap(self, parent_sentinel: Any = None) -> int:
        # The child's first line after os.fork() and every at-fork handler returned: ready.
        fd = getattr(self, "_imgshards_ready_fd", None)
        if fd is not None:
            os.write(fd, b"1")
            os.close(fd)
        exitcode: int = super()._bootstrap(parent_sentinel)  # type: ignore[misc]  # private: not in typeshed
        return exitcode


class WatchedFork(multiprocessing.context.ForkContext):
    """The ``fork`` start method, with a child that hangs inside ``os.fork()`` forked again."""

    Process = _WatchedProcess


def default_context() -> multiprocessing.context.BaseContext | None:
    """The start of workers when the caller names none: :class:`WatchedFork` on Linux, else the platform's."""
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return WatchedFork()
    return None


# The longest path a Unix socket may have (sun_path, NUL included, on Linux) and the longest name that
# multiprocessing gives one in its temp dir: "/pymp-XXXXXXXX/listener-XXXXXXXX".
_SUN_PATH_MAX = 108
_SOCKET_NAME_MAX = 32


def socket_safe_tempdir() -> None:
    """Give this process's workers a temp dir short enough for a Unix socket's path.

    A worker hands each batch's shared memory over by its descriptor, through a Unix socket that
    multiprocessing makes in its temp dir (``TMPDIR/pymp-*/listener-*``). Under a ``TMPDIR`` of more
    than about 75 characters (a cluster's per-job scratch, pytest's ``tmp_path``) that path is too long:
    the worker's queue thread prints ``OSError: AF_UNIX path too long`` where no one may see it (a
    Jupyter kernel's worker) and drops the batch, and the loader waits for it for ever. As CPython 3.14
    does (gh-132124), multiprocessing's temp dir then goes to the first of ``/tmp``, ``/var/tmp``,
    ``/usr/tmp`` where a socket path fits; it is removed as the process ends, as multiprocessing's
    own is. Forked workers inherit it; others call this as they start. Cheap when nothing is needed.
    """
    config = multiprocessing.process.current_process()._config  # type: ignore[attr-defined]  # private: not in typeshed
    current = config.get("tempdir") or tempfile.gettempdir()
    if len(os.path.abspath(current)) + _SOCKET_NAME_MAX < _SUN_PATH_MAX:
        return
    for base in ("/tmp", "/var/tmp", "/usr/tmp"):
        if os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK):
            tempdir = tempfile.mkdtemp(prefix="pymp-", dir=base)
            multiprocessing.util.Finalize(None, shutil.rmtree, args=(tempdir, True), exitpriority=-100)
            config["tempdir"] = tempdir
            return


# Exit codes and signals a worker ends with, and what most often causes them.
_CAUSES = {
    -signal.SIGKILL: "most often the kernel's out-of-memory killer (`dmesg` says): fewer workers or "
    "a smaller batch_size or prefetch_factor",
    -signal.SIGSEGV: "a crash in native code, or /dev/shm too small for the batches (in Docker: --shm-size)",
    -signal.SIGBUS: "/dev/shm too small for the batches (in Docker: --shm-size), or a crash in native code",
}


def worker_died(workers: list[Any]) -> WorkerError | None:
    """One line on the first of ``workers`` (``multiprocessing.Process``) that has ended, or None."""
    for i, w in enumerate(workers):
        code = w.exitcode
        if code is None:
            continue
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        cause = _CAUSES.get(
            code,
            "a stage or transform ended the process (os._exit, sys.exit) or native code crashed; "
            "the worker's own output above says more",
        )
        return WorkerError(f"DataLoader worker {i} (pid {w.pid}) {how}: {cause}")
    return None
