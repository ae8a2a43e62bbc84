"""The one reader of every dataset (issue 49): ``loader/pipeline/splitreader.py``.

``ShardDataset`` and ``MixedDataset`` (their runs) and ``ImageFolder`` (a sample by its position)
read through :class:`SplitReader`: the split's tables (index format 2: files, mapped or fetched by
ranges; format 1: inside the index), the seek and the key there, the checked read of one sample,
the shards opened (each only while the dataset's index is the one it was made from). Here: both
datasets go through it and nothing else in the loader parses a shard or reads a table; format 2
and format 1 deliver the same epochs, resumed or not, through workers or not; a hostile table
never gives another sample; a dataset re-packed under an open one is refused, never read as the
old index says; a remote split fetches only the ranges of the tables its plan uses; and what a
worker gets pickled does not grow with the samples.
"""

from __future__ import annotations

import ast
import collections
import hashlib
import json
import os
import pickle
import shutil
import warnings
from itertools import islice, pairwise
from pathlib import Path

import numpy as np
import pytest
import torch

from imgshards.converter import PackConfig, pack
from imgshards.converter.format.errors import ManifestError
from imgshards.converter.format.manifest import INDEX_NAME, read_manifest
from imgshards.loader import (
    CorruptImageError,
    ImageFolder,
    MixedDataset,
    ShardAccessError,
    ShardDataset,
    make_loader,
)
from imgshards.loader.pipeline import splitreader
from imgshards.loader.pipeline.splitreader import IndexStamp, SplitReader

IDENTITY = torch.nn.Identity()
LOADER = Path(splitreader.__file__).resolve().parents[1]


def dataset(root, **kw) -> ShardDataset:
    kw.setdefault("batch_size", 8)
    kw.setdefault("transform", IDENTITY)
    kw.setdefault("seed", 3)
    return ShardDataset(root, **kw)


def epoch(root, lookup, *, num_workers=0, **kw) -> list[list[str]]:
    loader = make_loader(dataset(root, **kw), num_workers=num_workers)
    loader.set_epoch(1)
    return lookup.run_keys(loader)  # each image's label checked against its key's


def truth(root) -> list[tuple[bytes, int]]:
    """Every sample of ``root``'s train split by position: its pixels and label (a clean read)."""
    ds = ImageFolder(root, transform=lambda im: im.tobytes())
    return [ds[i] for i in range(len(ds))]


# ---- one reader --------------------------------------------------------------------------------------


def test_every_dataset_reads_its_shards_through_the_one_reader(packed_many, monkeypatch):
    opened: list[int] = []
    real_open = SplitReader.open
    monkeypatch.setattr(SplitReader, "open", lambda self, s: (opened.append(s), real_open(self, s))[1])
    ImageFolder(packed_many)[0]
    assert len(opened) == 1
    makes = [
        lambda: dataset(packed_many),
        lambda: MixedDataset([packed_many, packed_many], batch_size=8, transform=IDENTITY),
    ]
    for make in makes:
        opened.clear()
        next(iter(make_loader(make(), num_workers=0)))
        assert opened  # every run opens its shard there, checked as the index says


