"""Hostile inputs, round 6 (issue 44): CLI values without bounds, and untrusted names on a terminal.

Each test runs the real command on real trees and shards; the terminal test runs ``imgshards pack``
in a real pseudo-terminal, as a person sees it. On bc91b27: ``--seed -1`` was a numpy traceback; a
split name of 150 characters packed (exit 0) an index ``info`` and ``verify`` refused; one of 250 in
a split file was an ENAMETOOLONG traceback that left a lock behind; ``-j 100000`` forked 100,000
workers for one shard; ``verify --split train --split train`` found the counts differ; a 10 MB path
in a split file made a 10 MB error line; a class folder's ESC, BEL, CR and U+202E reached the
terminal raw; and ``info --json`` printed an index's NaN bare.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from imgshards.converter.format.errors import shown

from .conftest import one_line_error, run

IMGSHARDS = [sys.executable, "-m", "imgshards.cli"]


def _images(folder: Path, n: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("RGB", (16, 12), (40 * i % 256, 90, 160)).save(folder / f"{i}.jpg")


# ---- 5: --seed ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", ["-1", str(2**63), str(-(2**70))])
def test_a_seed_out_of_range_is_one_line_naming_the_option_and_its_range(tiny_tree, tmp_path, seed):
    result = run("pack", tiny_tree, tmp_path / "out", "--seed", seed)
    assert result.exit_code == 2
    line = one_line_error(result)
    assert "--seed" in line and "0<=x<=9223372036854775807" in line, line
    assert not (tmp_path / "out").exists()


def test_the_largest_seed_packs(tiny_tree, tmp_path):
    assert run("pack", tiny_tree, tmp_path / "out", "--seed", str(2**63 - 1), "-q").exit_code == 0


# ---- 6, 7: one split-name rule, before anything is written --------------------------------------


@pytest.mark.parametrize("option", ["--split", "--val-split"])
def test_a_split_name_over_100_characters_is_refused_before_pack_writes(tiny_tree, tmp_path, option):
    extra = ["--val-fraction", "0.2"] if option == "--val-split" else []
    result = run("pack", tiny_tree, tmp_path / "out", option, "a" * 150, *extra)
    assert result.exit_code == 2
    line = one_line_error(result)
    assert "at most 100" in line and "a" * 150 in line, line
    assert not (tmp_path / "out").exists()


def test_a_split_name_of_100_characters_packs_and_its_readers_take_it(tiny_tree, tmp_path):
    name = "b" * 100
    assert run("pack", tiny_tree, tmp_path / "out", "--split", name, "-q").exit_code == 0
    assert run("info", tmp_path / "out").exit_code == 0
    assert run("verify", tmp_path / "out", "-q").exit_code == 0


def test_index_split_names_follow_the_same_rule(tiny_packed, tmp_path):
    shards = tmp_path / "theirs"
    shards.mkdir()
    for tar in tiny_packed.glob("*.tar"):
        shutil.copy(tar, shards / tar.name)
    result = run("index", shards, "--split", "c" * 101)
    assert result.exit_code == 2 and "at most 100" in one_line_error(result)
    assert not (shards / "index.json").exists()


@pytest.mark.parametrize("name", ["s" * 250, "s" * 101, "Train", "a/b"])
def test_a_bad_split_name_in_a_split_file_is_refused_and_nothing_is_written(tiny_tree, tmp_path, name):
    paths = sorted(str(p.relative_to(tiny_tree)) for p in tiny_tree.rglob("*.JPEG"))
    split_file = tmp_path / "splits.json"
    split_file.write_text(json.dumps({"train": paths[:20], name: paths[20:]}))
    dst = tmp_path / "out"
    result = run("pack", tiny_tree, dst, "--split-file", split_file)
    assert result.exit_code == 2
    line = one_line_error(result)
    assert (
        f"split name {shown(name, quoted=True)} must be lower-case letters, digits and '_', at most 100"
        in line
    )
    assert "Traceback" not in result.output and not dst.exists()


# ---- 10: a long value in a message is cut -------------------------------------------------------


def test_a_10mb_path_in_a_split_file_is_cut_in_the_error(tiny_tree, tmp_path):
    split_file = tmp_path / "splits.json"
    split_file.write_text(json.dumps({"train": ["x" * 10_000_000]}))
    result = run("pack", tiny_tree, tmp_path / "out", "--split-file", split_file)
    assert result.exit_code == 2
    line = one_line_error(result)
    assert len(line) < 1_000 and "(10,000,000 characters)" in line, line[:300]


# ---- 8: -j is capped at the work and the machine ------------------------------------------------


def _descendants(pid: int) -> set[int]:
    """The processes under ``pid``, read from /proc."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rpartition(")")[2].split()[1])
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        children = {p for p, pp in parents.items() if pp == parent} - found
        found |= children
        todo += children
    return found


