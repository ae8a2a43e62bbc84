"""How DataLoader workers start: forked, as PyTorch does on Linux, with a hung fork replaced.

A worker forked while another thread holds a lock the child needs can hang inside ``os.fork()`` for
ever (seen in a resumed Lightning DDP rank). These tests run real workers with a real second thread
alive, real hung forks (an at-fork handler that blocks), and real dead workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import webdataset as wds

from imgshards.loader import CorruptImageError, LoaderTimeoutError, ShardDataset, WorkerError, make_loader

IDENTITY = torch.nn.Identity()


@pytest.fixture
def second_thread() -> Iterator[threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="a trainer's thread", daemon=True)
    thread.start()
    yield thread
    stop.set()
    thread.join()


def start_method(loader) -> str | None:
    context = loader.dataloader.multiprocessing_context
    return None if context is None else context.get_start_method()


def stall(samples):
    """A user stage that never yields: its worker is stuck."""
    for _ in samples:
        time.sleep(3600)
        yield from ()


def die(samples):
    """A user stage that ends its worker at once, as a crash would."""
    os._exit(7)
    yield from samples


def run(code: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def test_workers_are_forked_with_one_thread_or_many(packed_many, lookup_many, second_thread):
    # A lambda among the stages: with fork the dataset is never pickled.
    ds = ShardDataset(packed_many, batch_size=8, transform=IDENTITY, raw_stages=[wds.map(lambda s: s)])
    loader = make_loader(ds, num_workers=2)
    keys = lookup_many.run_keys(loader)
    assert start_method(loader) == "fork"
    plain = make_loader(ShardDataset(packed_many, batch_size=8, transform=IDENTITY), num_workers=2,
                        multiprocessing_context="fork")  # fmt: skip
    assert keys == lookup_many.run_keys(plain) and len(keys) == len(loader)
    loader.set_epoch(1)
    assert lookup_many.run_keys(loader) != keys, "the next epoch, through the same persistent workers"


def test_the_callers_start_method_is_kept(packed_many, second_thread):
    ds = ShardDataset(packed_many, batch_size=8, transform=IDENTITY)
    loader = make_loader(ds, num_workers=2, multiprocessing_context="spawn")
    next(iter(loader))
    assert start_method(loader) == "spawn"


# A fork that hangs as the real one did: an at-fork handler in the child waits on a lock that a thread
# of the parent held at the fork (for the first HANGS forks), so the child never runs a line.
HUNG_FORKS = """
import json, os, sys, threading, time, torch
from imgshards.loader import ShardDataset, WorkerError, make_loader

hangs, forks = int(sys.argv[2]), [0]
held = threading.Lock()

def before():
    forks[0] += 1
    if forks[0] <= hangs:
        held.acquire()  # as a thread of the parent holding a lock at the fork

def after_in_parent():
    if held.locked():
        held.release()

os.register_at_fork(before=before, after_in_parent=after_in_parent, after_in_child=lambda: held.acquire())
threading.Thread(target=threading.Event().wait, daemon=True).start()  # a trainer's thread
start = time.monotonic()
try:
    ds = ShardDataset(sys.argv[1], batch_size=8, transform=torch.nn.Identity())
    n = sum(len(b.labels) for b in make_loader(ds, num_workers=2))
    print(json.dumps({"samples": n, "forks": forks[0], "seconds": time.monotonic() - start}))
except WorkerError as e:
    print(json.dumps({"error": str(e), "forks": forks[0], "seconds": time.monotonic() - start}))
