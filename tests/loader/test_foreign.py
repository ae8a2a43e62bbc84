"""ShardDataset over shards webdataset's ShardWriter wrote, once ``imgshards index`` has indexed them.

Every sample must come back exactly once with its own label, whether the label is read from the
``.cls`` member or from a ``.json`` field (a class id, or a class name looked up in the index).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from imgshards.converter import IndexConfig, index
from imgshards.loader import ShardDataset, make_loader
from imgshards.loader.image.decode import decode

IDENTITY = torch.nn.Identity()


@pytest.fixture
def foreign(foreign_factory, tiny_tree):
    return foreign_factory(tiny_tree, per_shard=7, shuffle=True)


def delivered(root, num_workers: int, pixel_hash) -> Counter[tuple[str, int]]:
    ds = ShardDataset(root, mode="eval", batch_size=6, transform=IDENTITY)
    loader = make_loader(ds, num_workers=num_workers)
    out = Counter((pixel_hash(image), int(label)) for b in loader for image, label in zip(*b, strict=True))
    assert ds.corrupt_skipped == ds.truncated_shards == 0
    return out


@pytest.mark.parametrize(
    ("config", "label_of"),
    [
        (IndexConfig(workers=1), lambda s, names: s["id"]),
        (IndexConfig(label_field="id", workers=1), lambda s, names: s["id"]),
        (IndexConfig(label_field="label", workers=1), lambda s, names: names.index(s["class"])),
        # Class names given in another order: a label is the name's position in that list.
        (
            IndexConfig(label_field="label", classes=("n00000003", "n00000002", "n00000001", "n00000000")),
            lambda s, names: 3 - s["id"],
        ),
    ],
    ids=["cls", "json-id", "json-name", "json-name-given-classes"],
)
def test_every_sample_round_trips_with_its_label(foreign, config, label_of, hash_image):
    root, samples = foreign
    index(root, config)
    names = sorted({s["class"] for s in samples})
    expected = Counter((hash_image(decode(s["jpg"], "jpg")), label_of(s, names)) for s in samples)
    assert len(expected) == 40
    assert delivered(root, 0, hash_image) == expected
    assert delivered(root, 2, hash_image) == expected


def test_train_mode_over_indexed_shards_gives_equal_batches_per_rank(foreign, hash_image):
    root, _ = foreign
    index(root, IndexConfig(label_field="label", workers=1))
    seen = []
    for rank in (0, 1):
        ds = ShardDataset(root, batch_size=8, transform=IDENTITY, rank=rank, world_size=2)
        batches = list(make_loader(ds, num_workers=2))
        assert len(batches) == len(ds) == 3
        seen += [hash_image(image) for b in batches for image in b.images]
    assert len(seen) == len(set(seen)) == 40
