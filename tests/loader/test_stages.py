"""The loader's stages in webdataset's protocol: hand-built pipelines, and user stages inside ShardDataset.

Shards written by webdataset's ShardWriter and indexed by ``imgshards index`` (``.cls`` ids and a
``.json`` holding the class name); images untransformed, so each maps back to its sample by its
pixels. Ranks are emulated with ``rank=`` / ``world_size=`` (test_stages_distributed.py runs gloo).

A batch is cut before a user stage runs (loader/pipeline/batches.py): train mode makes up what a
filter drops, eval counts it.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from itertools import islice

import pytest
import torch
import webdataset as wds
from torch.utils.data import DataLoader

from imgshards.converter import IndexConfig, index
from imgshards.loader import ConfigError, ShardDataset, make_loader, stages
from imgshards.loader.image.decode import decode

IDENTITY = torch.nn.Identity()
NAMES = ("n00000000", "n00000001", "n00000002", "n00000003")
REVERSED = tuple(reversed(NAMES))


def dropped(sample) -> bool:
    """The filter of these tests: drops every sample whose file number is a multiple of 3."""
    return int(sample["__key__"].rsplit("_", 1)[-1]) % 3 == 0


@pytest.fixture
def foreign(foreign_factory, tiny_tree, hash_image):
    """40 samples in 7-sample shards; what each sample's pixels are, and whether the filter keeps it."""
    root, samples = foreign_factory(tiny_tree, per_shard=7, shuffle=True)
    index(root, IndexConfig(workers=1))
    for s in samples:
        s["hash"] = hash_image(decode(s["jpg"], "jpg"))
        s["kept"] = not dropped({"__key__": s["key"]})
    return root, samples


def user_stages():
    """A filter and a map that takes the label from the .json (names, given in reverse order)."""
    return [wds.select(lambda s: not dropped(s)), stages.label_from_json("label", classes=REVERSED)]


def pairs(batches, hash_image) -> list[tuple[str, int]]:
    return [(hash_image(img), int(y)) for b in batches for img, y in zip(b.images, b.labels, strict=True)]


def test_eval_delivers_every_kept_sample_once_and_reports_the_dropped(foreign, hash_image):
    root, samples = foreign
    kept = Counter((s["hash"], 3 - s["id"]) for s in samples if s["kept"])
    got: Counter[tuple[str, int]] = Counter()
    filtered = 0
    for rank in (0, 1):
        ds = ShardDataset(
            root,
            mode="eval",
            batch_size=4,
            transform=IDENTITY,
            rank=rank,
            world_size=2,
            raw_stages=user_stages(),
        )
        with pytest.warns(RuntimeWarning, match=r"stages dropped \d+ sample\(s\) on this rank; they are not"):
            got.update(pairs(make_loader(ds, num_workers=2), hash_image))
        filtered += ds.filtered_samples
    assert got == kept
    assert filtered == sum(not s["kept"] for s in samples) > 0


