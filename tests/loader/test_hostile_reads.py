"""Hostile inputs, round 6: a map-style read is the sample the index names; a claim allocates nothing.

A hostile or stale ``index.json`` beside real shards packed by the real ``pack``: a table of starts
shifted by one sample, or wrong in one entry, never yields another sample (``ImageFolder`` checks
what it read against what the index names); a count no file can hold is refused in one line before
anything is sized from it; a shard that ends with no sample reads as empty.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imgshards.converter import pack
from imgshards.converter.config import PackConfig
from imgshards.converter.format.manifest import INDEX_NAME, read_manifest
from imgshards.converter.format.tables import TABLES
from imgshards.loader import ConfigError, CorruptImageError, ImageFolder, MixedDataset, ShardDataset

from .conftest import as_format1, rewrite_index, table_entries

HUGE = 10_737_418_240  # samples claimed by an index of a few KB


@pytest.fixture(scope="module")
def one_shard(tiny_tree, tmp_path_factory) -> Path:
    """``tiny_tree`` packed into one shard of 40 samples."""
    root = tmp_path_factory.mktemp("one")
    pack(tiny_tree, root, PackConfig(workers=1))
    assert len(read_manifest(root).split("train").shards) == 1
    return root


def rewritten(root: Path, where: Path, edit=None, **tables) -> Path:
    """``root``'s shards and tables (hard links) under ``where``, its index rewritten (``rewrite_index``)."""
    where.mkdir(parents=True, exist_ok=True)
    for path in [*root.glob("*.tar"), *root.glob("*.u32"), *root.glob("*.zlib")]:
        os.link(path, where / path.name)
    (where / INDEX_NAME).write_bytes((root / INDEX_NAME).read_bytes())
    rewrite_index(where, edit=edit, **tables)
    return where


def true_samples(root: Path) -> list[tuple[bytes, int]]:
    dataset = ImageFolder(root, transform=lambda im: im.tobytes())
    return [dataset[i] for i in range(len(dataset))]


# ---- 1: a read is the sample the index names ------------------------------------------------------------


