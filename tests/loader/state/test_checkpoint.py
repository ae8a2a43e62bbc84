"""A saved state is untrusted input: every field is checked before it is used (issue 37, points 6-8).

A state is a dict anyone may have edited (a checkpoint file, a state sent over the network). Each of
its numbers must be an integer in its range and its finished legs must fit the split, whether it
reaches ``ShardLoader.load_state_dict`` or the dataset's torchdata ``load_state_dict``; a bad one is
refused in one line naming the field, before the loader moves. On 1bc048c world size 0 gave an
empty epoch, a leg of -5 batches 8 of 48 samples, epoch -1 a ValueError in a worker and epoch
2**70 "Overflow when unpacking long long", none of them naming the field.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from imgshards.loader import ConfigError, MixedDataset, ResumeError, ShardDataset, make_loader
from imgshards.loader.state.cursor import MAX_EPOCH

IDENTITY = torch.nn.Identity()
SAMPLES, BATCH = 48, 8  # 6 batches an epoch at world size 1, 3 a rank at world size 2


@pytest.fixture(scope="module")
def packed48(tree_factory, packed_factory):
    """48 real JPEGs (4 classes x 12) in several shards, as in the issue."""
    return packed_factory(tree_factory(classes=4, per_class=12, seed=7), shard_size=20_000)


def loader(root, **kw):
    return make_loader(ShardDataset(root, batch_size=BATCH, transform=IDENTITY, **kw), num_workers=0)


def saved(root, **kw):
    """A real loader's state, one batch into epoch 0."""
    ld = loader(root, **kw)
    next(iter(ld))
    return ld.state_dict()


def samples_of(ld) -> int:
    return sum(len(b.labels) for b in ld)


def refused(ld, state, field):
    """``state`` is refused naming ``field``, and the loader still reads all of epoch 0."""
    with pytest.raises(ResumeError, match=rf"field '{field}' is .*, not an integer from") as info:
        ld.load_state_dict(state)
    assert "\n" not in str(info.value)
    assert ld.epoch == 0 and samples_of(ld) == SAMPLES
    return str(info.value)


# ---- 6: world size and workers ------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -2, True, 2.0, "1", None, 2**70])
def test_a_saved_world_size_out_of_range_is_refused_naming_it(packed48, value):
    message = refused(loader(packed48), saved(packed48) | {"world_size": value}, "world_size")
    assert repr(value) in message and "from 1 to" in message


@pytest.mark.parametrize("value", [-1, 1.5, 10**9])
def test_a_saved_worker_count_out_of_range_is_refused_naming_it(packed48, value):
    refused(loader(packed48), saved(packed48) | {"num_workers": value}, "num_workers")


def test_a_dataset_state_names_a_worker_outside_its_worker_count(packed48):
    state = ShardDataset(packed48, batch_size=BATCH, transform=IDENTITY).state_dict()
    assert state["worker"] == 0 and state["num_workers"] == 1
    for field, value in [("worker", 1), ("worker", -1), ("num_workers", 0), ("world_size", 0)]:
        ds = ShardDataset(packed48, batch_size=BATCH, transform=IDENTITY)
        # world_size is one of the settings a dataset state must share: refused as another one
        match = r"world_size: saved 0, now 1" if field == "world_size" else rf"field '{field}' is {value}"
        with pytest.raises(ResumeError, match=match):
            ds.load_state_dict(state | {field: value})


# ---- 7: finished legs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stages", "field"),
    [
        ([[1, 1, -5]], r"stages\[0\]\[2\] \(batches\)"),  # the leg: 8 of 48 samples on 1bc048c
        ([[2, 1, 4]], r"stages\[0\]\[2\] \(batches\)"),  # 24 samples a rank at world size 2: 3 batches
        ([[0, 1, 1]], r"stages\[0\]\[0\] \(world_size\)"),
        ([[-2, 1, 1]], r"stages\[0\]\[0\] \(world_size\)"),
        ([[2, 0, 1]], r"stages\[0\]\[1\] \(num_workers\)"),
        ([[2, 1, 1], [3, 1, 3]], r"stages\[1\]\[2\] \(batches\)"),  # 32 left at 3 ranks: 2 batches a rank
        ([[2, 1, True]], r"stages\[0\]\[2\] \(batches\)"),
    ],
)
def test_a_finished_leg_that_does_not_fit_the_split_is_refused_naming_it(packed48, stages, field):
    state = saved(packed48) | {"stages": stages, "batches": 0}
    with pytest.raises(ResumeError, match=rf"field '{field}' is "):
        loader(packed48).load_state_dict(state)
    with pytest.raises(ResumeError, match=rf"field '{field}' is "):
        ShardDataset(packed48, batch_size=BATCH, transform=IDENTITY).load_state_dict(
            ShardDataset(packed48, batch_size=BATCH, transform=IDENTITY).state_dict() | {"stages": stages}
        )