def _imports(path: Path) -> set[str]:
    """The names ``path`` imports from other modules (``from m import a, b``: a, b)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names.update(alias.name for alias in node.names)
    return names


def test_no_other_loader_module_parses_a_shard_or_reads_a_table():
    # The tar parser and the tables are read in two modules: the run's parser (pipeline/tar.py,
    # which splitreader drives) and splitreader itself. A third is a second reader.
    readers: dict[str, set[str]] = collections.defaultdict(set)
    for path in sorted(LOADER.rglob("*.py")):
        for name in _imports(path) & {
            "read_run",
            "SplitTables",
            "TarStream",
            "SampleReader",
            "checked_samples",
        }:
            readers[name].add(path.relative_to(LOADER).as_posix())
    assert readers["read_run"] == {"pipeline/splitreader.py"}
    assert readers["SplitTables"] <= {"pipeline/splitreader.py", "imagefolder.py"}  # imagefolder: a type
    for name in ("TarStream", "SampleReader", "checked_samples"):
        assert readers[name] <= {"pipeline/splitreader.py", "pipeline/tar.py"}, name


# ---- format 2 and format 1: the same samples -----------------------------------------------------------


@pytest.fixture(scope="module")
def v1(packed_many, tmp_path_factory, format1) -> Path:
    """``packed_many`` with an index of format 1 (its tables inside the index), the same shards."""
    return format1(packed_many, tmp_path_factory.mktemp("v1") / "ds")


def test_a_run_from_inside_a_shard_seeks_by_the_table_and_checks_the_key(packed_many, monkeypatch):
    seeks: list[tuple[int | None, int | None]] = []
    real = splitreader.read_run

    def recorded(*args, **kw):
        seeks.append((kw["offset"], kw["expect"]))
        return real(*args, **kw)

    monkeypatch.setattr(splitreader, "read_run", recorded)
    epoch_keys = [
        k for b in make_loader(dataset(packed_many, rank=1, world_size=2), num_workers=0) for k in b
    ]
    assert epoch_keys and any(offset for offset, _ in seeks)
    assert all(expect is not None for offset, expect in seeks if offset)  # every seek checks its key


@pytest.mark.parametrize("num_workers", [0, 2])
def test_format_2_and_format_1_deliver_the_same_epochs(packed_many, v1, lookup_many, num_workers):
    for kw in ({}, {"rank": 1, "world_size": 2}, {"mode": "eval", "rank": 0, "world_size": 3}):
        assert epoch(packed_many, lookup_many, num_workers=num_workers, **kw) == epoch(
            v1, lookup_many, num_workers=num_workers, **kw
        )


@pytest.mark.parametrize("version", [2, 1])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resume_mid_epoch_continues_exactly_in_either_format(
    packed_many, v1, lookup_many, version, num_workers
):
    root = packed_many if version == 2 else v1
    kw = {"rank": 1, "world_size": 2}
    full = epoch(root, lookup_many, num_workers=num_workers, **kw)
    for stop in (1, 3):
        loader = make_loader(dataset(root, **kw), num_workers=num_workers)
        loader.set_epoch(1)
        head = lookup_many.run_keys(islice(loader, stop))
        state = json.loads(json.dumps(loader.state_dict()))
        resumed = make_loader(dataset(root, **kw), num_workers=num_workers)
        resumed.load_state_dict(state)
        resumed.set_epoch(1)
        assert head + lookup_many.run_keys(resumed) == full, f"resume after {stop} batches"


def test_imagefolder_reads_format_1_as_format_2(packed_many, v1):
    new, old = ImageFolder(packed_many), ImageFolder(v1)
    assert new.reader.tables.version == 2 and old.reader.tables.version == 1
    assert len(new) == len(old) and new.targets == old.targets and list(new.samples) == list(old.samples)
    for i in range(len(new)):
        assert new[i][0].tobytes() == old[i][0].tobytes() and new[i][1] == old[i][1]


FORMAT1 = Path(__file__).resolve().parents[2] / "converter" / "format1"  # packed by 39ce913 itself


def test_a_dataset_the_last_release_packed_loads_in_both_datasets(tmp_path):
    root = tmp_path / "dataset"
    shutil.copytree(FORMAT1 / "dataset", root)  # never read in place: its index is in the repository
    assert read_manifest(root).version == 1
    folder = ImageFolder(root)
    assert folder.reader.tables.version == 1 and len(folder) == 6
    assert sorted(folder.samples) == sorted(
        (f"{c}/{c}_{i}.jpg", label) for label, c in enumerate(("cat", "dog")) for i in range(3)
    )
    images = [folder[i] for i in range(len(folder))]
    assert [label for _, label in images] == folder.targets and all(im.size == (16, 12) for im, _ in images)

    def labels(**kw) -> list[int]:
        batches = make_loader(dataset(root, batch_size=2, mode="eval", **kw), num_workers=0)
        return [label for b in batches for label in b.labels.tolist()]

    assert sorted(labels()) == sorted(folder.targets)
    ranks = labels(rank=0, world_size=2) + labels(rank=1, world_size=2)  # rank 1 seeks by the table
    assert sorted(ranks) == sorted(folder.targets)


# ---- what a worker gets: O(shards) ---------------------------------------------------------------------


def test_what_a_worker_gets_pickled_does_not_grow_with_the_samples(tree_factory, packed_factory):
    sizes = {}
    for per_class in (5, 100):  # 20 and 400 samples, one shard each
        root = packed_factory(tree_factory(classes=4, per_class=per_class, seed=1), max_samples=400)
        folder, streaming = ImageFolder(root), dataset(root)
        folder.targets, list(folder.samples), folder[0]  # the tables used: nothing of them is pickled
        next(iter(make_loader(dataset(root, rank=1, world_size=2), num_workers=0)))
        table = (root / read_manifest(root).split("train").tables["keys"].name).read_bytes()
        for name, ds in (("ImageFolder", folder), ("ShardDataset", streaming)):
            data = pickle.dumps(ds)
            assert table[:64] not in data or len(table) < 64
            sizes.setdefault(name, []).append(len(data))
            copy = pickle.loads(data)
            assert len(copy) == len(ds)
    for name, (small, large) in sizes.items():
        assert abs(large - small) < 600, (name, small, large)  # 380 samples more: no bytes for them


# ---- hostile tables: never another sample -------------------------------------------------------------


@pytest.fixture(scope="module")
def two_splits(tiny_tree, tmp_path_factory) -> Path:
    """``tiny_tree`` packed as train and val of 20 samples each, in shards of about 5."""
    root = tmp_path_factory.mktemp("two") / "ds"
    pack(tiny_tree, root, PackConfig(workers=1, val_fraction=0.5, max_samples=5))
    manifest = read_manifest(root)
    assert manifest.split("train").samples == manifest.split("val").samples == 20
    return root


def _shifted(starts: np.ndarray, first: list[int]) -> list[int]:
    """Each shard's starts moved one entry on: sample j is said to start where j + 1 does."""
    out = starts.tolist()
    for lo, hi in pairwise(first):
        out[lo:hi] = [*out[lo + 1 : hi], out[hi - 1] + 1]
    return out


