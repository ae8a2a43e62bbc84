"""``ImageFolder``: torchvision's whole API, paths as scripts join them, targets and samples from the index.

Each test builds torchvision's ``ImageFolder`` on the source tree and imgshards' on the same tree
packed by the real ``pack``, and holds them to the same values and the same errors, positional
arguments and keywords alike. ``targets`` and ``samples`` come from the index's tables: an audit
hook counts every shard opened.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import datasets
from torchvision.datasets.folder import default_loader as torchvision_default_loader

from imgshards.converter import IndexConfig, index, pack
from imgshards.converter.config import PackConfig
from imgshards.converter.format.manifest import INDEX_NAME, read_manifest
from imgshards.loader import ConfigError, CorruptImageError, DatasetNotFoundError, ImageFolder


@pytest.fixture(scope="module")
def split_root(tiny_tree, tmp_path_factory) -> Path:
    """``data/train`` and ``data/val`` packed into one directory, each split by its folder's name."""
    data = tmp_path_factory.mktemp("data")
    os.symlink(tiny_tree, data / "train")
    os.symlink(tiny_tree, data / "val")
    packed = tmp_path_factory.mktemp("packed")
    for split in ("train", "val"):
        subprocess.run(
            [sys.executable, "-m", "imgshards.cli", "pack", str(data / split), str(packed), "-q"],
            check=True,
        )
    return packed


# ---- the constructor and attributes, value for value ------------------------------------------------


def test_every_attribute_is_torchvisions(tiny_tree, tiny_packed):
    ours, theirs = ImageFolder(tiny_packed), datasets.ImageFolder(str(tiny_tree))
    assert len(ours) == len(theirs)
    assert ours.classes == theirs.classes and ours.class_to_idx == theirs.class_to_idx
    assert ours.extensions == theirs.extensions
    assert type(ours.targets) is list and sorted(ours.targets) == sorted(theirs.targets)
    assert collections.Counter(ours.samples) == collections.Counter(theirs.samples)  # the files' paths
    assert ours.imgs == ours.samples and list(ours.imgs) == list(ours.samples)
    assert [label for _, label in ours.samples] == ours.targets
    assert ours.find_classes(tiny_packed) == theirs.find_classes(str(tiny_tree))
    assert ours[3][1] == ours.targets[3] == ours.samples[3][1]
    assert repr(ours).splitlines()[:2] == repr(theirs).splitlines()[:2]  # Dataset ImageFolder, datapoints
    assert isinstance(ours, datasets.VisionDataset)


def test_targets_are_used_as_torchvisions_list(tiny_packed):
    targets = ImageFolder(tiny_packed).targets
    counts = collections.Counter(targets)
    assert [targets.count(c) for c in range(4)] == [counts[c] for c in range(4)] == [10] * 4
    assert targets[targets.index(2)] == 2
    assert np.asarray(targets).tolist() == list(targets) == torch.tensor(targets).tolist()
    assert np.bincount(targets).tolist() == [10] * 4


@pytest.mark.parametrize("positional", [False, True])
def test_each_argument_by_position_or_keyword_does_what_torchvisions_does(tiny_tree, tiny_packed, positional):
    def build(cls, root, **kw):
        if positional:
            order = ("transform", "target_transform", "loader", "is_valid_file", "allow_empty")
            return cls(root, *(kw[k] for k in order))
        return cls(root, **kw)

    def keep(path: str) -> bool:  # a path filter, as scripts write them
        return not path.endswith(("3.JPEG", "3.jpg")) and "n00000001" not in path

    def grey(f):
        return Image.open(f).convert("L")

    args = dict(transform=lambda im: im.size, target_transform=lambda t: t + 100, allow_empty=True)
    theirs = build(datasets.ImageFolder, str(tiny_tree), loader=grey, is_valid_file=keep, **args)
    ours = build(ImageFolder, tiny_packed, loader=grey, is_valid_file=keep, **args)
    assert len(ours) == len(theirs) < 40
    assert ours.extensions is theirs.extensions is None  # as torchvision's, with is_valid_file
    assert collections.Counter(ours.samples) == collections.Counter(theirs.samples)
    assert sorted(ours.targets) == sorted(theirs.targets)
    assert collections.Counter(ours[i] for i in range(len(ours))) == collections.Counter(
        theirs[i] for i in range(len(theirs))
    )
    assert ours.loader is grey
    mode = ImageFolder(tiny_packed, None, None, grey)[0][0].mode
    assert mode == datasets.ImageFolder(str(tiny_tree), None, None, grey)[0][0].mode == "L"


def test_torchvisions_own_loaders_are_taken_as_ours(tiny_packed):
    image = ImageFolder(tiny_packed, loader=torchvision_default_loader)[0][0]
    assert image.mode == "RGB" and image.size == ImageFolder(tiny_packed)[0][0].size


def test_a_loader_that_opens_a_path_is_told_what_it_gets(tiny_packed):
    dataset = ImageFolder(tiny_packed, loader=lambda path: open(path, "rb"))  # noqa: SIM115
    with pytest.raises(ConfigError, match=r"loader .* gets a file object .* Image\.open\(f\)"):
        dataset[0]


def test_the_same_errors_as_torchvision(tiny_tree, tiny_packed, tmp_path):
    for cls, root in ((datasets.ImageFolder, str(tiny_tree)), (ImageFolder, tiny_packed)):
        with pytest.raises(FileNotFoundError):
            cls(str(tmp_path / "nothing-here"))
        with pytest.raises(FileNotFoundError, match=r"^Found no valid file for the classes n00000002, n0"):
            cls(root, is_valid_file=lambda p: "n00000000" in p or "n00000001" in p)
        assert len(cls(root, is_valid_file=lambda p: "n00000000" in p, allow_empty=True)) == 10
        with pytest.raises(TypeError, match="unexpected keyword argument 'extensions'"):
            cls(root, extensions=(".jpg",))
        with pytest.raises(TypeError):
            cls(root, None, None, None, None, False, "one too many")


