"""Batch buffers in shared memory: made without a name in /dev/shm, recycled, and sent as torch sends.

A name in ``/dev/shm`` lives from ``shm_open`` to ``shm_unlink``; a process killed in between leaves
the segment behind until a reboot (1 Ctrl-C in 25 did, ``bench/shm_on_exit.py``). The test here
watches ``/dev/shm`` with inotify through whole epochs of real DataLoader workers: a name never
made is a name never left, on any exit.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pickle
import struct
import sys
from pathlib import Path

import psutil
import pytest
import torch
from torch.utils.data import DataLoader

from imgshards.loader import ShardDataset, make_loader
from imgshards.loader.state.buffers import new_shared, shared_tensor

_IN_CREATE = 0x100
_IN_NONBLOCK = os.O_NONBLOCK

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/dev/shm").is_dir(),
    reason="inotify and /dev/shm are Linux's",
)


class ShmWatch:
    """The names created in /dev/shm while it is open (inotify, IN_CREATE)."""

    def __enter__(self) -> ShmWatch:
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = self._libc.inotify_init1(_IN_NONBLOCK)
        if self._fd < 0 or self._libc.inotify_add_watch(self._fd, b"/dev/shm", _IN_CREATE) < 0:
            pytest.skip(f"inotify on /dev/shm: {os.strerror(ctypes.get_errno())}")
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)

    def created(self) -> list[str]:
        names = []
        try:
            while data := os.read(self._fd, 1 << 16):
                at = 0
                while at < len(data):
                    _wd, _mask, _cookie, size = struct.unpack_from("iIII", data, at)
                    names.append(data[at + 16 : at + 16 + size].rstrip(b"\0").decode())
                    at += 16 + size
        except BlockingIOError:
            pass
        return names


def _children() -> set[int]:
    """The live child processes of this one (its DataLoader workers)."""
    return {p.pid for p in psutil.Process().children()}


def _made_by(names: list[str], pids: set[int]) -> list[str]:
    return [name for name in names if name.startswith("torch_") and int(name.split("_")[1]) in pids]


@linux_only
@pytest.mark.parametrize("decode_on", [None, "cpu"], ids=["batches", "raw-batches"])
def test_two_epochs_of_two_workers_never_name_a_segment_in_dev_shm(packed_few, decode_on):
    before = _children()  # the workers of loaders before this one may live on
    with ShmWatch() as watch:
        dataset = ShardDataset(packed_few, batch_size=4, transform="resnet", decode_on=decode_on)
        loader = make_loader(dataset, num_workers=2)
        kept = [batch for epoch in range(2) for batch in loader]  # held: the pools make one-off buffers too
        workers = _children() - before
        torch.UntypedStorage._new_shared(64)  # the control: torch's own sharing names a segment
        created = watch.created()
    assert len(workers) == 2 and kept
    assert _made_by(created, {os.getpid()}) != [], "the watch saw nothing: it proves nothing"
    assert _made_by(created, workers) == []
    assert len(_made_by(created, {os.getpid()})) == 1  # the control alone: the shared counters named none


def _labels(batches) -> list[int]:
    return sorted(label for _, labels in batches for label in labels.tolist())


@linux_only
def test_a_plain_dataloader_with_spawned_workers_names_no_segment_either(packed_few):
    dataset = ShardDataset(packed_few, batch_size=4, transform="resnet")
    expected = _labels(DataLoader(dataset, batch_size=None))
    before = _children()
    with ShmWatch() as watch:
        batches = iter(DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn"))
        got = [next(batches)]
        workers = _children() - before
        got += list(batches)
        created = watch.created()
    assert len(workers) >= 2 and _labels(got) == expected  # and a resource tracker, spawned
    assert _made_by(created, workers | {os.getpid()}) == []


def test_a_storage_crosses_by_its_descriptor_and_is_the_memory_it_was():
    storage = new_shared(4096)
    assert storage.is_shared() and storage.nbytes() == 4096
    before = storage.data_ptr()
    fd, size = storage._share_fd_cpu_()  # what pickling it for another process asks
    assert (storage.data_ptr(), size) == (before, 4096)  # no copy into a segment of torch's
    assert not os.get_inheritable(fd)  # a program this process runs gets no descriptor of it
    if sys.platform.startswith("linux"):
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:imgshards")


def test_a_shared_tensor_starts_as_zeros_and_an_empty_one_needs_no_memory():
    t = shared_tensor((3, 5), torch.float64)
    assert t.shape == (3, 5) and t.is_contiguous() and t.is_shared() and not t.any()
    empty = shared_tensor((0,), torch.int64)
    assert empty.shape == (0,) and pickle.loads(pickle.dumps(empty)).shape == (0,)


def test_under_the_file_system_strategy_torch_makes_the_buffers_and_batches_still_arrive(packed_few):
    dataset = ShardDataset(packed_few, batch_size=4, transform="resnet")
    expected = _labels(DataLoader(dataset, batch_size=None))
    strategy = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        _manager, handle, _size = new_shared(64)._share_filename_cpu_()  # torch's own: named, by its manager
        assert handle.startswith(b"/torch_") or handle.startswith("/torch_")
        assert _labels(make_loader(dataset, num_workers=2)) == expected
    finally:
        torch.multiprocessing.set_sharing_strategy(strategy)