_TOO_MANY = 64  # descendants at which the test stops a run that forks without bound


def _most_processes(cmd: list[str]) -> tuple[int, subprocess.Popen[bytes], bytes]:
    """Run ``cmd``, counting its descendants; stop it whole past ``_TOO_MANY`` (RLIMIT_NPROC spares root)."""
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    most = 0
    while proc.poll() is None and most < _TOO_MANY:
        most = max(most, len(_descendants(proc.pid)))
        time.sleep(0.02)
    if most >= _TOO_MANY:
        os.killpg(proc.pid, signal.SIGKILL)
    _, err = proc.communicate()
    return most, proc, err


@pytest.mark.skipif(sys.platform != "linux", reason="counts processes in /proc")
def test_pack_with_100000_workers_forks_a_handful(tmp_path):
    src = tmp_path / "src"
    for name in ("cat", "dog"):
        _images(src / name, 30)  # 60 images: one shard
    most, proc, err = _most_processes(
        [*IMGSHARDS, "pack", str(src), str(tmp_path / "out"), "-j", "100000", "-q"]
    )
    cores = len(os.sched_getaffinity(0))
    assert most <= 2 * cores + 2, most  # 2 a core (pool.PER_CORE), and multiprocessing's helpers
    assert proc.returncode == 0, err.decode()
    assert run("verify", tmp_path / "out", "-q").exit_code == 0


@pytest.mark.skipif(sys.platform != "linux", reason="counts processes in /proc")
def test_index_with_100000_workers_forks_a_handful(tmp_path):
    # index read its shards with min(-j, shards) processes: -j 100000 over 100 shards forked 100.
    src = tmp_path / "src"
    for name in ("cat", "dog"):
        _images(src / name, 50)
    assert run("pack", src, tmp_path / "packed", "--max-samples", "1", "-q").exit_code == 0
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    for shard in (tmp_path / "packed").glob("*.tar"):
        shutil.copy(shard, foreign / shard.name)
    assert len(list(foreign.glob("*.tar"))) == 100
    most, proc, err = _most_processes([*IMGSHARDS, "index", str(foreign), "-j", "100000", "-q"])
    cores = len(os.sched_getaffinity(0))
    assert most <= 2 * cores + 2, most  # 2 a core (pool.PER_CORE), and multiprocessing's helpers
    assert proc.returncode == 0, err.decode()
    assert run("verify", foreign, "-q").exit_code == 0


# ---- 9: a split named twice ---------------------------------------------------------------------


def test_verify_counts_a_split_named_twice_once(tiny_packed):
    result = run("verify", tiny_packed, "--split", "train", "--split", "train")
    assert result.exit_code == 0, result.output
    assert "ok: " in result.output and "BAD" not in result.output
    doc = json.loads(run("verify", tiny_packed, "--split", "train", "--split", "train", "--json").stdout)
    assert doc["ok"] and doc["samples"] == 40


