"""A saved state is untrusted input: a setting its version saves may not be missing (issue 44, point 12).

On bc91b27 a version-4 state of dataset A with its ``shards`` field removed resumed dataset B (same
size, other images) through ``ShardLoader`` and ``ShardDataset.load_state_dict``: ``check_settings``
skipped ``split`` and ``shards`` when missing, though every version-4 state writes them, and B then
skipped the 8 samples A had delivered. Now a missing setting is refused in one line naming it; a
state of a version before those fields were saved (2) still resumes where an epoch starts.
"""

from __future__ import annotations

import pytest
import torch

from imgshards.loader import ResumeError, ShardDataset, make_loader
from imgshards.loader.state.checkpoint import STATE_VERSION

IDENTITY = torch.nn.Identity()
SAMPLES, BATCH = 48, 8


@pytest.fixture(scope="module")
def two_datasets(tree_factory, packed_factory):
    """Datasets A and B of the same size and classes, of other images (so other shards)."""
    a = packed_factory(tree_factory(classes=4, per_class=12, seed=1), shard_size=20_000)
    b = packed_factory(tree_factory(classes=4, per_class=12, seed=2), shard_size=20_000)
    return a, b


def loader(root):
    return make_loader(ShardDataset(root, batch_size=BATCH, transform=IDENTITY), num_workers=0)


def samples_of(ld) -> int:
    return sum(len(b.labels) for b in ld)


@pytest.mark.parametrize("field", ["shards", "split", "seed", "batch_size", "samples"])
def test_a_loader_state_missing_a_setting_is_refused_naming_it(two_datasets, field):
    a, b = two_datasets
    first = loader(a)
    next(iter(first))  # one batch into epoch 0
    state = first.state_dict()
    assert state["version"] == STATE_VERSION and field in state
    del state[field]
    other = loader(b)
    with pytest.raises(
        ResumeError, match=rf"state has no field '{field}', which every version-{STATE_VERSION} state saves"
    ):
        other.load_state_dict(state)
    assert other.epoch == 0 and samples_of(other) == SAMPLES  # nothing skipped


@pytest.mark.parametrize("field", ["shards", "split"])
def test_a_dataset_state_missing_a_setting_is_refused_naming_it(two_datasets, field):
    a, b = two_datasets
    state = ShardDataset(a, batch_size=BATCH, transform=IDENTITY).state_dict()
    del state[field]
    ds = ShardDataset(b, batch_size=BATCH, transform=IDENTITY)
    with pytest.raises(ResumeError, match=rf"no field '{field}'") as info:
        ds.load_state_dict(state)
    assert "\n" not in str(info.value)


def test_a_whole_state_of_another_dataset_is_still_refused_for_its_shards(two_datasets):
    a, b = two_datasets
    first = loader(a)
    next(iter(first))
    with pytest.raises(ResumeError, match="shards: saved"):
        loader(b).load_state_dict(first.state_dict())


def test_a_version_2_state_without_split_and_shards_resumes_at_an_epoch_start(two_datasets):
    a, _ = two_datasets
    first = loader(a)
    first.set_epoch(1)
    state = first.state_dict()
    old = {k: v for k, v in state.items() if k not in ("split", "shards")} | {"version": 2}
    again = loader(a)
    again.load_state_dict(old)  # saved before split and shards were: not checked for them
    assert again.epoch == 1 and samples_of(again) == SAMPLES
