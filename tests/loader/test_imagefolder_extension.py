"""``ImageFolder`` through torchvision's extension points (issue 50, points 7-9, 11-13, 17).

A drop-in is used the way torchvision's class is used, subclasses included: each test does the same
thing to torchvision's ``ImageFolder`` on the source tree and to imgshards' on that tree packed, and
holds them to the same classes, samples, paths, images and labels. The images are compared pixel for
pixel with the files ``samples`` names (``pack`` stores these JPEGs as they are).
"""

from __future__ import annotations

import collections
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from torchvision import datasets
from torchvision.datasets.folder import default_loader as torchvision_default_loader

from imgshards.converter import IndexConfig, PackConfig, index, pack
from imgshards.loader import CorruptImageError, DatasetNotFoundError, ImageFolder
from imgshards.loader.imagefolder import default_loader


def pixels(image: Image.Image) -> bytes:
    return np.asarray(image.convert("RGB")).tobytes()


def file_pixels(path: str) -> bytes:
    with Image.open(path) as image:
        return pixels(image)


def read_all(dataset) -> list[tuple[bytes, int]]:
    """``(pixels, target)`` of every ``dataset[i]``, in order."""
    return [(pixels(image), target) for image, target in (dataset[i] for i in range(len(dataset)))]


def each_is_its_file(dataset) -> None:
    """Every ``dataset[i]`` is the image of the file ``samples[i]`` names, with its class id."""
    assert len(dataset) == len(dataset.samples)
    for i, (path, target) in enumerate(dataset.samples):
        image, label = dataset[i]
        assert (pixels(image), label) == (file_pixels(path), target), (i, path)


class Recorder:
    """An ``is_valid_file`` that notes every path it is given and refuses those ending with ``refused``."""

    def __init__(self, refused: str = "\0") -> None:
        self.seen: list[str] = []
        self.refused = refused

    def __call__(self, path: str) -> bool:
        self.seen.append(path)
        return not path.endswith(self.refused)


def pack_cli(src: Path, dst: Path) -> None:
    subprocess.run([sys.executable, "-m", "imgshards.cli", "pack", str(src), str(dst), "-q"], check=True)


# ---- 7: a subclass's find_classes -------------------------------------------------------------------


class _TwoClasses:
    """Keeps two classes, numbered the other way round, as a script's subclass does."""

    def find_classes(self, directory):
        classes, _ = super().find_classes(directory)  # type: ignore[misc]
        keep = [classes[3], classes[1]]
        return keep, {name: i for i, name in enumerate(keep)}


class TwoClasses(_TwoClasses, ImageFolder):
    pass


class TorchvisionTwoClasses(_TwoClasses, datasets.ImageFolder):
    pass


def two_classes_renumbered(base):
    """``base`` subclassed to keep two classes, numbered the other way round (module-level: picklable)."""
    return TwoClasses if base is ImageFolder else TorchvisionTwoClasses


def test_a_subclass_find_classes_chooses_the_classes_samples_and_ids(tiny_tree, tiny_packed):
    theirs = two_classes_renumbered(datasets.ImageFolder)(str(tiny_tree))
    ours = two_classes_renumbered(ImageFolder)(tiny_packed)
    assert (ours.classes, ours.class_to_idx) == (theirs.classes, theirs.class_to_idx)
    assert ours.class_to_idx == {"n00000003": 0, "n00000001": 1}
    assert len(ours) == len(theirs) == 20
    assert collections.Counter(ours.samples) == collections.Counter(theirs.samples)
    assert sorted(ours.targets) == sorted(theirs.targets) == [0] * 10 + [1] * 10
    assert ours.targets == [label for _, label in ours.samples] == [ours[i][1] for i in range(len(ours))]
    each_is_its_file(ours)
    copy = pickle.loads(pickle.dumps(ours))  # what a spawned worker gets: the same dataset
    assert copy.targets == ours.targets and read_all(copy) == read_all(ours)


