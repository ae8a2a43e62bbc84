"""A hostile or unlucky index and shard files (issue 12, cases 1, 2, 4, 5 locally): one validation, one line.

Every case is built in the test from a real packed dataset; the commands that used to hang run in a
subprocess with a timeout, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from imgshards.cli.main import cli
from imgshards.converter import ManifestError, read_manifest, verify
from imgshards.converter.format.validate import (
    MAX_DEPTH,
    MAX_INDEX_BYTES,
    MAX_INDEX_VALUES,
    check_relative_path,
)

HANG = 30  # seconds: what each of these took before was "forever"


@pytest.fixture
def ds(tiny_packed, tmp_path) -> Path:
    """A private copy of ``tiny_packed``, in ``tmp/root/ds`` (``tmp/root`` holds things outside it)."""
    copy = tmp_path / "root" / "ds"
    shutil.copytree(tiny_packed, copy)
    return copy


def edit_index(ds: Path, edit) -> None:
    index = json.loads((ds / "index.json").read_text())
    edit(index)
    (ds / "index.json").write_text(json.dumps(index))


def cli_line(*args: str) -> tuple[int, str]:
    """Run the CLI in-process; return its exit code and output, asserting it is one line, no traceback."""
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return result.exit_code, lines[0]


def cli_subprocess(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a subprocess, killed after ``HANG`` seconds (a hang fails the test)."""
    return subprocess.run(
        [sys.executable, "-m", "imgshards.cli", *args], capture_output=True, text=True, timeout=HANG
    )


def first_shard(ds: Path) -> str:
    return read_manifest(ds).split("train").shards[0].name


# ---- case 1, locally: names outside the root ------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["../outside.tar", "/etc/passwd", "a/b.tar", "pipe:touch marker; cat x.tar", "x\x1b[2J.tar", ".x"]
)
def test_a_shard_name_that_is_not_a_plain_name_is_refused_everywhere(ds, name):
    (ds.parent / "outside.tar").write_bytes((ds / first_shard(ds)).read_bytes())
    edit_index(ds, lambda index: index["splits"]["train"]["shards"][0].update(name=name))
    field = r"splits\.train\.shards\[0\]\.name"
    with pytest.raises(ManifestError, match=field):
        read_manifest(ds)
    with pytest.raises(ManifestError, match=field):
        verify(ds, workers=1)
    from imgshards.loader import ShardDataset

    with pytest.raises(ManifestError, match=field):
        ShardDataset(ds)
    for command in ("info", "verify"):
        code, line = cli_line(command, str(ds))
        assert code == 2 and line.startswith("Error: ") and "shards[0].name" in line and "\x1b" not in line


# ---- case 4: counts, sizes and classes --------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (
            ("shards", 0, "samples"),
            10**12,
            r"shards\[0\]\.samples is 1000000000000, expected an integer in 0\.\.",
        ),
        (("shards", 0, "samples"), -5, r"shards\[0\]\.samples is -5"),
        (("shards", 0, "samples"), 25.7, r"shards\[0\]\.samples is 25\.7"),
        (("shards", 0, "bytes"), 2**50, r"shards\[0\]\.bytes is 1125899906842624"),
        (("shards", 0, "sha256"), "zz", r"shards\[0\]\.sha256"),
        (("class_counts", 0), -3, r"class_counts\[0\] is -3"),
        (("samples",), 999, r"splits\.train\.samples is 999, expected 40"),
    ],
)
def test_counts_and_sizes_out_of_bounds_are_refused_naming_the_field(ds, path, value, field):
    def edit(index):
        node = index["splits"]["train"]
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value

    edit_index(ds, edit)
    with pytest.raises(ManifestError, match=field):
        read_manifest(ds)


def test_an_empty_or_repeated_class_list_is_refused(ds):
    edit_index(ds, lambda index: index.update(classes=[]))
    with pytest.raises(ManifestError, match="classes is empty"):
        read_manifest(ds)
    edit_index(ds, lambda index: index.update(classes=["a", "a", "b", "c"]))
    with pytest.raises(ManifestError, match="classes holds a name twice"):
        read_manifest(ds)


# ---- case 5: malformed documents, one line each ---------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"format": "imgshards", "version": 1, "classes": ["\xff\xfe"]}', "is not UTF-8 text"),
        (b'{"format": "imgshards", "version": 1, "classes": ["a"], "splits": [1, 2]}', "splits is [1, 2]"),
        (
            b'{"format": "imgshards", "version": 1, "classes": ["a"], "splits": {"train": [1]}}',
            "splits.train is [1], expected an object",
        ),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than JSON can be read"),
        (b'{"format": "imgshards", "a": ' + b"[" * 40 + b"]" * 40 + b"}", f"nested over {MAX_DEPTH} deep"),
    ],
)
def test_a_malformed_index_is_one_line_in_info_verify_and_the_loader(ds, content, message):
    (ds / "index.json").write_bytes(content)
    with pytest.raises(ManifestError) as caught:
        read_manifest(ds)
    assert message in str(caught.value)
    from imgshards.loader import ShardDataset

    with pytest.raises(ManifestError):
        ShardDataset(ds)
    for command in ("info", "verify"):
        code, line = cli_line(command, str(ds))
        assert code == 2 and message in line


# ---- case 2: what used to hang ------------------------------------------------------------------


def test_an_index_that_is_a_fifo_is_refused_without_blocking(ds):
    (ds / "index.json").unlink()
    os.mkfifo(ds / "index.json")
    for command in ("info", "verify"):
        done = cli_subprocess(command, str(ds))
        assert done.returncode == 2 and "is a FIFO, not a regular file" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "fifo", "dir", "outside"])
