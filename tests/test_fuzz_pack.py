"""Bounded fuzzing of pack (issue 21): hostile image headers, source-tree faults, planted links in DST.

Fixed seed, in-process, under a timeout. Each round builds a small tree with a few hostile files
(headers rewritten to random sizes, cut, flipped bytes; FIFOs, loops, broken links, empty and
escape-coded names, a sparse file), plants links, FIFOs and directories at paths pack writes in
DST (some after a first pack, to be replaced with ``overwrite``), and packs. "Clean" means: the run
ends with samples and counted rejects that account for every image file, or with one
:class:`ImgshardsError` of one printable line; and nothing outside DST changes (a decoy tree that
the planted links point into, and the source tree, have the same checksums after as before).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imgshards.converter import ImgshardsError, PackConfig, pack

SEED = 21
ROUNDS = 80
STATE = [
    ".imgshards/train/lock",
    ".imgshards/train/plan.json",
    ".imgshards/train/.plan.json.partial",
    ".imgshards/train/train-000000.tar.json",
    ".imgshards/train/.train-000000.tar.json.partial",
    ".imgshards/index.lock",
    ".imgshards/rejects/train.jsonl",
    ".imgshards/rejects/.train.jsonl.partial",
    "train-000000.tar",
    "train-000001.tar",
    ".train-000000.tar.partial",
    "train-rejects.jsonl",
    "index.json",
    ".index.json.partial",
    "_info.json",
    "._info.json.partial",
]
STATE_DIRS = [".imgshards", ".imgshards/train", ".imgshards/train/buckets", ".imgshards/rejects"]


def _image(rng: random.Random, fmt: str) -> bytes:
    pixels = np.random.default_rng(rng.randrange(1 << 30)).integers(0, 255, (12, 16, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def _hostile_image(rng: random.Random) -> tuple[str, bytes]:
    """A file name and bytes: a real image with its header rewritten, cut, or its bytes flipped."""
    fmt = rng.choice(["JPEG", "PNG"])
    data = bytearray(_image(rng, fmt))
    kind = rng.randrange(5)
    side = rng.choice([0, 1, 255, 16000, 65500, 65535])
    if kind == 0 and fmt == "JPEG":
        struct.pack_into(">HH", data, data.index(b"\xff\xc0") + 5, side, rng.choice([1, 16000, 65535]))
    elif kind == 0:
        struct.pack_into(">II", data, 16, side, rng.choice([1, 16000, 1 << 31]))
    elif kind == 1:
        del data[rng.randrange(len(data)) :]
    elif kind == 2:
        for _ in range(rng.randint(1, 6)):
            data[rng.randrange(min(len(data), 200))] = rng.randrange(256)
    elif kind == 3:
        data = bytearray(data[: rng.randrange(2, 40)]) + bytes(rng.randrange(0, 5000))
    suffix = rng.choice([".jpg", ".png", ".jpeg", ".webp"])
    return suffix, bytes(data)


def _source(root: Path, rng: random.Random) -> int:
    """A small tree with hostile entries; returns how many image-named regular files it holds."""
    images = 0
    for c in range(rng.randint(1, 3)):
        folder = root / f"c{c}"
        folder.mkdir(parents=True)
        for i in range(rng.randint(1, 4)):
            (folder / f"{i}.jpg").write_bytes(_image(rng, "JPEG"))
            images += 1
        for i in range(rng.randint(0, 3)):
            suffix, data = _hostile_image(rng)
            (folder / f"h{i}{suffix}").write_bytes(data)
            images += 1
    folder = root / "c0"
    fault = rng.randrange(8)
    if fault == 0:
        os.mkfifo(folder / "fifo.jpg")
    elif fault == 1:
        (folder / "loop").symlink_to("..")
    elif fault == 2:
        (folder / "broken.jpg").symlink_to(root / "nowhere")
    elif fault == 3:
        (root / "\x1b[2Jempty\x1b[0m").mkdir()  # an empty class: the whole pack is refused
    elif fault == 4:
        (folder / "\x1b[31m\udcffname.jpg").write_bytes(_image(rng, "JPEG"))
        images += 1
    elif fault == 5:
        with open(folder / "sparse.jpg", "wb") as f:
            f.truncate(rng.choice([1, 64 << 20]))
        images += 1
    elif fault == 6:
        (folder / "empty.png").write_bytes(b"")
        images += 1
    return images


def _plant(dst: Path, decoy: Path, rng: random.Random) -> None:
    """Links into the decoy, FIFOs or directories at a few of the paths pack writes in ``dst``."""
    for _ in range(rng.randint(1, 3)):
        rel = rng.choice(STATE + STATE_DIRS)
        path = dst / rel
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            continue  # a parent is already a link or a file: planted earlier this round
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()  # a file, link or FIFO
        what = rng.randrange(4)
        if what <= 1:
            path.symlink_to(decoy / "sub" if rel in STATE_DIRS else decoy / Path(rel).name)
        elif what == 2:
            os.mkfifo(path)
        else:
            path.mkdir()
            (path / "x").write_bytes(b"planted")


def _decoy(root: Path) -> None:
    for folder in (root, root / "sub"):
        for name in [*{Path(rel).name for rel in STATE}, "buckets/000000-1.bin", "train/lock"]:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(b"decoy " + name.encode())


def _checksums(root: Path) -> dict[str, str]:
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
            found[str(path.relative_to(root))] = f"{st.st_mode:o} {st.st_size} {digest}"
    return found


@pytest.mark.timeout(120)
def test_pack_under_hostile_trees_and_destinations_is_clean(tmp_path):
    rng = random.Random(SEED)
    outcomes: dict[str, int] = {}
    for n in range(ROUNDS):
        round_dir = tmp_path / f"r{n}"
        src, dst, decoy = round_dir / "src", round_dir / "dst", round_dir / "decoy"
        images = _source(src, rng)
        _decoy(decoy)
        config = PackConfig(
            shard_size=rng.choice([3000, 1 << 20]), workers=1, read_order=rng.choice(["disk", "plan"])
        )
        if rng.random() < 0.5:
            with contextlib.suppress(ImgshardsError):
                pack(src, dst, config)
            config = PackConfig(
                shard_size=config.shard_size, workers=1, read_order=config.read_order, seed=1, overwrite=True
            )
        dst.mkdir(exist_ok=True)
        _plant(dst, decoy, rng)
        before = (_checksums(decoy), _checksums(src))
        try:
            result = pack(src, dst, config)
        except ImgshardsError as e:
            message = str(e)
            assert "\n" not in message and "\x1b" not in message, message
            outcome = type(e).__name__
        else:
            info = result.info
            assert info.samples + info.rejects_total >= images, (info.samples, info.rejects_by_reason, images)
            outcome = "packed"
        assert (_checksums(decoy), _checksums(src)) == before, f"round {n}: pack changed files outside {dst}"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        shutil.rmtree(round_dir)
    assert outcomes.get("packed", 0) >= ROUNDS // 4, outcomes  # the fuzz does not only test refusals
    assert sum(v for k, v in outcomes.items() if k != "packed") >= ROUNDS // 10, outcomes