def hostile(root: Path, where: Path, kind: str, index_rewriter, entries_of) -> Path:
    shutil.copytree(root, where)
    entries = entries_of(where)
    info = read_manifest(where).split("train")
    first = np.cumsum([0, *(s.samples for s in info.shards)]).tolist()
    if kind == "starts shifted":
        index_rewriter(where, tables={"starts": _shifted(entries["starts"], first)})
    elif kind == "keys of another split":
        index_rewriter(where, tables={"keys": entries_of(where, "val")["keys"].tolist()})
    else:  # a class id past the classes
        labels = entries["labels"].copy()
        labels[first[1] + 1] = len(read_manifest(where).classes)
        index_rewriter(where, tables={"labels": labels.tolist()})
    return where


KINDS = ["starts shifted", "keys of another split", "labels out of range"]


@pytest.mark.parametrize("kind", KINDS)
def test_imagefolder_reads_the_true_sample_or_raises_on_a_hostile_table(
    two_splits, tmp_path, kind, index_rewriter, entries_of
):
    true = truth(two_splits)
    ds = ImageFolder(
        hostile(two_splits, tmp_path / "ds", kind, index_rewriter, entries_of), lambda im: im.tobytes()
    )
    refused = []
    for i in range(len(ds)):
        try:
            got = ds[i]
        except (CorruptImageError, ManifestError) as e:
            assert "\n" not in str(e) and "imgshards verify" in str(e)
            refused.append(type(e))
            continue
        assert got == true[i], i  # never another sample's image
    assert refused
    if kind == "labels out of range":  # the table is refused where it is used: its shard's samples
        assert set(refused) == {ManifestError}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_shard_dataset_delivers_only_true_samples_on_a_hostile_table(
    two_splits, tmp_path, kind, index_rewriter, entries_of, lookup_factory
):
    root = hostile(two_splits, tmp_path / "ds", kind, index_rewriter, entries_of)
    lookup = lookup_factory(two_splits)
    kw = dict(batch_size=3, mode="eval", rank=1, world_size=2, max_lost=1.0)  # rank 1: its runs seek
    clean = dataset(two_splits, **kw)
    expected = [k for b in lookup.run_keys(make_loader(clean, num_workers=0)) for k in b]
    ds = dataset(root, **kw)
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        keys = [k for b in lookup.run_keys(make_loader(ds, num_workers=0)) for k in b]  # labels checked
    assert len(keys) == len(set(keys)) and set(keys) <= set(expected)  # nothing twice, none elsewhere's
    if kind == "labels out of range":  # a run reads labels from the shards: the table is not used
        assert keys == expected and ds.lost_samples == 0
    else:  # a seek that finds another key there: the run is damage, counted and told
        assert ds.lost_samples == len(expected) - len(keys) > 0
        assert any("is not where the index's table of starts says" in str(w.message) for w in told)


