"""How DataLoader workers start: forked while the process runs one thread, from a forkserver after.

A worker forked while another thread holds an interpreter lock can hang inside ``os.fork()`` for ever
(seen in a resumed Lightning DDP rank). These tests run real workers with a real second thread alive.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import torch
import webdataset as wds

from imgshards.loader import LoaderTimeoutError, ShardDataset, make_loader

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


def test_one_thread_forks_the_workers(packed_many):
    # In a fresh process: this one runs tqdm's monitor thread, started by the packing fixtures.
    code = (
        "import sys, threading, torch\n"
        "from imgshards.loader import ShardDataset, make_loader\n"
        "ds = ShardDataset(sys.argv[1], batch_size=8, transform=torch.nn.Identity())\n"
        "loader, threads = make_loader(ds, num_workers=2), threading.active_count()\n"
        "n = sum(1 for _ in loader)\n"
        "print(threads, loader.dataloader.multiprocessing_context, n == len(loader))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(packed_many)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "None", "True"]


def test_with_another_thread_alive_workers_start_from_a_forkserver_and_give_the_same_batches(
    packed_many, lookup_many, second_thread
):
    def loader():
        return make_loader(ShardDataset(packed_many, batch_size=8, transform=IDENTITY), num_workers=2)

    forked = lookup_many.run_keys(make_loader(ShardDataset(packed_many, batch_size=8, transform=IDENTITY),
                                              num_workers=2, multiprocessing_context="fork"))  # fmt: skip
    served = loader()
    assert lookup_many.run_keys(served) == forked
    assert start_method(served) == "forkserver"
    served.set_epoch(1)
    assert lookup_many.run_keys(served) != forked, "the next epoch, through the same persistent workers"


def test_the_callers_start_method_is_kept(packed_many, second_thread):
    ds = ShardDataset(packed_many, batch_size=8, transform=IDENTITY)
    loader = make_loader(ds, num_workers=2, multiprocessing_context="fork")
    next(iter(loader))
    assert start_method(loader) == "fork"


def test_a_dataset_that_does_not_pickle_is_forked_with_a_warning(packed_many, lookup_many, second_thread):
    ds = ShardDataset(packed_many, batch_size=8, transform=IDENTITY, raw_stages=[wds.map(lambda s: s)])
    loader = make_loader(ds, num_workers=2)
    with pytest.warns(RuntimeWarning, match="the dataset does not pickle .*define the dataset's stages at"):
        keys = lookup_many.run_keys(loader)
    assert start_method(loader) is None and len(keys) == len(loader)


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
import json, os, signal, sys, threading, torch
from imgshards.loader import ShardDataset, make_loader
threading.Thread(target=threading.Event().wait, daemon=True).start()  # a trainer's thread
loader = make_loader(ShardDataset(sys.argv[1], batch_size=8, transform=torch.nn.Identity()), num_workers=2)
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_workers_from_a_forkserver_end_with_the_training_process(packed_many, how):
    done = subprocess.run(
        [sys.executable, "-c", KILLED, str(packed_many), how], capture_output=True, text=True, timeout=180
    )
    started = json.loads(done.stdout)
    assert started["method"] == "forkserver" and len(started["workers"]) == 2
    deadline = time.monotonic() + 10
    while any(map(alive, started["workers"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(alive, started["workers"])), f"workers left behind after {how}"