def test_a_subclass_find_classes_merges_or_names_a_missing_class_as_torchvisions(tiny_tree, tiny_packed):
    class Merged:  # two classes under one id: each keeps its samples
        def find_classes(self, directory):
            return ["a", "b"], {"n00000000": 0, "n00000001": 0, "n00000002": 1}

    class Missing:
        def find_classes(self, directory):
            return ["n00000000", "nope"], {"n00000000": 0, "nope": 1}

    class Nothing:
        def find_classes(self, directory):
            return [], {}

    for base, root in ((datasets.ImageFolder, str(tiny_tree)), (ImageFolder, tiny_packed)):
        merged = type("M", (Merged, base), {})(root)
        assert len(merged) == 30 and sorted(collections.Counter(merged.targets).values()) == [10, 20]
        assert [merged[i][1] for i in range(len(merged))] == [t for _, t in merged.samples]
        with pytest.raises(FileNotFoundError, match=r"^Found no valid file for the classes nope\. Supported"):
            type("X", (Missing, base), {})(root)
        assert len(type("X", (Missing, base), {})(root, allow_empty=True)) == 10
        with pytest.raises(ValueError, match="must have at least one entry"):
            type("N", (Nothing, base), {})(root)


def test_is_valid_file_sees_only_the_classes_find_classes_keeps(tiny_tree, tiny_packed):
    theirs, ours = Recorder("_3.JPEG"), Recorder("_3.JPEG")
    assert len(TorchvisionTwoClasses(str(tiny_tree), is_valid_file=theirs)) == 18
    assert len(TwoClasses(tiny_packed, is_valid_file=ours)) == 18
    assert sorted(ours.seen) == sorted(theirs.seen)  # the same paths, those of the kept classes


def test_the_default_find_classes_touches_no_table(tiny_packed, monkeypatch):
    from imgshards.converter.format.tablefiles import SplitTables

    def refused(*args, **kwargs):
        raise AssertionError("a table read while the dataset is built")

    monkeypatch.setattr(SplitTables, "all_labels", refused)
    monkeypatch.setattr(SplitTables, "sources", refused)
    ds = ImageFolder(tiny_packed)
    assert len(ds) == 40 and ds._kept is None and ds._class_ids is None


# ---- 8: find_classes on a class-folder tree ----------------------------------------------------------


def test_find_classes_on_a_tree_lists_its_class_folders(tiny_tree, tiny_packed, tmp_path):
    ours, theirs = ImageFolder(tiny_packed), datasets.ImageFolder(str(tiny_tree))
    assert ours.find_classes(tiny_tree) == theirs.find_classes(str(tiny_tree))
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    assert ours.find_classes(tmp_path) == theirs.find_classes(tmp_path) == (["a", "b"], {"a": 0, "b": 1})
    assert ours.find_classes(tiny_packed) == theirs.find_classes(str(tiny_tree))  # a packed one: its index
    with pytest.raises(FileNotFoundError, match="Couldn't find any class folder"):
        ours.find_classes(tmp_path / "a")
    with pytest.raises(DatasetNotFoundError):
        ours.find_classes(tmp_path / "nothing-here")


# ---- 9: samples, imgs and targets set ---------------------------------------------------------------


def test_samples_set_to_a_subset_make_the_dataset_those_samples(tiny_tree, tiny_packed):
    ours, theirs = ImageFolder(tiny_packed), datasets.ImageFolder(str(tiny_tree))
    first = list(ours.samples[:5])
    expected = [(file_pixels(path), target) for path, target in first]
    ours.samples = ours.samples[:5]
    theirs.samples = theirs.samples[:5]
    assert len(ours) == len(theirs) == 5
    assert list(ours.samples) == first and read_all(ours) == expected
    assert ours.targets == [t for _, t in first] and list(ours.imgs) == first
    with pytest.raises(IndexError):
        ours[5]


def test_samples_filtered_reordered_or_relabelled_as_torchvisions(tiny_tree, tiny_packed):
    ours, theirs = ImageFolder(tiny_packed), datasets.ImageFolder(str(tiny_tree))
    for ds in (ours, theirs):
        ds.samples = [s for s in ds.samples if s[1] != 2 and not s[0].endswith("_7.JPEG")]
    assert len(ours) == len(theirs) == 27
    assert collections.Counter(ours.samples) == collections.Counter(theirs.samples)
    each_is_its_file(ours)
    flipped = [(path, 1 - (target % 2)) for path, target in reversed(ours.samples)]
    ours.samples = flipped
    assert list(ours.samples) == flipped and ours.targets == [t for _, t in flipped]
    assert read_all(ours) == [(file_pixels(path), target) for path, target in flipped]
    copy = pickle.loads(pickle.dumps(ours))
    assert list(copy.samples) == flipped and read_all(copy) == read_all(ours)
    assert b".JPEG" not in pickle.dumps(ours)  # arrays of positions and ids, no path