"""


def test_a_worker_hung_in_fork_is_forked_again_and_the_epoch_is_whole(packed_many, lookup_many):
    done = run(HUNG_FORKS, packed_many, 1)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    expected = make_loader(ShardDataset(packed_many, batch_size=8, transform=IDENTITY), num_workers=2)
    assert got["samples"] == sum(len(b.labels) for b in expected)
    assert got["forks"] == 3  # the hung one, its replacement, the second worker


def test_a_fork_that_always_hangs_is_an_error_naming_the_way_out(packed_many):
    done = run(HUNG_FORKS, packed_many, 1000)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert "did not start" in got["error"] and "multiprocessing_context='forkserver'" in got["error"]
    assert got["seconds"] < 15


@pytest.mark.parametrize("timeout", [600.0, 0.0])
def test_a_worker_that_dies_at_start_is_an_error_within_seconds(packed_many, second_thread, timeout):
    ds = ShardDataset(packed_many, batch_size=8, transform=IDENTITY, raw_stages=[die])
    loader = make_loader(ds, num_workers=2, timeout=timeout)
    start = time.monotonic()
    says = r"^DataLoader worker \d \(pid \d+\) exited with code 7: .*os\._exit"
    with pytest.raises(WorkerError, match=says):
        next(iter(loader))
    assert time.monotonic() - start < 10


def read_marker(samples):
    """A module-level stage: the worker's environment, read as it runs."""
    for sample in samples:
        assert os.environ.get("IMGSHARDS_TEST_MARKER") == "set late", "the worker has an old environment"
        yield sample


def test_the_environment_of_the_moment_reaches_a_later_loaders_workers(packed_many, second_thread):
    first = make_loader(ShardDataset(packed_many, batch_size=8, transform=IDENTITY), num_workers=2)
    next(iter(first))  # its workers run; this process has their queues' threads too
    assert threading.active_count() > 1
    os.environ["IMGSHARDS_TEST_MARKER"] = "set late"
    try:
        ds = ShardDataset(packed_many, batch_size=8, transform=IDENTITY, raw_stages=[read_marker])
        later = make_loader(ds, num_workers=2)
        assert sum(1 for _ in later) == len(later)
    finally:
        del os.environ["IMGSHARDS_TEST_MARKER"]


def test_a_stuck_worker_raises_after_the_timeout_not_never(packed_many):
    ds = ShardDataset(packed_many, batch_size=8, transform=IDENTITY, raw_stages=[stall])
    loader = make_loader(ds, num_workers=2, timeout=3)
    start = time.monotonic()
    with pytest.raises(LoaderTimeoutError, match=r"no batch came from the 2 DataLoader worker\(s\) in 3 s"):
        next(iter(loader))
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("timeout", [-1, -0.5])
def test_a_negative_timeout_is_refused(packed_many, timeout):
    from imgshards.loader import ConfigError

    with pytest.raises(ConfigError, match="timeout must be >= 0 seconds"):
        make_loader(ShardDataset(packed_many, transform=IDENTITY), num_workers=2, timeout=timeout)


KILLED = """
import json, os, signal, sys, threading, time, torch
from imgshards.loader import ShardDataset, make_loader
threading.Thread(target=threading.Event().wait, daemon=True).start()  # a trainer's thread
context = None if sys.argv[3] == "-" else sys.argv[3]
class SlowStart(ShardDataset):  # worker 1 still starting its pass when the trainer ends
    def __iter__(self):
        if torch.utils.data.get_worker_info().id == 1:
            time.sleep(4)
        return super().__iter__()
dataset = SlowStart if sys.argv[4] == "slow" else ShardDataset
ds = dataset(sys.argv[1], batch_size=8, transform=torch.nn.Identity())
loader = make_loader(ds, num_workers=2, multiprocessing_context=context)
next(iter(loader))
workers = [p.pid for p in loader.dataloader._iterator._workers]
method = loader.dataloader.multiprocessing_context.get_start_method()
print(json.dumps({"method": method, "workers": workers}))
sys.stdout.flush()
os.kill(os.getpid(), getattr(signal, sys.argv[2]))
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _where(pid: int) -> str:
    """A live process's state and the kernel function it waits in, for a failure to name."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return f"{pid} ({state}, waiting in {Path(f'/proc/{pid}/wchan').read_text() or '-'})"
    except OSError:
        return f"{pid} (gone)"


