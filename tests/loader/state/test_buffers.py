"""A batch buffer in shared memory is made whole, whatever signal comes meanwhile (issue 44).

torch makes a shared storage as a named segment in ``/dev/shm``, maps it and unlinks the name in one
call. A SIGTERM inside it (multiprocessing terminating the DataLoader workers as a training process
ends on Ctrl-C) ended the worker with the name still there: 1 run in 25 of ``bench/shm_on_exit.py``
left a ``torch_*`` segment behind for good. :func:`new_shared` holds such a SIGTERM until the call
returns, then delivers it as it came. Here the SIGTERM is sent from inside the very call that makes
the segment, in a real process: before, the process died there, before the segment was whole.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from imgshards.loader.state.buffers import new_shared

TOLD_TO_END_MEANWHILE = """
import os, signal, sys, torch
from imgshards.loader.state import buffers

real = torch.UntypedStorage._new_shared

def made_while_told_to_end(nbytes):  # the SIGTERM lands inside the call that names, maps and unlinks
    os.kill(os.getpid(), signal.SIGTERM)
    storage = real(nbytes)
    print("made", flush=True)
    return storage

torch.UntypedStorage._new_shared = made_while_told_to_end
if sys.argv[1] == "handler":
    signal.signal(signal.SIGTERM, lambda signum, frame: print("handler", flush=True))
storage = buffers.new_shared(1 << 20)
print("returned", storage.nbytes(), signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, flush=True)
"""


def told(handler: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", TOLD_TO_END_MEANWHILE, handler], capture_output=True, text=True, timeout=120
    )


@pytest.mark.skipif(sys.platform != "linux", reason="POSIX shared memory in /dev/shm")
def test_a_sigterm_while_a_buffer_is_made_ends_the_process_once_it_is_whole():
    before = set(Path("/dev/shm").glob("torch_*"))
    done = told("default")
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout.split() == ["made"]  # made whole, then ended by the SIGTERM as it came
    assert set(Path("/dev/shm").glob("torch_*")) <= before


def test_a_handler_of_the_callers_runs_once_the_buffer_is_made_and_stays():
    done = told("handler")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["made", "handler", "returned", str(1 << 20), "True"]


def test_without_a_signal_nothing_changes():
    handler = signal.getsignal(signal.SIGTERM)
    storage = new_shared(4096)
    assert storage.is_shared() and storage.nbytes() == 4096
    assert signal.getsignal(signal.SIGTERM) is handler