def test_imgs_and_targets_set_are_kept_and_read_by_nothing_as_torchvisions(tiny_tree, tiny_packed):
    ours, theirs = ImageFolder(tiny_packed), datasets.ImageFolder(str(tiny_tree))
    for ds in (ours, theirs):
        ds.imgs = ds.imgs[:5]
        ds.targets = ds.targets[:3]
        assert (len(ds), len(ds.imgs), len(ds.targets), len(ds.samples)) == (40, 5, 3, 40)
    assert ours[39][1] == ours.samples[39][1]


def test_samples_set_to_a_path_not_the_datasets_is_refused_naming_it(tiny_packed):
    ds = ImageFolder(tiny_packed)
    with pytest.raises(
        ValueError, match=r"item 1 of the samples set, '/no/such\.jpg', is not the path of a sample"
    ):
        ds.samples = [ds.samples[0], ("/no/such.jpg", 0)]
    with pytest.raises(ValueError, match=r"samples are \(path, class id\) pairs.* item 0 is"):
        ds.samples = ["just a path"]
    with pytest.raises(ValueError, match="pairs"):
        ds.samples = [(ds.samples[0][0], "cat")]
    assert len(ds) == 40  # a refused assignment leaves the dataset as it was
    ds.samples = []
    assert len(ds) == 0 and ds.targets == []


# ---- 11: self.loader(path) in a subclass --------------------------------------------------------------


class _WithPaths:
    """The ``ImageFolderWithPaths`` scripts write: torchvision's ``__getitem__``, the path returned too."""

    samples: Any
    loader: Any
    transform: Any

    def __getitem__(self, index):
        path, target = self.samples[index]
        sample = self.loader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        return sample, target, path


class ImageFolderWithPaths(_WithPaths, ImageFolder):
    pass


class TorchvisionImageFolderWithPaths(_WithPaths, datasets.ImageFolder):
    pass


def with_paths(base):
    """``base`` with the ``__getitem__`` of :class:`_WithPaths`."""
    return ImageFolderWithPaths if base is ImageFolder else TorchvisionImageFolderWithPaths


@pytest.mark.parametrize("loader", [None, torchvision_default_loader])
def test_a_subclass_loading_samples_paths_gets_their_images(tiny_tree, tiny_packed, loader):
    kw = {} if loader is None else {"loader": loader}
    theirs = with_paths(datasets.ImageFolder)(str(tiny_tree), **kw)
    ours = with_paths(ImageFolder)(tiny_packed, **kw)

    def items(ds):
        return collections.Counter(
            (pixels(img), target, path) for img, target, path in (ds[i] for i in range(len(ds)))
        )

    assert items(ours) == items(theirs)
    assert ours.loader(ours.samples[7][0]).size == ImageFolder(tiny_packed)[7][0].size
    path = ours.samples[3][0]
    fresh = with_paths(ImageFolder)(tiny_packed)  # no samples[i] read before: the path looked up
    assert pixels(fresh.loader(Path(path))) == file_pixels(path)


def test_a_path_that_is_no_sample_is_refused_in_one_line(tiny_packed):
    ds = ImageFolder(tiny_packed)
    with pytest.raises(
        FileNotFoundError, match=r"'/etc/passwd', is not the path of a sample .* ds\[i\]"
    ) as raised:
        ds.loader("/etc/passwd")
    assert "\n" not in str(raised.value)
    with pytest.raises(TypeError, match=r"default_loader reads a file object .* ds\.loader\(path\)"):
        default_loader(ds.samples[0][0])  # the module's function has no dataset to look it in


