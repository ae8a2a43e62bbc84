"""pack under a changed tree, a full disk and a dead worker (issue 12, cases 5 and 6)."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import tarfile
import time
from pathlib import Path

import pytest

from imgshards.converter import PackConfig, PackHooks, pack
from imgshards.converter.format.errors import PackError

CONFIG = PackConfig(shard_size=8_000, workers=2)  # ~3 samples a shard: a dozen shards


def outputs(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


def as_if_interrupted(out: Path) -> None:
    """What a pack killed after its last shard and before its index leaves."""
    (out / "index.json").unlink()
    (out / "_info.json").unlink()


def test_a_file_rewritten_in_place_is_found_and_its_shard_packed_again(tree_factory, tmp_path):
    src = tree_factory(classes=4, per_class=10)
    out = tmp_path / "out"
    pack(src, out, CONFIG)
    as_if_interrupted(out)
    with tarfile.open(out / "train-000000.tar") as tar:
        meta = next(m for m in tar if m.name.endswith(".json"))
        victim = src / json.loads(tar.extractfile(meta).read())["path"]  # type: ignore[union-attr]
    data = bytearray(victim.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 40] = bytes(255 - b for b in data[middle : middle + 40])  # same size
    victim.write_bytes(bytes(data))

    again = pack(src, out, CONFIG)
    assert (again.shards_written, again.shards_reused) == (1, len(again.info.shards) - 1)
    fresh = tmp_path / "fresh"
    pack(src, fresh, CONFIG)
    assert outputs(out) == outputs(fresh), "the rerun's output is a fresh pack of the tree as it is now"
    assert pack(src, out, CONFIG).shards_written == 0, "and a rerun of an unchanged tree redoes nothing"


def test_a_full_disk_is_one_line_that_says_how_much_room_and_that_a_rerun_resumes(tiny_tree, tmp_path, tmpfs):
    fresh = pack(tiny_tree, tmp_path / "fresh", CONFIG)
    shards = len(fresh.info.shards)
    out = tmpfs(2 * fresh.info.bytes + (1 << 20))
    written: list[Path] = []

    def fill_after_the_last_shard(path: Path, record: object) -> None:
        written.append(path)
        if len(written) == shards:  # the index, written last, then finds the device full
            tmpfs.fill(out)

    with pytest.raises(PackError) as caught:
        pack(tiny_tree, out, CONFIG, hooks=PackHooks(on_shard=fill_after_the_last_shard))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"no space left on the device of {out}")
    assert "needs about " in message and " MB free now" in message
    assert "run the same command again: it resumes" in message
    assert not (out / "index.json").exists()
    (out / "filler").unlink()
    again = pack(tiny_tree, out, CONFIG)
    assert again.shards_written == 0 and again.shards_reused == len(again.info.shards)
    assert outputs(out) == outputs(tmp_path / "fresh")


def _pool_workers() -> list[int]:
    """This process's children that are forks of it (the pack's workers), not helpers it started."""
    me = Path("/proc/self/cmdline").read_bytes()
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for pid in (task / "children").read_text().split():
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == me:
                    pids.append(int(pid))
            except OSError:
                pass
    return pids


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the workers through /proc")
def test_a_killed_worker_is_one_line_and_a_rerun_resumes(tiny_tree, tmp_path):
    out = tmp_path / "out"
    killed: list[int] = []

    def kill_a_worker(path: Path, record: object) -> None:
        if not killed:
            killed.append(_pool_workers()[0])
            os.kill(killed[0], signal.SIGKILL)  # as the OOM killer would

    with pytest.raises(PackError) as caught:
        pack(tiny_tree, out, PackConfig(shard_size=1, workers=2), hooks=PackHooks(on_shard=kill_a_worker))
    message = str(caught.value)
    assert killed and "\n" not in message and message.startswith("a worker process of `imgshards pack` died")
    assert "run the same command again: it resumes" in message
    again = pack(tiny_tree, out, PackConfig(shard_size=1, workers=2))
    assert again.shards_reused >= 1 and again.shards_written + again.shards_reused == 40
    fresh = tmp_path / "fresh"
    pack(tiny_tree, fresh, PackConfig(shard_size=1, workers=2))
    assert outputs(out) == outputs(fresh)
    shutil.rmtree(fresh)


def test_a_worker_killed_holding_the_progress_lock_blocks_nobody():
    from imgshards.converter.engines.pool import add_progress, progress, shared_counter

    counter = shared_counter()
    ctx = multiprocessing.get_context("fork")
    holder = ctx.Process(target=_hold_forever, args=(counter,))
    holder.start()
    deadline = time.monotonic() + 10
    while progress(counter) != 1 and time.monotonic() < deadline:  # the child holds the lock now
        time.sleep(0.01)
    holder.kill()  # as the OOM killer would, lock held
    holder.join()
    started = time.monotonic()
    add_progress(counter, 5)  # gives up on the dead holder's lock instead of waiting forever
    assert time.monotonic() - started < 5
    assert progress(counter) == 1


def _hold_forever(counter) -> None:
    counter.get_lock().acquire()
    counter.get_obj().value = 1
    time.sleep(600)
