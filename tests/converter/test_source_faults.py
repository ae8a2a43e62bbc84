"""Faults of the source tree and the destination's disk at pack time (issue 21, case 5).

Each builds its hostile input: a file that grows without end while read, a 6 GB sparse file under
a memory limit, a read-only destination, an empty class directory named with terminal escape
codes, a class directory nobody may list.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from imgshards.cli.main import cli
from imgshards.converter import Check, PackConfig, Reason, SourceError, pack, scan_tree
from imgshards.converter.format.errors import PackError, shown
from imgshards.converter.plan.tasks import ShardTask
from imgshards.converter.scan.sourcefiles import read_bound, read_file
from imgshards.converter.scan.tree import PathTable
from imgshards.converter.write.shard import GatherTask, gather, write_shard

ESC = "\x1b[31mred\x1b[0m"


def jpeg() -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 90, dtype=np.uint8)).save(out, format="JPEG")
    return out.getvalue()


def tree(root: Path, classes: dict[str, int]) -> Path:
    for name, count in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            (root / name / f"{i}.jpg").write_bytes(jpeg())
    return root


def test_a_file_that_grew_past_the_bound_is_rejected_not_read_to_its_end(tmp_path):
    path = tmp_path / "grown.jpg"
    path.write_bytes(jpeg() + bytes(3 << 20))  # the scan saw the JPEG alone
    result = read_file(str(path), len(jpeg()))
    assert isinstance(result, OSError) and result.errno is not None and result.errno < 0
    assert (
        result.strerror
        == f"grew past {read_bound(len(jpeg())):,} bytes while being packed ({len(jpeg()):,} at the scan)"
    )
    path.write_bytes(jpeg() + b"tail")  # within the margin: read whole
    assert read_file(str(path), len(jpeg())) == jpeg() + b"tail"
    path.write_bytes(jpeg()[:100])  # shrunk: what is there
    assert read_file(str(path), len(jpeg())) == jpeg()[:100]


@pytest.mark.timeout(60)
@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="reads /dev/zero")
def test_a_file_growing_without_end_is_a_counted_reject(tmp_path):
    """/dev/zero, swapped in for a file after the scan, stands for a file that never stops growing."""
    src = tree(tmp_path / "src", {"a": 1})
    (src / "a" / "endless.jpg").symlink_to("/dev/zero")
    paths = PathTable.from_paths(["a/0.jpg", "a/endless.jpg"])
    out = tmp_path / "out"
    (out / "buckets").mkdir(parents=True)
    gathered = GatherTask(
        src=str(src),
        buckets=str(out / "buckets"),
        paths=paths,
        sizes=np.array([len(jpeg()), len(jpeg())]),
        shards=np.zeros(2, dtype=np.int64),
        slots=np.arange(2),
        dst=str(out),
    )
    buckets = gather(gathered)
    task = ShardTask(
        index=0,
        name="train-000000.tar",
        dst=str(out),
        buckets=tuple(buckets.values()),
        paths=paths,
        labels=np.zeros(2, dtype=np.int32),
        keys=np.arange(2),
        classes=("a",),
        key_width=6,
        check=Check.HEADER,
        resize=None,
        quality=90,
    )
    record = write_shard(task)
    assert record.samples == 1
    (reject,) = record.rejects
    assert reject.reason is Reason.GREW and reject.detail.startswith("grew past ")
    direct = write_shard(replace(task, buckets=(), src=str(src), sizes=gathered.sizes))  # read by the writer
    assert direct.rejects == record.rejects


def _in_subprocess(argv: list[str], memory: int | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a fresh interpreter, its address space capped at ``memory`` bytes."""
    cap = f"resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))" if memory else ""
    code = f"import resource, sys\n{cap}\nfrom imgshards.cli.main import main\nsys.argv = {argv!r}\nmain()"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env, check=False
    )