def test_a_damaged_sample_loaded_by_its_path_names_it(packed_corrupt):
    ds = ImageFolder(packed_corrupt)
    damaged = [path for i, (path, _) in enumerate(ds.samples) if _raises(ds, i)]
    assert damaged
    with pytest.raises(CorruptImageError, match="does not decode"):
        ds.loader(damaged[0])


def _raises(ds, i) -> bool:
    try:
        ds[i]
    except CorruptImageError:
        return True
    return False


# ---- 12: class_to_idx set on name-labelled shards ------------------------------------------------------


def test_class_to_idx_set_changes_nothing_read_as_torchvisions(foreign_factory, tiny_tree):
    root, _ = foreign_factory(tiny_tree)
    index(root, IndexConfig(workers=1, label_field="label"))  # labels are class names
    ds = ImageFolder(root)
    before = read_all(ds)
    reversed_ids = {name: len(ds.classes) - 1 - i for name, i in ds.class_to_idx.items()}
    ds.class_to_idx = reversed_ids
    assert ds.class_to_idx is reversed_ids and read_all(ds) == before
    ds.class_to_idx.clear()
    assert read_all(ds) == before and ds.targets == [t for _, t in before]
    theirs = datasets.ImageFolder(str(tiny_tree))
    first = theirs[0][1]
    theirs.class_to_idx = {}
    assert theirs[0][1] == first  # torchvision's: the ids were chosen when it was made


# ---- 13: data/train after `pack data/train data` ----------------------------------------------------


def test_a_tree_packed_into_its_parent_is_read_by_its_path(tiny_tree, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(tiny_tree, data / "train")
    pack_cli(data / "train", data)
    ds = ImageFolder(data / "train")  # the tree is still there: the split of data it was packed into
    assert (ds.root, ds.split, len(ds)) == (str(data), "train", 40)
    assert ImageFolder(os.path.join(data, "train"), split="train").split == "train"
    shutil.copytree(tiny_tree, data / "val")  # a tree data has no split of: still "pack it"
    with pytest.raises(DatasetNotFoundError, match=r"is an ImageFolder tree .* `imgshards pack"):
        ImageFolder(data / "val")


def test_a_packed_dataset_at_the_path_wins_over_a_split_of_its_parent(tiny_tree, tmp_path):
    data = tmp_path / "data"
    pack(tiny_tree, data, PackConfig(workers=1, max_samples=12))  # data: split train, 12 samples
    pack(tiny_tree, data / "train", PackConfig(workers=1))  # data/train: a dataset of its own, 40
    ds = ImageFolder(data / "train")
    assert (ds.root, len(ds)) == (str(data / "train"), 40)


def test_an_empty_split_name_is_refused_as_any_unknown_one(tiny_packed):
    with pytest.raises(DatasetNotFoundError, match=r"no split '' in the packed dataset .* \['train'\]"):
        ImageFolder(tiny_packed, split="")


# ---- 17: the paths of samples ------------------------------------------------------------------------


def test_samples_paths_are_the_files_torchvision_names(tiny_tree, tiny_packed):
    ours, theirs = ImageFolder(tiny_packed), datasets.ImageFolder(str(tiny_tree))
    assert collections.Counter(ours.samples) == collections.Counter(theirs.samples)
    assert all(os.path.isfile(path) for path, _ in ours.samples)
    each_is_its_file(ours)
    seen = Recorder()
    ImageFolder(tiny_packed, is_valid_file=seen)
    assert sorted(seen.seen) == sorted(path for path, _ in theirs.samples)  # is_valid_file gets them too


def test_a_tree_gone_leaves_the_paths_relative_to_it(tiny_tree, tmp_path):
    tree, out = tmp_path / "photos", tmp_path / "packed"
    shutil.copytree(tiny_tree, tree)
    pack(tree, out, PackConfig(workers=1))
    theirs = sorted(os.path.relpath(path, tree) for path, _ in datasets.ImageFolder(str(tree)).samples)
    shutil.rmtree(tree)
    ds = with_paths(ImageFolder)(out)
    assert sorted(path for path, _ in ds.samples) == theirs  # n00000000/n00000000_0.JPEG, ...
    image, target, path = ds[5]
    assert (path, target) == ds.samples[5] and image.size == ImageFolder(out)[5][0].size
