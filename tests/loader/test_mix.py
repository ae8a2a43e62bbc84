"""MixedDataset: two datasets in one loader, weighted: proportions, equal batches per rank, exact resume.

Source A is ``packed_many`` (115 samples of 5 classes, packed); source B is 40 samples of 4 other
classes written by webdataset's ShardWriter and indexed (named ``0`` to ``3``): their class lists
differ, so the mix merges them by name and B's labels (those of its names) tell the sources apart.
"""

from __future__ import annotations

import warnings
from collections import Counter
from itertools import islice

import pytest
import torch

from imgshards.converter import IndexConfig, index
from imgshards.loader import ConfigError, MixedDataset, ShardDataset, ShardReadError, make_loader
from imgshards.loader.pipeline.spec import split_batch

IDENTITY = torch.nn.Identity()


@pytest.fixture
def sources(packed_many, foreign_factory, tiny_tree):
    b, _ = foreign_factory(tiny_tree, per_shard=7, shuffle=True)
    index(b, IndexConfig(workers=1))
    return packed_many, b


def test_batches_split_by_weights():
    assert split_batch(8, [3, 1]) == [6, 2]
    assert split_batch(10, [1, 1, 1]) == [4, 3, 3]
    assert split_batch(64, [115, 40]) == [47, 17]
    with pytest.raises(ConfigError, match="under one sample in a batch of 8"):
        split_batch(8, [100, 1])
    with pytest.raises(ConfigError, match="positive"):
        split_batch(8, [1, 0])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_batch_holds_the_weights_share_and_ranks_yield_equal_batches(sources, num_workers):
    a, b = sources
    lens, per_source = [], Counter()
    for rank in (0, 1):
        ds = MixedDataset([a, b], weights=[3, 1], batch_size=8, transform=IDENTITY, rank=rank, world_size=2)
        assert ds.shares == [6, 2] and ds.classes == ["0", "1", "2", "3", *ShardDataset(a).classes]
        of_b = {ds.class_to_idx[name] for name in ShardDataset(b).classes}
        assert of_b == {0, 1, 2, 3}
        batches = list(make_loader(ds, num_workers=num_workers))
        lens.append(len(batches))
        assert len(batches) == len(ds) == 9  # A: 57 a rank, 9 whole batches of 6; B: 20, 10 of 2
        for batch in batches:  # the last one included
            counts = Counter("B" if y in of_b else "A" for y in batch.labels.tolist())
            assert counts == {"A": 6, "B": 2}
            assert batch.labels.tolist() != sorted(batch.labels.tolist())  # shuffled within the batch
        per_source.update("B" if y in of_b else "A" for b_ in batches for y in b_.labels.tolist())
    assert lens == [9, 9]
    # Over the epoch: exactly 3:1, A's partial batch (3 a rank) and B's 10th batch left out.
    assert per_source == {"A": 2 * 9 * 6, "B": 2 * 9 * 2}


def test_default_weights_follow_the_sizes_and_resume_is_exact(sources):
    a, b = sources

    def loader():
        ds = MixedDataset([a, b], batch_size=8, transform=IDENTITY)
        return make_loader(ds, num_workers=2)

    assert loader().dataset.shares == split_batch(8, [115, 40]) == [6, 2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        full = [b_ for b_ in loader()]
        first = loader()
        head = list(islice(first, 4))
        second = loader()
        second.load_state_dict(first.state_dict())
        tail = list(second)
    assert len(full) == len(head) + len(tail)
    for x, y in zip(head + tail, full, strict=True):
        assert torch.equal(x.images, y.images) and torch.equal(x.labels, y.labels)
    other = make_loader(MixedDataset([a, b], weights=[1, 1], batch_size=8, transform=IDENTITY), num_workers=0)
    with pytest.raises(Exception, match="weights"):
        other.load_state_dict(first.state_dict())


def test_a_mix_is_for_training(sources):
    a, b = sources
    with pytest.raises(ConfigError, match="a mix is for training"):
        MixedDataset([a, b], mode="eval")
    with pytest.raises(ConfigError, match="leave drop_last out"):
        MixedDataset([a, b], drop_last=False)
    # A source with fewer samples a rank than its share of a batch: an error, not an empty epoch.
    with pytest.raises(
        ConfigError, match=r"source 1 \(.*\) has 40 sample\(s\) a rank, fewer than its 48 a batch"
    ):
        len(MixedDataset([a, b], weights=[1, 3], batch_size=64, transform=IDENTITY))
    with pytest.raises(ConfigError, match="two sources or more"):
        MixedDataset([a])


def test_a_mix_that_lost_more_than_max_lost_names_every_source(sources):
    a, b = sources
    mix = MixedDataset([a, b], weights=[3, 1], batch_size=8, transform=IDENTITY, max_lost=0.1)
    assert mix.progress.rank_samples() == len(mix) * 8 == 152
    mix.progress.check_lost(0, 15)  # under 10%: warned about only
    with pytest.raises(
        ShardReadError, match=rf"lost 16 of its 152 .* at {a}, {b} .*`imgshards verify {a}` and"
    ):
        mix.progress.check_lost(0, 16)


def test_weights_that_are_not_finite_or_overflow_are_refused_when_the_mix_is_made(packed_many, packed_few):
    # Issue 50, point 15: [inf, 1] ended in an AssertionError at the first batch, [1e308, 1e308] in
    # batches of 2 for a batch size of 8.
    a, b = packed_many, packed_few
    for weights, said in (
        ([float("inf"), 1], "weight 0 of the mix is inf: weights must be finite positive numbers"),
        ([1, float("nan")], "weight 1 of the mix is nan: weights must be finite positive numbers"),
        ([1, -2], "weight 1 of the mix is -2: "),
        ([True, 1], "weight 0 of the mix is True: "),
        (["3", None], "weight 1 of the mix is None: "),
        ([1e308, 1e308], "the mix's weights [1e+308, 1e+308] add up past the largest float: scale them down"),
    ):
        with pytest.raises(ConfigError) as e:
            MixedDataset([a, b], weights=weights, batch_size=8, transform=IDENTITY)
        assert str(e.value).startswith(said) and "\n" not in str(e.value), str(e.value)
    mix = MixedDataset([a, b], weights=[1e307, 1e307], batch_size=8, transform=IDENTITY)
    assert mix.shares == [4, 4]  # only the ratios count
    assert all(len(batch.labels) == 8 for batch in make_loader(mix, num_workers=0))