@pytest.mark.parametrize("num_workers", [0, 2])
def test_train_keeps_len_full_batches_of_kept_samples_on_every_rank(foreign, hash_image, num_workers):
    root, samples = foreign
    kept = {(s["hash"], 3 - s["id"]) for s in samples if s["kept"]}
    for rank in (0, 1):
        ds = ShardDataset(
            root, batch_size=4, transform=IDENTITY, rank=rank, world_size=2, raw_stages=user_stages()
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            batches = list(make_loader(ds, num_workers=num_workers))
        assert len(batches) == len(ds) == 5 and all(len(b.labels) == 4 for b in batches)
        assert set(pairs(batches, hash_image)) <= kept  # made-up samples repeat kept ones
        assert ds.filtered_samples > 0


def test_resume_with_a_random_filter_is_exact(foreign):
    """A filter that draws from torch's generator is seeded per batch: resuming repeats its choices."""
    root, _ = foreign

    def loader():
        coin = wds.select(lambda s: bool(torch.rand(()) < 0.7))
        ds = ShardDataset(root, batch_size=4, transform=IDENTITY, raw_stages=[coin])
        return make_loader(ds, num_workers=2)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        full = [b.images for b in loader()]
        first = loader()
        head = [b.images for b in islice(first, 3)]
        second = loader()
        second.load_state_dict(first.state_dict())
        tail = [b.images for b in second]
    assert len(full) == len(head) + len(tail) == 10
    assert all(torch.equal(x, y) for x, y in zip(head + tail, full, strict=True))


def test_image_stages_run_after_augmentation(foreign):
    root, samples = foreign

    def target_transform(sample):
        return {**sample, "__label__": 100 + sample["__label__"]}

    def not_class_2(sample):
        assert sample["image"].shape == (3, 8, 8)  # after the transform
        return sample["__label__"] != 102

    ds = ShardDataset(
        root,
        mode="eval",
        batch_size=8,
        transform=lambda img: img[:, :8, :8],
        image_stages=[wds.map(target_transform), wds.select(not_class_2)],
    )
    with pytest.warns(RuntimeWarning, match="stages dropped 10 sample"):
        batches = list(make_loader(ds, num_workers=0))
    assert all(b.images.shape[1:] == (3, 8, 8) for b in batches) and ds.filtered_samples == 10
    expected = sorted(100 + s["id"] for s in samples if s["id"] != 2)
    assert sorted(int(y) for b in batches for y in b.labels) == expected
    with pytest.raises(ConfigError, match="image_stages run in the workers"):
        ShardDataset(root, image_stages=[wds.map(target_transform)], decode_on="cpu")
    with pytest.raises(ConfigError, match=r"raw_stages\[0\] is 3"):
        ShardDataset(root, raw_stages=[3])


def test_a_custom_decoder_in_the_raw_stages(foreign):
    root, _ = foreign

    def gray(sample):
        image = decode(sample["jpg"], "jpg").float().mean(0, keepdim=True).to(torch.uint8)
        return {**sample, "image": image.expand(3, -1, -1).contiguous()}

    ds = ShardDataset(root, mode="eval", batch_size=8, transform=IDENTITY, raw_stages=[wds.map(gray)])
    for b in make_loader(ds, num_workers=0):
        assert torch.equal(b.images[:, 0], b.images[:, 1])


def test_a_hand_built_webdataset_pipeline_over_the_ranks(foreign, hash_image):
    """stages.samples replaces split_by_node / split_by_worker: over the ranks every sample once."""
    root, samples = foreign
    seen = Counter()
    for rank in (0, 1):
        ds = ShardDataset(root, mode="eval", batch_size=4, rank=rank, world_size=2)
        pipeline = wds.DataPipeline(
            stages.samples(ds),
            wds.select(lambda s: json.loads(s["json"])["label"] in NAMES),
            wds.decode("torchrgb8", only=["jpg"]),  # webdataset's own decoder: members are bytes
            wds.to_tuple("jpg", "__label__"),
            wds.batched(4),
        )
        for images, labels in DataLoader(pipeline, batch_size=None, num_workers=2):
            seen.update((hash_image(img), int(y)) for img, y in zip(images, labels, strict=True))
    assert seen == Counter((s["hash"], s["id"]) for s in samples)


def test_imgshards_sample_stages_in_a_hand_built_pipeline(foreign):
    root, samples = foreign
    ds = ShardDataset(root, mode="eval", batch_size=4)
    pipeline = wds.DataPipeline(
        stages.samples(ds),
        stages.label_from_json("label", classes=REVERSED),
        stages.decode(),
        stages.augment(lambda img: img[:, :16, :16]),
        wds.to_tuple("image", "__label__"),
        wds.batched(8),
    )
    batches = list(pipeline)
    assert sum(len(labels) for _, labels in batches) == 40
    assert all(images.shape[1:] == (3, 16, 16) for images, _ in batches)
    assert sorted(int(y) for _, labels in batches for y in labels) == sorted(3 - s["id"] for s in samples)