# ---- 13: NaN and Infinity in an index -----------------------------------------------------------


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_an_index_holding_nan_or_infinity_is_refused_in_one_line(tiny_packed, tmp_path, constant):
    dst = tmp_path / "copy"
    shutil.copytree(tiny_packed, dst)
    text = (dst / "index.json").read_text()
    edited = re.sub(r'"quality": (null|\d+)', f'"quality": {constant}', text, count=1)
    assert edited != text
    (dst / "index.json").write_text(edited)
    for args in (("info", dst, "--json"), ("info", dst), ("verify", dst)):
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        line = one_line_error(result)
        assert constant.lstrip("-") in line and "index.json" in line, line


def test_info_json_is_strict_json(tiny_packed):
    out = run("info", tiny_packed, "--json").stdout

    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in info --json")

    json.loads(out, parse_constant=refuse)


# ---- 11: untrusted names on a terminal ----------------------------------------------------------

# What a hostile folder name may hold: clear the screen, set the window title (ended by BEL), a
# carriage return that rewrites the line, a bidi override that reverses what follows.
CLEAR, TITLE, CR_NAME, BIDI = "x\x1b[2Jx", "t\x1b]0;owned\x07t", "ok\rEVIL", "gpj.\u202eexe"
# What click itself writes on a terminal: the colour of a warning.
_COLOURS = re.compile(rb"\x1b\[[0-9;]*m")


def _in_a_terminal(*args: object) -> tuple[int, bytes]:
    """``imgshards ARGS`` on a pseudo-terminal: its exit status and every byte it wrote there."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [*IMGSHARDS, *map(str, args)], stdin=child, stdout=child, stderr=child, close_fds=True
    )
    os.close(child)
    out = bytearray()
    while True:
        ready, _, _ = select.select([main], [], [], 60)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    return proc.wait(timeout=60), bytes(out)


def _assert_nothing_raw(out: bytes) -> None:
    for raw in (b"\x1b[2J", b"\x1b]0;", b"\x07", b"ok\rEVIL", "\u202e".encode()):
        assert raw not in out, (raw, out)
    assert b"\x1b" not in _COLOURS.sub(b"", out), out
    assert b"\r" not in out.replace(b"\r\n", b""), out  # the terminal's own line ends only


@pytest.fixture
def hostile_trees(tmp_path):
    """Two trees whose folder names hold terminal controls: one warned about for its split-named
    folder, one for being nested a level deeper."""
    split_named = tmp_path / "splitnamed"
    for name in ("train", CLEAR, TITLE, CR_NAME, BIDI):
        _images(split_named / name, 3)
    nested = tmp_path / "nested"
    for inner in (TITLE, CR_NAME, BIDI):
        _images(nested / CLEAR / inner, 3)
    return split_named, nested


@pytest.mark.parametrize("dry_run", [False, True], ids=["pack", "dry-run"])
def test_folder_names_with_terminal_controls_are_escaped_on_a_terminal(hostile_trees, tmp_path, dry_run):
    for i, src in enumerate(hostile_trees):
        flags = ["--dry-run"] if dry_run else []
        code, out = _in_a_terminal("pack", src, tmp_path / f"out{i}", "-j", "2", "--no-progress", *flags)
        assert code == 0, out
        assert b"warning" in out and b"\\x1b" in out, out  # the warning names the folders, escaped
        _assert_nothing_raw(out)
        if not dry_run:
            code, out = _in_a_terminal("info", tmp_path / f"out{i}")
            assert code == 0, out
            _assert_nothing_raw(out)


def test_shown_escapes_and_cuts_a_name():
    assert shown(TITLE) == "t\\x1b]0;owned\\x07t" and shown(CR_NAME) == "ok\\rEVIL"
    assert shown(BIDI) == "gpj.\\u202eexe" and shown("naïve/日本") == "naïve/日本"
    assert shown(shown(CLEAR)) == shown(CLEAR)  # escaping twice changes nothing more
    long = shown("a" * 5_000_000 + "z" * 5_000_000)
    assert long.startswith("aaa") and "...zzz" in long and long.endswith(" (10,000,000 characters)")
    assert len(long) < 300
    assert shown("k", quoted=True) == "'k'" and shown("\x1b" * 300, most=None) == "\\x1b" * 300