@pytest.mark.parametrize("stages", ["2,1,1", [[2, 1]], [2, 1, 1], [[2, 1, 1]] * 17])
def test_stages_that_are_not_a_list_of_legs_are_refused(packed48, stages):
    shape = r"field 'stages(\[0\])?' is .*, not (a list of at most 16|\[world_size)"
    with pytest.raises(ResumeError, match=shape):
        loader(packed48).load_state_dict(saved(packed48) | {"stages": stages, "batches": 0})


def test_real_legs_still_resume_and_deliver_the_rest_exactly(packed48):
    """The checks refuse only what no loader saves: a real elastic state (one leg) resumes."""
    at_two = saved(packed48, rank=0, world_size=2)  # both ranks delivered one batch: 16 samples
    first = loader(packed48)
    first.load_state_dict(at_two)  # onto one rank: a finished leg (2, 1, 1), the rest 32 samples
    batches = iter(first)
    next(batches)
    state = first.state_dict()
    assert state["stages"] == [[2, 1, 1]] and state["batches"] == 1
    resumed = loader(packed48)
    resumed.load_state_dict(state)
    assert samples_of(resumed) == SAMPLES - 16 - BATCH
    # A leg that delivered all its batches fits too (3 a rank of 24 at world size 2); numpy ints are ints.
    whole = loader(packed48)
    whole.load_state_dict(state | {"stages": [[2, 1, 3]], "batches": 0, "epoch": np.int64(0)})
    assert samples_of(whole) == 0


def test_a_saved_batch_count_past_the_epoch_is_refused(packed48):
    for batches in (-1, 7):
        refused(loader(packed48), saved(packed48) | {"batches": batches}, "batches")


# ---- 8: the epoch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("epoch", [-1, 2**70, 2**63, True, 1.5, "3"])
def test_a_saved_epoch_out_of_range_is_refused_by_the_loader_and_the_dataset(packed48, epoch):
    refused(loader(packed48), saved(packed48) | {"epoch": epoch}, "epoch")
    ds = ShardDataset(packed48, batch_size=BATCH, transform=IDENTITY)
    with pytest.raises(ResumeError, match=rf"field 'epoch' is .*, not an integer from 0 to {MAX_EPOCH}"):
        ds.load_state_dict(ds.state_dict() | {"epoch": epoch})
    assert ds.epoch == 0


@pytest.mark.parametrize("epoch", [-1, MAX_EPOCH + 1, 2**70])
def test_set_epoch_out_of_range_is_refused_in_one_line(packed48, epoch):
    ld = loader(packed48)
    with pytest.raises(
        ConfigError, match=rf"epoch must be a whole number from 0 to {MAX_EPOCH}, got {epoch}"
    ):
        ld.set_epoch(epoch)
    assert ld.epoch == 0


def test_the_largest_epoch_resumes(packed48):
    """MAX_EPOCH is a valid epoch: its order is as computable as epoch 0's."""
    state = saved(packed48) | {"epoch": MAX_EPOCH, "batches": 5}
    ld = loader(packed48)
    ld.load_state_dict(state)
    assert ld.epoch == MAX_EPOCH and samples_of(ld) == BATCH


# ---- a mix: its legs are its shortest source's ------------------------------------------------------


def test_a_mix_state_past_its_shortest_source_is_refused(packed48, packed_many):
    def mix():
        return MixedDataset([packed48, packed_many], batch_size=8, transform=IDENTITY)

    assert mix().shares == [2, 6] and len(mix()) == 19  # 115 // 6 = 19 whole batches of the second
    ld = make_loader(mix(), num_workers=0)
    next(iter(ld))
    state = ld.state_dict()
    with pytest.raises(ResumeError, match=r"field 'batches' is 20, not an integer from 0 to 19"):
        make_loader(mix(), num_workers=0).load_state_dict(state | {"batches": 20})
    with pytest.raises(ResumeError, match=r"field 'stages\[0\]\[2\] \(batches\)' is -5"):
        make_loader(mix(), num_workers=0).load_state_dict(state | {"stages": [[2, 1, -5]]})
    resumed = make_loader(mix(), num_workers=0)
    resumed.load_state_dict(state)
    assert len(list(resumed)) == 18