def test_a_6gb_sparse_file_under_a_memory_limit_is_a_reject_not_a_memory_error(tmp_path):
    src = tree(tmp_path / "src", {"a": 3, "b": 3})
    with open(src / "b" / "huge.jpg", "wb") as f:
        f.truncate(6 * 10**9)  # sparse: no disk used
    out = tmp_path / "out"
    done = _in_subprocess(["imgshards", "pack", str(src), str(out), "--workers", "1", "--json"], 3 << 30)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)["splits"]["train"]
    assert summary["samples"] == 6 and summary["rejects"]["by_reason"] == {"too_large": 1}
    (line,) = (out / ".imgshards" / "rejects" / "train.jsonl").read_text().splitlines()
    assert json.loads(line)["detail"] == "6,000,000,000 bytes: too large to read into memory"


def test_memory_running_out_elsewhere_is_one_line():
    from imgshards.converter.write.failures import explained

    with (
        pytest.raises(
            PackError, match=r"^out of memory while packing split 'train' into /x; .*fewer --workers"
        ),
        explained(Path("/x"), ["train"], []),
    ):
        raise MemoryError


def test_a_read_only_destination_is_one_line(tiny_tree, tmpfs):
    disk = tmpfs(64 << 20)
    pack(tiny_tree, disk / "out", PackConfig(workers=1))
    tmpfs.remount(disk, "ro")
    with pytest.raises(PackError) as caught:
        pack(tiny_tree, disk / "out", PackConfig(workers=1, seed=1, overwrite=True))
    message = str(caught.value)
    assert message.startswith(f"cannot write to the destination {disk / 'out'}") and "\n" not in message
    assert "Read-only file system; make it writable, or choose another destination" in message
    res = CliRunner().invoke(cli, ["pack", str(tiny_tree), str(disk / "new")])
    assert res.exit_code == 2 and "Read-only file system" in res.output and res.output.count("\n") == 1


def test_an_empty_class_named_with_escape_codes_is_shown_escaped(tmp_path):
    src = tree(tmp_path / "src", {"a": 2, ESC: 0})
    with pytest.raises(SourceError) as caught:
        scan_tree(src)
    message = str(caught.value)
    assert "\x1b" not in message and shown(ESC) in message and "\\x1b[31mred" in message
    res = CliRunner().invoke(cli, ["pack", str(src), str(tmp_path / "out")])
    assert res.exit_code == 2 and "\x1b" not in res.output and "\\x1b[31mred" in res.output


def test_escape_codes_in_any_error_of_the_cli_are_escaped(tmp_path):
    src = tmp_path / f"src{ESC}"  # a name in the message that the library does not escape itself
    res = CliRunner().invoke(cli, ["pack", str(src), str(tmp_path / "out")])
    assert res.exit_code == 2 and "\x1b" not in res.output and "src\\x1b[31mred" in res.output


def _as_nobody(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a forked child that runs as user nobody (the tests run as root); its result or error."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no return, no cleanup of the parent's state
        try:
            os.close(read)
            os.setgid(65534)
            os.setuid(65534)
            try:
                outcome: Any = ("ok", fn())
            except Exception as e:
                outcome = ("error", type(e).__name__, str(e))
            os.write(write, pickle.dumps(outcome))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return pickle.loads(data)


def test_a_class_directory_nobody_may_list_says_permission_denied():
    base = Path(tempfile.mkdtemp(prefix="imgshards-perm-"))  # outside pytest's root-only directory
    try:
        src = tree(base / "src", {"a": 2, "locked": 2})
        (src / "locked").chmod(0)
        if os.geteuid() == 0:
            base.chmod(0o755)
            outcome = _as_nobody(lambda: scan_tree(src) and None)
        else:
            try:
                scan_tree(src)
                outcome = ("ok", None)
            except SourceError as e:
                outcome = ("error", "SourceError", str(e))
        assert outcome == (
            "error",
            "SourceError",
            f"cannot list class directory in {src}: locked (Permission denied); make them readable "
            "(chmod) or remove them",
        )
    finally:
        (base / "src" / "locked").chmod(0o755)
        subprocess.run(["rm", "-rf", str(base)], check=False)
