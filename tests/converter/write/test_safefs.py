"""pack never writes or deletes through a link planted under its destination (issue 21, case 1).

A symbolic link is planted at every path pack writes or removes (the list below is taken from the
code: converter/write/destination.py, converter/pack.py, converter/write/shard.py), pointing into a
decoy tree outside DST that holds the very names pack would write there. Whatever pack does then
(replace the link, or refuse with one line naming it), the decoy's checksums are the same after as
before.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from imgshards.converter import DestinationError, ImgshardsError, PackConfig, pack
from imgshards.converter.scan.tree import PathTable
from imgshards.converter.write.safefs import create, open_dir, write_atomic
from imgshards.converter.write.shard import GatherTask, gather

CONFIG = PackConfig(shard_size=8_000, workers=2, read_order="disk")  # a dozen shards, gathered first
AGAIN = PackConfig(shard_size=8_000, workers=2, read_order="disk", seed=1, overwrite=True)  # replaces it

# Every path under DST that pack creates, writes, renames onto or removes, for split "train".
FILES = [
    ".imgshards/train/lock",
    ".imgshards/train/plan.json",
    ".imgshards/train/.plan.json.partial",
    ".imgshards/train/train-000000.tar.json",
    ".imgshards/train/.train-000000.tar.json.partial",
    ".imgshards/index.lock",
    ".imgshards/rejects/train.jsonl",
    ".imgshards/rejects/.train.jsonl.partial",
    "train-000000.tar",
    ".train-000000.tar.partial",
    "train-rejects.jsonl",
    "index.json",
    ".index.json.partial",
    "_info.json",
    "._info.json.partial",
]
DIRS = [".imgshards", ".imgshards/train", ".imgshards/train/buckets", ".imgshards/rejects"]


def checksums(root: Path) -> dict[str, tuple[int, str]]:
    """Every entry under ``root``: its mode, and the SHA-256 of a file's bytes or a link's target."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            if path.is_symlink():
                digest = os.readlink(path)
            elif path.is_file():
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                digest = ""
            found[str(path.relative_to(root))] = (st.st_mode, digest)
    return found


@pytest.fixture
def decoy(tmp_path: Path) -> Path:
    """A tree outside DST holding the names pack writes, so a followed link would change it."""
    root = tmp_path / "decoy"
    for folder in (root, root / "sub"):
        for name in [*{Path(rel).name for rel in FILES}, "keep.txt", "buckets/000000-1.bin", "train/lock"]:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(f"decoy {name}\n".encode())
    return root


def plant(dst: Path, rel: str, target: Path) -> None:
    """Replace whatever is at ``dst/rel`` with a symbolic link to ``target``."""
    path = dst / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    path.symlink_to(target)


def run(src: Path, dst: Path, config: PackConfig) -> str | None:
    """Pack; return None when it ran, or the one-line error it refused with."""
    try:
        pack(src, dst, config)
    except ImgshardsError as e:
        message = str(e)
        assert "\n" not in message
        return message
    return None


@pytest.mark.parametrize("scenario", ["fresh", "overwrite"])
@pytest.mark.parametrize("rel", FILES + DIRS)
def test_a_link_planted_at_any_path_pack_writes_changes_nothing_outside_dst(
    tiny_tree, tmp_path, decoy, rel, scenario
):
    dst = tmp_path / "dst"
    if scenario == "overwrite":  # a finished pack, to be replaced: clear_split's removals run
        pack(tiny_tree, dst, CONFIG)
    target = decoy / "sub" if rel in DIRS else decoy / Path(rel).name
    plant(dst, rel, target)
    before = checksums(decoy)
    refused = run(tiny_tree, dst, AGAIN)
    assert checksums(decoy) == before, f"a link at {rel} let pack change files outside {dst}"
    if refused is not None:
        assert str(dst / rel) in refused or "index" in refused, refused
    else:
        assert not (dst / rel).is_symlink() or rel == "train-rejects.jsonl", "a link pack went on past"
        again = run(tiny_tree, dst, AGAIN)
        assert again is None and checksums(decoy) == before


