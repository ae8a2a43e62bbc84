"""A class in two sources of a mix is one label: classes merge by name (issue 37, point 13).

On 1bc048c a ``MixedDataset`` of A (cat, dog) and B (dog) had ``classes == ['cat', 'dog', 'dog']``
and gave A's dogs label 1, B's dogs label 2, without a warning. Now ``classes`` is the sorted union
of the sources' class names (as ``ImageFolder`` names them) and every source's labels are mapped
onto it. The images are solid colours, one a class, so a batch tells which class each image is.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from imgshards.loader import MixedDataset, make_loader

IDENTITY = torch.nn.Identity()
COLOURS = {"cat": (200, 30, 30), "dog": (30, 30, 200), "zebra": (30, 200, 30), "ant": (200, 200, 30)}


def make_source(root: Path, classes: dict[str, int]) -> Path:
    """An ImageFolder tree of solid-colour 32x32 JPEGs, ``classes[name]`` images a class."""
    for name, count in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (32, 32), COLOURS[name]).save(root / name / f"{name}_{i}.jpg", quality=95)
    return root


def class_of(image: torch.Tensor) -> str:
    """The class whose colour ``image`` (uint8 [3, H, W]) is."""
    mean = image.float().mean(dim=(1, 2))
    return min(COLOURS, key=lambda c: float((mean - torch.tensor(COLOURS[c], dtype=torch.float)).abs().sum()))


@pytest.fixture(scope="module")
def cats_dogs(tmp_path_factory, packed_factory):
    """A: cat and dog, 8 each; B: dog, 8; C: zebra and ant, 8 each (its own list, unsorted against A's)."""
    tmp = tmp_path_factory.mktemp("mix_classes")
    a = packed_factory(make_source(tmp / "a", {"cat": 8, "dog": 8}), shard_size=20_000)
    b = packed_factory(make_source(tmp / "b", {"dog": 8}), shard_size=20_000)
    c = packed_factory(make_source(tmp / "c", {"zebra": 8, "ant": 8}), shard_size=20_000)
    return a, b, c


def labelled(loader) -> list[tuple[str, int]]:
    return [
        (class_of(img), int(y)) for batch in loader for img, y in zip(batch.images, batch.labels, strict=True)
    ]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_class_two_sources_hold_is_one_label(cats_dogs, num_workers):
    a, b, _ = cats_dogs
    mix = MixedDataset([a, b], weights=[2, 1], batch_size=6, transform=IDENTITY)
    assert mix.classes == ["cat", "dog"]
    assert mix.class_to_idx == {"cat": 0, "dog": 1}
    seen = labelled(make_loader(mix, num_workers=num_workers))
    assert {name for name, _ in seen} == {"cat", "dog"} and len(seen) == len(mix) * 6
    assert all(label == mix.class_to_idx[name] for name, label in seen), seen
    # B's dogs are there, under A's dog label: 2 of each batch of 6 come from B.
    assert sum(name == "dog" for name, _ in seen) > sum(name == "cat" for name, _ in seen)


def test_disjoint_lists_merge_sorted_and_every_source_maps_onto_them(cats_dogs):
    a, b, c = cats_dogs
    mix = MixedDataset([a, b, c], weights=[1, 1, 1], batch_size=6, transform=IDENTITY)
    assert mix.classes == ["ant", "cat", "dog", "zebra"]
    seen = labelled(make_loader(mix, num_workers=0))
    assert {name for name, _ in seen} == set(mix.classes)
    assert all(label == mix.class_to_idx[name] for name, label in seen), seen


def test_a_resumed_mix_keeps_the_merged_labels(cats_dogs):
    a, b, _ = cats_dogs

    def mix():
        return MixedDataset([a, b], weights=[2, 1], batch_size=3, transform=IDENTITY)

    full = labelled(make_loader(mix(), num_workers=0))
    first = make_loader(mix(), num_workers=0)
    head = labelled([next(iter(first))])
    resumed = make_loader(mix(), num_workers=0)
    resumed.load_state_dict(first.state_dict())
    assert head + labelled(resumed) == full
    assert all(label == {"cat": 0, "dog": 1}[name] for name, label in full)
