"""Loader fixtures: small real datasets packed by the real ``pack``, and a way to name each image.

Tiny-profile images are all 64x48 real JPEG crops, distinct from each other, so a batch made with
an identity transform can be mapped back to sample keys by hashing the pixels: the tests check
sample identity, order and coverage without any hook in the loader.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import webdataset as wds

from imgshards.converter.format.manifest import INDEX_NAME, Manifest, ShardInfo, SplitInfo, read_manifest
from imgshards.converter.format.tablefiles import SplitTables, table_file_name
from imgshards.converter.format.tables import BLOCK, encode_sources, encode_table
from imgshards.loader import Batch
from imgshards.loader.image.decode import decode

# 5 classes x 23 = 115 samples: 115 mod 2 = 115 mod 3 = 1, so train mode drops one sample at world
# size 2 and 3, and batch size 8 leaves partial batches and workers with unequal batch counts.
CLASSES, PER_CLASS = 5, 23
NUM_SAMPLES = CLASSES * PER_CLASS


def pytest_configure(config):
    # torchvision 0.29 deprecates its image codecs in favour of TorchCodec; decode_jpeg still is the
    # libjpeg-turbo path the loader is specified to use (see loader/image/decode.py).
    config.addinivalue_line(
        "filterwarnings", "ignore:The image decoding and encoding capabilities:DeprecationWarning"
    )


def pixel_hash(image: torch.Tensor) -> str:
    """Identify a decoded image by its pixels (any memory layout)."""
    return hashlib.sha1(image.contiguous().numpy().tobytes()).hexdigest()


def read_samples(root: Path, split: str = "train") -> list[tuple[str, str, bytes, int]]:
    """Every sample of a packed split as ``(key, ext, image bytes, label)``, read with ``tarfile``."""
    out = []
    for shard in read_manifest(root).split(split).shards:
        members: dict[str, dict[str, bytes]] = {}
        with tarfile.open(root / shard.name) as tar:
            for m in tar:
                key, ext = m.name.split(".", 1)
                f = tar.extractfile(m)
                assert f is not None
                members.setdefault(key, {})[ext] = f.read()
        for key, parts in members.items():
            ext = next(e for e in parts if e not in ("cls", "json"))
            out.append((key, ext, parts[ext], int(parts["cls"])))
    return out


class KeyLookup:
    """Maps images of a batch (made with an identity transform) back to sample keys."""

    def __init__(self, root: Path) -> None:
        self.key_of: dict[str, str] = {}
        self.label_of: dict[str, int] = {}
        for key, ext, data, label in read_samples(root):
            h = pixel_hash(decode(data, ext))
            assert h not in self.key_of, "two samples decode to the same pixels"
            self.key_of[h] = key
            self.label_of[key] = label

    @property
    def keys(self) -> set[str]:
        return set(self.label_of)

    def batch_keys(self, batch: Batch) -> list[str]:
        keys = [self.key_of[pixel_hash(img)] for img in batch.images]
        assert [self.label_of[k] for k in keys] == batch.labels.tolist(), "labels do not match their images"
        return keys

    def run_keys(self, batches: Iterable[Batch]) -> list[list[str]]:
        return [self.batch_keys(b) for b in batches]


@pytest.fixture(scope="session")
def loader_tree(tree_factory) -> Path:
    """A tree of ``CLASSES`` x ``PER_CLASS`` tiny real JPEGs (do not modify it)."""
    return tree_factory(classes=CLASSES, per_class=PER_CLASS, seed=3)


@pytest.fixture(scope="session")
def packed_many(loader_tree, packed_factory) -> Path:
    """``loader_tree`` in ~20 shards of ~6 samples: more shards than global workers."""
    root = packed_factory(loader_tree, shard_size=20_000)
    assert len(read_manifest(root).split("train").shards) >= 12
    return root


@pytest.fixture(scope="session")
def packed_few(loader_tree, packed_factory) -> Path:
    """``loader_tree`` in 2 shards: fewer shards than global workers."""
    root = packed_factory(loader_tree, shard_size=280_000)
    assert 2 <= len(read_manifest(root).split("train").shards) <= 3
    return root


@pytest.fixture(scope="session")
def lookup_factory():
    """``lookup_factory(root)``: a :class:`KeyLookup` for a packed dataset."""
    return KeyLookup


@pytest.fixture(scope="session")
def hash_image():
    """The pixel hash :class:`KeyLookup` uses."""
    return pixel_hash


@pytest.fixture(scope="session")
def lookup_many(packed_many) -> KeyLookup:
    return KeyLookup(packed_many)


@pytest.fixture(scope="session")
def lookup_few(packed_few) -> KeyLookup:
    return KeyLookup(packed_few)


@pytest.fixture
def packed_copy(packed_many, tmp_path) -> Path:
    """A private copy of ``packed_many`` that a test may damage."""
    dst = tmp_path / "packed"
    shutil.copytree(packed_many, dst)
    return dst


@pytest.fixture(scope="session")
def class_sorted(packed_many, tmp_path_factory) -> Path:
    """The samples of ``packed_many`` re-written one class per shard, in class order.

    ``pack`` shuffles globally, so it cannot make this worst case for mixing; the shards are written
    here in the same format (webdataset's ``TarWriter``) with a matching index.
    """
    root = tmp_path_factory.mktemp("class_sorted")
    manifest = read_manifest(packed_many)
    samples = sorted(read_samples(packed_many), key=lambda s: (s[3], s[0]))
    shards = []
    for label in range(len(manifest.classes)):
        name = f"train-{label:06d}.tar"
        with wds.TarWriter(str(root / name)) as writer:
            for key, ext, data, lab in samples:
                if lab == label:
                    writer.write({"__key__": key, ext: data, "cls": str(lab).encode(), "json": b"{}"})
        data = (root / name).read_bytes()
        count = sum(1 for s in samples if s[3] == label)
        shards.append(ShardInfo(name, count, len(data), hashlib.sha256(data).hexdigest()))
    split = SplitInfo(name="train", shards=tuple(shards), class_counts=tuple(s.samples for s in shards))
    (root / INDEX_NAME).write_text(Manifest(classes=manifest.classes, splits={"train": split}).dumps())
    return root


# ---- a packed split's tables (index format 2), edited as a hostile or stale index would have them ----


def split_tables(root: Path, split: str = "train") -> SplitTables:
    """The tables of ``split`` of the packed dataset at ``root``, as the loader reads them."""
    manifest = read_manifest(root)
    return SplitTables(manifest.split(split), len(manifest.classes), root=root)


def table_entries(root: Path, split: str = "train") -> dict[str, np.ndarray]:
    """Every fixed-width table of ``split`` (starts in 512-byte blocks, labels, keys), whole: copies."""
    info = read_manifest(root).split(split)
    return {t: np.fromfile(root / f.name, dtype="<u4") for t, f in info.tables.items() if t != "sources"}


def rewrite_index(
    root: Path,
    *,
    tables: Mapping[str, Iterable[int]] | None = None,
    drop: Iterable[str] = (),
    edit: Callable[[dict[str, Any]], None] | None = None,
    split: str = "train",
) -> None:
    """Rewrite ``root``'s index in place, as a hostile or stale index would be.

    ``tables`` are written as new files (named by their content, as pack names them), the tables in
    ``drop`` left out (as an index written before them), then ``edit`` is called on the split's JSON.
    """
    doc = json.loads((root / INDEX_NAME).read_text())
    body = doc["splits"][split]
    for name, entries in (tables or {}).items():
        data = np.asarray(list(entries), dtype="<u4").tobytes()
        sha = hashlib.sha256(data).hexdigest()
        file = table_file_name(split, name, sha)
        (root / file).write_bytes(data)
        body["tables"][name] = {"file": file, "bytes": len(data), "sha256": sha}
    for name in drop:
        body["tables"].pop(name, None)
        if name == "sources":
            for shard in body["shards"]:
                shard.pop("sources_bytes", None)
    if edit is not None:
        edit(body)
    (root / INDEX_NAME).write_text(json.dumps(doc))


def as_format1(src: Path, dst: Path) -> Path:
    """``src`` as a dataset of index format 1 at ``dst``: its shards (hard links), its tables in the index.

    What ``pack`` wrote before the tables were files: each shard's entries as base64 in its entry.
    """
    dst.mkdir(parents=True, exist_ok=True)
    for path in src.glob("*.tar"):
        os.link(path, dst / path.name)
    manifest = read_manifest(src)
    doc = json.loads((src / INDEX_NAME).read_text())
    for name, body in doc["splits"].items():
        tables = SplitTables(manifest.split(name), len(manifest.classes), root=src)
        for s, shard in enumerate(body["shards"]):
            if tables.has("starts"):
                shard["offsets"] = encode_table((tables.starts(s) // BLOCK).tolist())
            for table in ("labels", "keys"):
                entries = tables.labels(s) if table == "labels" else tables.keys(s)
                if entries is not None:
                    shard[table] = encode_table(entries.tolist())
            paths = tables.sources(s)
            if paths is not None:
                shard["sources"] = encode_sources(paths)
            shard.pop("sources_bytes", None)
        body.pop("tables", None)
    doc["version"] = 1
    (dst / INDEX_NAME).write_text(json.dumps(doc))
    assert read_manifest(dst).version == 1
    return dst


@pytest.fixture(scope="session")
def tables_of():
    """``tables_of(root, split="train")``: the split's :class:`SplitTables`."""
    return split_tables


@pytest.fixture(scope="session")
def entries_of():
    """``entries_of(root, split="train")``: the split's fixed-width tables, whole (numpy copies)."""
    return table_entries


@pytest.fixture(scope="session")
def index_rewriter():
    """``index_rewriter(root, tables=..., drop=..., edit=...)``: see :func:`rewrite_index`."""
    return rewrite_index


@pytest.fixture(scope="session")
def format1():
    """``format1(src, dst)``: ``src`` as a dataset of index format 1 (see :func:`as_format1`)."""
    return as_format1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(script: Path, *args: str, timeout: float = 240) -> None:
    """Run ``script args`` on 2 ranks under torchrun, as users do; fail naming why if it fails or hangs."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(_free_port()), str(script), *args,
    ]  # fmt: skip
    # Not a rank of a launcher this test runs under: torchrun sets each rank's variables itself.
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")}
    # A session of its own: the ranks and their DataLoader workers are one process group to kill,
    # whether the run times out here or the test is stopped (pytest-timeout, Ctrl-C).
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun {script.name} timed out after {timeout:g} s; its stderr ended: {err[-3000:]}")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, out[-3000:] + err[-3000:]


@pytest.fixture(scope="session")
def torchrun():
    """``torchrun(script, *args)``: run a rank script on 2 ranks under real torchrun (gloo on localhost)."""
    return _torchrun


@pytest.fixture(scope="session")
def packed_corrupt(tree_factory, packed_factory):
    """Tiny tree with one JPEG cut in half, packed without checks so it lands in a shard."""
    src = tree_factory(classes=2, per_class=10, seed=5)
    victim = sorted(src.rglob("*.JPEG"))[3]
    victim.write_bytes(victim.read_bytes()[:300])
    return packed_factory(src, shard_size=20_000, check="none")