@pytest.mark.parametrize("rel", [".imgshards", ".imgshards/train", ".imgshards/rejects"])
def test_a_linked_state_directory_is_refused_in_one_line_naming_it(tiny_tree, tmp_path, decoy, rel):
    dst = tmp_path / "dst"
    pack(tiny_tree, dst, CONFIG)
    plant(dst, rel, decoy / "sub")
    before = checksums(decoy)
    with pytest.raises(DestinationError) as caught:
        pack(
            tiny_tree, dst, PackConfig(shard_size=8_000, workers=2, read_order="disk", seed=1, overwrite=True)
        )
    message = str(caught.value)
    assert message.startswith(f"{dst / rel} is a symbolic link (to {decoy / 'sub'})")
    assert "remove it, or choose another destination" in message
    assert checksums(decoy) == before


def test_the_cli_refuses_a_linked_state_directory_in_one_line(tiny_tree, tmp_path, decoy):
    dst = tmp_path / "dst"
    pack(tiny_tree, dst, CONFIG)
    plant(dst, ".imgshards/train", decoy / "sub")
    before = checksums(decoy)
    cmd = [
        sys.executable,
        "-m",
        "imgshards.cli",
        "pack",
        str(tiny_tree),
        str(dst),
        "--overwrite",
        "--seed",
        "1",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"{dst}/.imgshards/train is a symbolic link" in done.stderr
    assert checksums(decoy) == before


def test_a_bucket_name_taken_by_a_link_is_refused_not_followed(tmp_path, decoy):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.jpg").write_bytes(b"\xff\xd8\xff" + b"\0" * 10)
    buckets = tmp_path / "buckets"
    buckets.mkdir()
    (buckets / f"000000-{os.getpid()}.bin").symlink_to(decoy / "keep.txt")
    before = checksums(decoy)
    task = GatherTask(
        src=str(src),
        buckets=str(buckets),
        paths=PathTable.from_paths(["a/x.jpg"]),
        sizes=np.array([13]),
        shards=np.array([0]),
        slots=np.array([0]),
        dst=str(tmp_path),
    )
    with pytest.raises(DestinationError, match=f"{buckets}/000000-{os.getpid()}.bin is a symbolic link"):
        gather(task)
    assert checksums(decoy) == before


def test_safefs_never_follows_a_link(tmp_path, decoy):
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / ".f.partial").symlink_to(decoy / "keep.txt")
    (root / "d" / "g").symlink_to(decoy / "keep.txt")
    (root / "up").symlink_to(decoy)
    before = checksums(decoy)
    write_atomic(root / "d" / "f", b"new", root=root)  # the stale temporary link is unlinked
    assert (root / "d" / "f").read_bytes() == b"new" and not (root / "d" / ".f.partial").exists()
    with create(root / "d" / "g", root=root) as f:  # the link is replaced by a new file
        f.write(b"g")
    with pytest.raises(DestinationError, match="up is a symbolic link"):
        write_atomic(root / "up" / "keep.txt", b"x", root=root)
    with pytest.raises(DestinationError, match="up is a symbolic link"):
        open_dir(root, "up/buckets", create=True)
    assert checksums(decoy) == before


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", ["fifo", "directory"])
@pytest.mark.parametrize(
    "rel",
    [".imgshards/train/lock", ".imgshards/index.lock", ".imgshards/train/plan.json", ".index.json.partial"],
)
def test_a_fifo_or_directory_at_a_state_path_neither_blocks_nor_tracebacks(tiny_tree, tmp_path, rel, what):
    dst = tmp_path / "dst"
    pack(tiny_tree, dst, CONFIG)
    path = dst / rel
    path.unlink(missing_ok=True)  # each of these exists after a pack but the temporary name
    if what == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
        (path / "x").write_bytes(b"planted")
    refused = run(tiny_tree, dst, AGAIN)
    if rel.endswith(".partial"):  # a stale temporary name: removed, never followed
        assert refused is None and not path.exists()
    else:
        kind = "not a regular file" if what == "fifo" else "a directory"
        assert refused == f"{path} is {kind}; pack needs that name: remove it, or choose another destination"