def _kill_trainer(packed: Path, how: str, method: str, start: str, tmp_path: Path) -> None:
    """Run KILLED: a trainer that takes a batch from 2 workers, then ends by ``how``; its workers must end.

    The workers inherit the trainer's stdout: this waits for the trainer's end, not for the pipe's,
    then for the workers'; whatever is left of its process group is killed at the end.
    """
    errors = tmp_path / "stderr"
    with errors.open("w") as stderr:
        trainer = subprocess.Popen(
            [sys.executable, "-c", KILLED, str(packed), how, "-" if method == "fork" else method, start],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )
    try:
        ready, _, _ = select.select([trainer.stdout], [], [], 180)
        assert ready, f"the trainer printed nothing in 180 s: {errors.read_text()[-2000:]}"
        started = json.loads(trainer.stdout.readline())
        assert started["method"] == method and len(started["workers"]) == 2
        assert trainer.wait(timeout=60) == -getattr(signal, how)
        deadline = time.monotonic() + 10
        while any(map(alive, started["workers"])) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [_where(pid) for pid in started["workers"] if alive(pid)]
        assert not left, f"workers left behind after {how}: {', '.join(left)}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
        trainer.stdout.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_workers_end_with_the_training_process(packed_many, how, method, tmp_path):
    # Every worker watches the trainer (make_loader's worker_init_fn): a forkserver's parent is the
    # server, which outlives it, and DataLoader's own watchdog starts late (the next test).
    _kill_trainer(packed_many, how, method, "-", tmp_path)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_still_starting_its_pass_ends_with_the_training_process(packed_many, tmp_path):
    # DataLoader's watchdog takes the worker's parent as its pass starts: by then pid 1, for ever.
    _kill_trainer(packed_many, "SIGKILL", "fork", "slow", tmp_path)


def test_an_error_from_a_worker_reaches_the_loop_as_its_one_line(packed_corrupt):
    def error(num_workers):
        ds = ShardDataset(packed_corrupt, batch_size=4, mode="eval", transform=IDENTITY, on_error="raise")
        with pytest.raises(CorruptImageError) as caught:
            list(make_loader(ds, num_workers=num_workers))
        return str(caught.value)

    # DataLoader wraps a worker's error in "Caught ... Original Traceback ..."; the loop gets the line.
    assert error(2) == error(0) and "\n" not in error(2) and "does not decode" in error(2)


LONG_TMPDIR = """
import sys, torch
from torch.utils.data import DataLoader
from imgshards.loader import ImageFolder, ShardDataset, make_loader
context = None if sys.argv[2] == "-" else sys.argv[2]
ds = ShardDataset(sys.argv[1], batch_size=8, transform=torch.nn.Identity())
loader = make_loader(ds, num_workers=2, multiprocessing_context=context, timeout=60)
assert sum(1 for _ in loader) == len(loader)
plain = DataLoader(ShardDataset(sys.argv[1], batch_size=8, transform=torch.nn.Identity()), batch_size=None,
                   num_workers=2, timeout=60)
assert sum(1 for _ in plain) > 0
folder = ImageFolder(sys.argv[1], split="train", transform=lambda image: torch.zeros(3))
assert sum(1 for _ in DataLoader(folder, batch_size=8, num_workers=2, timeout=60)) > 0
print("whole")
"""


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_workers_deliver_under_a_tmpdir_too_long_for_a_socket_path(packed_many, tmp_path, method):
    # A batch's shared memory goes to the trainer through a Unix socket in multiprocessing's temp dir;
    # under a long TMPDIR (a cluster's scratch, pytest's tmp_path under xdist) its path is too long, the
    # worker's queue thread drops the batch, and the loader waited for ever (in a Jupyter kernel, silently).
    tmpdir = tmp_path / ("scratch-" + "d" * 90)
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    done = subprocess.run(
        [sys.executable, "-c", LONG_TMPDIR, str(packed_many), "-" if method == "fork" else method],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode == 0 and done.stdout.strip() == "whole", done.stderr[-3000:]
    assert "AF_UNIX" not in done.stderr
    assert not list(tmpdir.iterdir()), "a temp dir was left in TMPDIR"