# ---- a dataset re-packed under an open one (issue 50, point 3) ------------------------------------------


def _pixels(root: Path) -> list[str]:
    ds = ImageFolder(root, transform=lambda im: hashlib.sha1(im.tobytes()).hexdigest())
    return [ds[i][0] for i in range(len(ds))]


def test_a_dataset_repacked_under_an_open_one_is_refused_never_read_as_the_old_index_says(
    tiny_tree, tmp_path
):
    src, dst = tmp_path / "train", tmp_path / "ds"
    shutil.copytree(tiny_tree, src)
    pack(src, dst, PackConfig(workers=1, seed=0))
    before = _pixels(dst)
    folder, streaming = ImageFolder(dst), dataset(dst, batch_size=4)
    forked = ImageFolder(dst)
    forked[0]  # a shard open in the training process: its forked workers open their own
    victim = sorted(src.rglob("*.JPEG"))[3]
    victim.rename(victim.with_name("zz-" + victim.name))  # same class, sorted elsewhere
    pack(src, dst, PackConfig(workers=1, seed=0, overwrite=True))
    assert _pixels(dst) != before  # what the old index says is at a position is another image now
    with pytest.raises(ShardAccessError, match=r"re-packed or re-indexed after this dataset was made.*again"):
        folder[0]
    with pytest.raises(ShardAccessError, match="re-packed"):
        next(iter(make_loader(streaming, num_workers=0)))
    with pytest.raises(Exception, match="re-packed"):  # in a DataLoader worker, re-raised here
        next(iter(torch.utils.data.DataLoader(forked, batch_size=4, num_workers=1)))
    # The shard it held open since before the re-pack is the old file, which the old index describes.
    assert hashlib.sha1(forked[0][0].tobytes()).hexdigest() == before[0]


def test_another_split_packed_beside_it_leaves_an_open_dataset_reading(tiny_tree, tmp_path):
    dst = tmp_path / "ds"
    pack(tiny_tree, dst, PackConfig(workers=1, seed=0))
    before = _pixels(dst)
    folder, streaming = (
        ImageFolder(dst, transform=lambda im: hashlib.sha1(im.tobytes()).hexdigest()),
        dataset(dst),
    )
    stamp = folder.reader.stamp
    pack(tiny_tree, dst, PackConfig(workers=1, split="val"))  # the index is another file: train as it was
    assert sorted(read_manifest(dst).splits) == ["train", "val"] and IndexStamp.of(dst) != stamp
    assert [folder[i][0] for i in range(len(folder))] == before
    assert sum(len(b.labels) for b in make_loader(streaming, num_workers=0)) == len(before)


def test_an_index_gone_refuses_the_next_shard_opened(packed_copy):
    folder = ImageFolder(packed_copy)
    os.unlink(packed_copy / INDEX_NAME)
    with pytest.raises(ShardAccessError, match=r"index\.json is gone"):
        folder[0]


# ---- remote: only the ranges of the tables the plan uses ------------------------------------------------


def test_a_remote_split_fetches_only_the_table_ranges_its_runs_seek_with(remote_packed, http_serve):
    base, state = http_serve(remote_packed)
    info = read_manifest(remote_packed).split("train")
    assert len(info.shards) > 2
    ds = ShardDataset(base, batch_size=4, transform=IDENTITY, mode="eval", rank=1, world_size=2, seed=3)
    local = ShardDataset(remote_packed, batch_size=4, transform=IDENTITY, mode="eval", rank=1, world_size=2)
    got = [b.labels.tolist() for b in make_loader(ds, num_workers=0)]
    assert got == [b.labels.tolist() for b in make_loader(local, num_workers=0)]
    first = np.cumsum([0, *(s.samples for s in info.shards)])
    shard_ranges = {(4 * int(lo), 4 * int(hi)) for lo, hi in pairwise(first)}
    tables = {f.name: t for t, f in info.tables.items()}
    asked = [
        (r.path.rsplit("/", 1)[-1], r.start, r.end)
        for r in state.gets()
        if r.path.rsplit("/", 1)[-1] in tables
    ]
    assert asked, "a run of rank 1 starts inside a shard: it seeks with the tables"
    assert {tables[name] for name, _, _ in asked} == {"starts", "keys"}  # no labels, no sources
    for _, start, end in asked:  # a shard's entries, never the whole file
        assert (start, end) in shard_ranges