def test_a_pickled_copy_keeps_its_filter_and_carries_no_list(tiny_packed):
    import pickle

    dataset = ImageFolder(tiny_packed, is_valid_file=lambda p: "n00000003" not in p, allow_empty=True)
    assert len(dataset.targets) == 30 and 3 not in dataset.targets
    copy = pickle.loads(pickle.dumps(ImageFolder(tiny_packed, is_valid_file=_not_class_3, allow_empty=True)))
    assert copy._targets is None and len(copy) == 30 and sorted(copy.targets) == sorted(dataset.targets)


def _not_class_3(path: str) -> bool:
    return "n00000003" not in path


# ---- paths as a script joins them ---------------------------------------------------------------------


def test_data_slash_train_and_val_read_those_splits(split_root, tiny_tree):
    train = ImageFolder(os.path.join(split_root, "train"))
    val = ImageFolder(os.path.join(str(split_root), "val"))
    assert (train.split, val.split, len(train), len(val)) == ("train", "val", 40, 40)
    assert sorted(read_manifest(split_root).splits) == ["train", "val"]
    assert ImageFolder(split_root / "val").root == str(split_root)


def test_a_split_folder_packed_on_its_own_is_named_by_its_folder(tiny_tree, tmp_path):
    os.symlink(tiny_tree, tmp_path / "val")
    out = tmp_path / "packed" / "val"
    done = subprocess.run(
        [sys.executable, "-m", "imgshards.cli", "pack", str(tmp_path / "val"), str(out), "-q"], check=True
    )
    assert done.returncode == 0
    info = subprocess.run(
        [sys.executable, "-m", "imgshards.cli", "info", str(out)], capture_output=True, text=True
    ).stdout
    assert "  val: 40 samples" in info and "train" not in info
    assert ImageFolder(out).split == "val" and len(ImageFolder(out)) == 40


def test_a_path_that_is_neither_names_the_splits_there(split_root):
    with pytest.raises(DatasetNotFoundError) as raised:
        ImageFolder(split_root / "test")
    message = str(raised.value)
    assert "no split 'test'" in message and "['train', 'val']" in message and "split=" in message
    assert "\n" not in message and isinstance(raised.value, FileNotFoundError)
    with pytest.raises(ConfigError, match="names split 'val', and split='train'"):
        ImageFolder(split_root / "val", split="train")


# ---- targets and samples from the index's tables -------------------------------------------------------


def shard_opens(code: str, root: Path) -> tuple[int, str]:
    """Run ``code`` (``ds`` bound to ``ImageFolder(root)``) in a fresh process; the .tar files it opened."""
    script = f"""
import sys
opened = []
from imgshards.loader import ImageFolder
ds = ImageFolder({str(root)!r})
def hook(event, args):
    if event == "open" and str(args[0]).endswith(".tar"):
        opened.append(args[0])
sys.addaudithook(hook)
{code}
print(len(opened))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    *out, count = done.stdout.split("\n")[:-1]
    return int(count), "\n".join(out)


def test_targets_and_samples_open_no_shard(tiny_packed):
    code = "print(len(ds.targets), len(ds.samples), ds.samples[0][0].count('/') > 1, ds.targets.count(0))"
    opened, out = shard_opens(code, tiny_packed)
    assert (opened, out) == (0, "40 40 True 10")
    opened, _ = shard_opens("ds[0]", tiny_packed)
    assert opened == 1  # the audit hook sees a read


@pytest.mark.parametrize("version", [1, 2])
def test_an_index_older_than_the_tables_reads_them_from_the_shards(
    tiny_packed, tmp_path, version, format1, index_rewriter
):
    old = tmp_path / "old"
    if version == 1:
        format1(tiny_packed, old)
        doc = json.loads((old / INDEX_NAME).read_text())
        for shard in doc["splits"]["train"]["shards"]:
            for table in ("labels", "keys", "sources"):
                del shard[table]
        (old / INDEX_NAME).write_text(json.dumps(doc))
    else:
        shutil.copytree(tiny_packed, old)
        index_rewriter(old, drop=["labels", "keys", "sources"])
    then, now = ImageFolder(old), ImageFolder(tiny_packed)
    assert then.targets == now.targets and list(then.samples) == list(now.samples)
    assert [then[i][1] for i in range(len(then))] == then.targets


def test_shards_another_tool_wrote_open_map_style_once_indexed(foreign_factory, tiny_tree):
    root, written = foreign_factory(tiny_tree)
    index(root, IndexConfig(workers=1))
    dataset = ImageFolder(root)
    assert len(dataset) == len(written) == 40
    labels = [dataset[i][1] for i in range(len(dataset))]
    assert labels == dataset.targets
    names = [path for path, _ in dataset.samples]
    assert all(name.endswith((".jpg", ".jpeg", ".png")) for name in names), names[:3]
    assert len(set(names)) == 40


def test_a_table_of_starts_shifted_by_one_never_reads_a_neighbour(
    tiny_tree, tmp_path, entries_of, index_rewriter
):
    root = tmp_path / "p"
    pack(tiny_tree, root, PackConfig(workers=1))  # one shard
    starts = entries_of(root)["starts"].tolist()
    index_rewriter(root, tables={"starts": [0, *starts[2:], starts[-1] + 1]})
    dataset = ImageFolder(root)
    for i in range(1, 8):
        with pytest.raises(CorruptImageError, match="is not where the index's table of starts says"):
            dataset[i]