@pytest.mark.parametrize("keep", [("keys", "labels"), ("keys",)])
def test_a_table_shifted_by_one_sample_never_reads_the_next(one_shard, tmp_path, keep):
    starts = table_entries(one_shard)["starts"].tolist()
    older = sorted({"keys", "labels", "sources"} - set(keep))  # as an index older than the table
    shifted = {"starts": [0, *starts[2:], starts[-1] + 1]}
    dataset = ImageFolder(rewritten(one_shard, tmp_path / "p", tables=shifted, drop=older))
    truth = true_samples(one_shard)
    for i in range(len(dataset)):
        try:
            image, label = dataset[i]
        except CorruptImageError as e:
            assert "\n" not in str(e) and "train-000000.tar" in str(e)
            continue
        assert (image.tobytes(), label) == truth[i], i  # pragma: no cover - the read must raise or be true
    with pytest.raises(CorruptImageError, match="table of starts"):  # sample 2 is where 1 is said to be
        dataset[1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_table_wrong_in_one_entry_gives_the_true_sample_or_raises(one_shard, data):
    shard = read_manifest(one_shard).split("train").shards[0]
    starts = table_entries(one_shard)["starts"].tolist()
    i = data.draw(st.integers(1, len(starts) - 1), label="entry")
    low, high = starts[i - 1] + 1, (starts[i + 1] - 1 if i + 1 < len(starts) else shard.bytes // 512 - 1)
    value = data.draw(st.integers(low, high).filter(lambda v: v != starts[i]), label="start")
    without_keys = data.draw(st.booleans(), label="without keys and labels")
    wrong = {"starts": [*starts[:i], value, *starts[i + 1 :]]}
    older = ("keys", "labels", "sources") if without_keys else ()

    truth = true_samples(one_shard)
    with tempfile.TemporaryDirectory() as tmp:
        rewrote = rewritten(one_shard, Path(tmp) / "p", tables=wrong, drop=older)
        dataset = ImageFolder(rewrote, transform=lambda im: im.tobytes())
        for j in (i - 1, i):
            try:
                got = dataset[j]
            except CorruptImageError:
                continue
            assert got == truth[j], (i, value, j)


# ---- 2, 3: a claimed count no file can hold -------------------------------------------------------------


@pytest.fixture(scope="module")
def huge(one_shard, tmp_path_factory) -> Path:
    """An index of a few KB claiming 10,737,418,240 samples in 20 shards of a few hundred KB each."""
    root = tmp_path_factory.mktemp("huge")
    doc = json.loads((one_shard / INDEX_NAME).read_text())
    real = doc["splits"]["train"]["shards"][0]
    per_shard = HUGE // 20
    shards = []
    for k in range(20):
        os.link(one_shard / real["name"], root / f"train-{k:06d}.tar")
        shards.append(
            {"name": f"train-{k:06d}.tar", "samples": per_shard, "bytes": 1 << 40, "sha256": real["sha256"]}
        )
    split = doc["splits"]["train"]
    split.update(shards=shards, samples=HUGE, bytes=20 << 40, class_counts=[HUGE, 0, 0, 0])
    split.pop("image_sizes", None)
    split.pop("tables", None)  # no table backs the claim
    (root / INDEX_NAME).write_text(json.dumps(doc))
    assert (root / INDEX_NAME).stat().st_size < 8192
    return root


def test_imagefolder_refuses_a_count_no_table_backs_without_allocating_it(huge):
    with pytest.raises(ConfigError, match="no table of sample starts"):  # its arrays are its tables' size
        ImageFolder(huge)


@pytest.mark.parametrize(
    "make", [lambda r: ShardDataset(r, batch_size=4), lambda r: MixedDataset([r, r], batch_size=4)]
)
def test_the_streaming_datasets_refuse_it_in_one_line(huge, make):
    with pytest.raises(ConfigError) as raised:
        make(huge)
    message = str(raised.value)
    assert "\n" not in message and "splits.train.samples is 10,737,418,240, over twice what its 20" in message


@pytest.mark.parametrize("command", ["info", "verify"])
def test_info_and_verify_say_it_without_a_traceback(huge, command):
    done = subprocess.run(
        [sys.executable, "-m", "imgshards.cli", command, str(huge)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr
    if command == "verify":
        assert done.returncode != 0


# ---- 4: a shard that ends empty ------------------------------------------------------------------------


def test_a_shard_left_empty_by_its_one_damaged_file_reads_as_empty(tiny_tree, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tiny_tree, src)
    victim = sorted(src.rglob("*.*"))[5]
    victim.write_bytes(b"not an image")
    root = tmp_path / "packed"
    pack(src, root, PackConfig(workers=1, max_samples=1))
    info = read_manifest(root).split("train")
    empty = [s for s in info.shards if s.samples == 0]
    assert len(empty) == 1 and empty[0].sources_bytes is not None
    dataset = ImageFolder(root)
    assert len(dataset) == 39 and len(dataset.targets) == 39 and len(dataset.samples) == 39
    dataset[len(dataset) - 1]

    # Format 1: an empty table for the empty shard; an index written by bc91b27: no table at all for it.
    older = as_format1(root, tmp_path / "v1")
    assert [s.offsets for s in read_manifest(older).split("train").shards if s.samples == 0] == [""]
    assert len(ImageFolder(older)) == 39
    doc = json.loads((older / INDEX_NAME).read_text())
    for shard in doc["splits"]["train"]["shards"]:
        if shard["samples"] == 0:
            for table in TABLES:
                shard.pop(table, None)
    (older / INDEX_NAME).write_text(json.dumps(doc))
    dataset = ImageFolder(older)
    assert len(dataset) == 39 and dataset.targets == ImageFolder(root).targets
    dataset[len(dataset) - 1]