def test_verify_refuses_a_shard_that_is_no_regular_file_inside_the_dataset(ds, target):
    shard = ds / first_shard(ds)
    if target == "fifo":
        shard.unlink()
        os.mkfifo(shard)
    elif target == "dir":
        shard.unlink()
        shard.mkdir()
    elif target == "outside":
        outside = ds.parent / "outside.tar"
        shard.rename(outside)
        shard.symlink_to(outside)  # the right bytes, but outside the dataset
    else:
        shard.unlink()
        shard.symlink_to(target)
    done = cli_subprocess("verify", str(ds), "--workers", "1")
    assert done.returncode == 1, done.stderr
    assert f"BAD train/{shard.name}: unreadable (" in done.stderr and "Traceback" not in done.stderr


def test_verify_reports_a_member_size_past_the_end_of_the_shard(ds):
    shard = ds / first_shard(ds)
    data = bytearray(shard.read_bytes())
    with tarfile.open(shard) as tar:
        at = tar.getmembers()[1].offset
    # Base-256 size field (GNU): 2**80 bytes; the checksum fixed so the header still parses.
    data[at + 124 : at + 136] = b"\x80" + (2**80).to_bytes(11, "big")
    header = data[at : at + 512]
    header[148:156] = b" " * 8
    data[at + 148 : at + 156] = b"%06o\0 " % sum(header)
    shard.write_bytes(bytes(data))
    done = cli_subprocess("verify", str(ds), "--workers", "1")
    assert done.returncode == 1 and "declares 1208925819614629174706176 bytes, past the end" in done.stderr


# ---- an index at the size bound: memory and time in proportion to what it holds -----------------

PEAK_RSS = 2.5e9  # bytes a command may take to read an index of MAX_INDEX_BYTES


def pad_index(ds: Path, size: int, item: bytes) -> None:
    """Give ``ds``'s index an unknown key holding ``item`` repeated, ``size`` bytes in all, written fast."""
    head = (ds / "index.json").read_bytes().rstrip()[:-1] + b', "padding": ['
    count = (size - len(head) - 3) // len(item)
    chunk = item * 1_000_000
    with open(ds / "index.json", "wb") as f:
        f.write(head)
        for _ in range(count // 1_000_000):
            f.write(chunk)
        f.write(item * (count % 1_000_000) + b"0]}")
    assert (ds / "index.json").stat().st_size <= size


def peak_rss(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run the CLI in a subprocess; return it and its peak resident memory in bytes.

    A fresh parent waits for it, so the peak (``RUSAGE_CHILDREN``) is the command's alone; past
    ``timeout`` seconds the parent kills it and the test fails.
    """
    parent = (
        "import resource, subprocess, sys\n"
        "try:\n"
        f"    code = subprocess.run(sys.argv[1:], timeout={timeout}).returncode\n"
        "except subprocess.TimeoutExpired:\n"
        "    code = 124\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", parent, sys.executable, "-m", "imgshards.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout + 30,
    )
    *stderr, peak = done.stderr.splitlines()
    assert done.returncode != 124, f"still running after {timeout} s"
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, "\n".join(stderr)), int(peak)


def test_an_index_padded_with_small_values_is_refused_before_they_are_built(ds):
    pad_index(ds, 200 << 20, b"0,")  # what took 7.4 GB, then a MemoryError traceback
    done, peak = peak_rss("info", str(ds))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert f"{ds / 'index.json'} holds over {MAX_INDEX_VALUES:,} JSON values and keys" in done.stderr
    assert peak < 1e9, f"{peak / 1e9:.1f} GB"


def test_an_index_padded_to_the_size_bound_is_read_in_bounded_memory(ds):
    pad_index(ds, MAX_INDEX_BYTES, b'"abcdefghijklmn",')  # as many objects as the bound on values lets in
    assert (ds / "index.json").stat().st_size > MAX_INDEX_BYTES - 100
    done, peak = peak_rss("info", str(ds))
    assert done.returncode == 0, done.stderr
    assert f"{ds}: 4 classes" in done.stdout and "train: 40 samples" in done.stdout
    assert peak < PEAK_RSS, f"{peak / 1e9:.1f} GB"


# ---- case 8: class names are printed escaped --------------------------------------------------------


def test_info_escapes_class_names_and_reasons_from_the_index(ds):
    def edit(index):
        index["classes"] = [f"\x1b]0;owned\x07\x1b[2J{i}\r\udcff" for i in range(4)]
        index["splits"]["train"]["rejects"]["by_reason"] = {"\x1b[31mred": 1}

    edit_index(ds, edit)
    result = CliRunner().invoke(cli, ["info", str(ds)])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\r" not in result.output and "\x07" not in result.output
    assert "(\\x1b]0;owned\\x07\\x1b[2J" in result.output and "\\r\\udcff)" in result.output
    assert "\\x1b[31mred 1" in result.output


@pytest.mark.parametrize(
    "name",
    ["../r.jsonl", "/etc/passwd", ".imgshards/../../x", "a/./b.jsonl", "a//b", ".hidden.jsonl", "pipe:x"],
)
def test_a_rejects_file_outside_the_root_is_refused(name):
    with pytest.raises(ManifestError, match=r"splits\.train\.rejects\.file"):
        check_relative_path(name, "splits.train.rejects.file", "index.json")


def test_the_packs_own_rejects_path_is_accepted():
    assert check_relative_path(".imgshards/rejects/train.jsonl", "f", "index.json")
