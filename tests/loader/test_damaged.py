"""Damaged shards never hang a DDP job: every train rank yields ``len()`` batches, whatever is lost.

The reproductions of issue 13, on real shards damaged on disk. Ranks are emulated with ``rank=`` /
``world_size=``; workers either as real DataLoader workers or, for many of them, by running each
worker's share in this process (``_batches``), which is what a worker process runs.
"""

from __future__ import annotations

import itertools
import random
import shutil
import tarfile
import warnings
from collections import Counter

import pytest
import torch

from imgshards.converter.format.manifest import read_manifest
from imgshards.loader import ConfigError, ShardDataset, ShardReadError, make_loader
from imgshards.loader.epoch.position import PassPosition

IDENTITY = torch.nn.Identity()


def batches_per_worker(ds, num_workers, epoch=0, caught=None):
    """Every batch of the rank, made worker by worker in this process (what worker processes run)."""
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        out = [
            list(ds.worker_batches(PassPosition(epoch, (), 0, w, num_workers, ds.rank, ds.world_size)))
            for w in range(num_workers)
        ]
    if caught is not None:
        caught += [str(w.message) for w in got]
    return out


@pytest.fixture(scope="module")
def two_shards(tree_factory, packed_factory):
    """370 images in 2 shards, about 231 + 139, as in the issue."""
    src = tree_factory(classes=5, per_class=74, seed=11)
    per_sample = sum(-(-p.stat().st_size // 512) * 512 + 2048 for p in src.rglob("*.JPEG")) / 370
    root = packed_factory(src, shard_size=int(per_sample * 231.5))
    shards = read_manifest(root).split("train").shards
    assert len(shards) == 2 and 200 < shards[0].samples < 260
    return root


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_a_shard_cut_in_its_sixth_sample_leaves_both_ranks_len_batches(two_shards, tmp_path):
    root = tmp_path / "cut"
    shutil.copytree(two_shards, root)
    first = read_manifest(root).split("train").shards[0]
    data = (root / first.name).read_bytes()
    with tarfile.open(root / first.name) as tar:
        members = tar.getmembers()
    sixth = [m for m in members if m.name.endswith(".jpg")][5]
    (root / first.name).write_bytes(data[: sixth.offset_data + 100])
    counts, lost = [], 0
    for rank in range(2):
        with pytest.warns(RuntimeWarning, match="the index says"):
            ds = ShardDataset(root, batch_size=16, rank=rank, world_size=2, transform=IDENTITY, max_lost=1)
        loader = make_loader(ds, num_workers=3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sizes = [len(b.labels) for b in loader]
        assert len(sizes) == len(loader) == 12 and sum(sizes) == 185
        counts.append(len(sizes))
        lost += ds.lost_samples
    assert lost == first.samples - 5, "every lost sample is counted once"
    # The worker's warning says what the shard holds, not where the worker's own range began.
    with pytest.warns(RuntimeWarning, match="the index says"):
        ds = ShardDataset(root, batch_size=16, transform=IDENTITY, rank=0, world_size=2, max_lost=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(make_loader(ds, num_workers=0))
    messages = [str(w.message) for w in caught if first.name in str(w.message)]
    assert messages and all(f"shard {first.name} holds only 5 readable sample(s)" in m for m in messages)


@pytest.fixture(scope="module")
def ten_shards(loader_tree, packed_factory):
    size = sum(-(-p.stat().st_size // 512) * 512 + 2048 for p in loader_tree.rglob("*.JPEG"))
    root = packed_factory(loader_tree, shard_size=size // 9)
    assert 9 <= len(read_manifest(root).split("train").shards) <= 11
    return root


def damaged_copy(root, dst, damage, which):
    shutil.copytree(root, dst)
    shards = read_manifest(dst).split("train").shards
    for i in which:
        path = dst / shards[i].name
        if damage == "random":
            path.write_bytes(random.Random(i).randbytes(shards[i].bytes))
        else:
            path.write_bytes(path.read_bytes()[:4096])
    return dst


@pytest.mark.parametrize("damage", ["random", "cut"])
@pytest.mark.parametrize("bad", ["one", "all but one"])
def test_every_rank_of_eight_by_two_yields_len_batches(ten_shards, tmp_path, damage, bad):
    n = len(read_manifest(ten_shards).split("train").shards)
    which = [3] if bad == "one" else [i for i in range(n) if i != 3]
    root = damaged_copy(ten_shards, tmp_path / "bad", damage, which)
    caught: list[str] = []
    for epoch in range(2):
        for rank in range(8):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds = ShardDataset(root, batch_size=2, rank=rank, world_size=8, transform=IDENTITY)
            per_worker = batches_per_worker(ds, 2, epoch, caught)
            assert sum(map(len, per_worker)) == len(ds) == 7, (epoch, rank)
            assert all(len(b.labels) == 2 for w in per_worker for b in w)
    # With one good shard left, some workers lost every sample of their plan and made up from it.
    assert any("lost every sample of its plan" in m for m in caught) == (bad == "all but one")


def test_with_every_shard_unreadable_every_rank_fails_saying_so(ten_shards, tmp_path):
    n = len(read_manifest(ten_shards).split("train").shards)
    root = damaged_copy(ten_shards, tmp_path / "bad", "random", range(n))
    for rank in (0, 5):
        ds = ShardDataset(root, batch_size=2, rank=rank, world_size=8, transform=IDENTITY)
        with pytest.raises(ShardReadError, match=r"no shard of split 'train' .* holds a readable sample"):
            batches_per_worker(ds, 2)


def test_eval_makes_nothing_up_and_counts_what_it_lacks(ten_shards, tmp_path):
    root = damaged_copy(ten_shards, tmp_path / "bad", "random", [3])
    lost = read_manifest(root).split("train").shards[3].samples
    seen, missing = 0, 0
    for rank in range(3):
        ds = ShardDataset(
            root, batch_size=4, mode="eval", rank=rank, world_size=3, transform=IDENTITY, max_lost=1
        )
        loader = make_loader(ds, num_workers=2)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            seen += sum(len(b.labels) for b in loader)
        missing += ds.lost_samples
        if ds.lost_samples:
            assert any(f"{ds.lost_samples} planned sample(s) were lost" in str(w.message) for w in caught)
    assert missing == lost and seen == ds.num_samples - lost


# ---- the loss threshold (issue 31): a pass that lost too much is an error, never a short epoch ----


def lost_pass(root, *, mode, world_size=2, num_workers=2, **kw):
    """Every rank's batches of one pass through ``make_loader``, warnings silenced; and the loaders."""
    loaders = [
        make_loader(
            ShardDataset(
                root, batch_size=4, mode=mode, rank=r, world_size=world_size, transform=IDENTITY, **kw
            ),
            num_workers=num_workers,
        )
        for r in range(world_size)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [list(ld) for ld in loaders], loaders


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_every_shard_unreadable_is_an_error_not_an_empty_pass(packed_many, tmp_path, mode):
    n = len(read_manifest(packed_many).split("train").shards)
    root = damaged_copy(packed_many, tmp_path / "bad", "random", range(n))
    with pytest.raises(ShardReadError, match=r"lost \d+ of its \d+ sample|holds a readable sample"):
        lost_pass(root, mode=mode, max_lost=1.0)  # even with no limit: a pass that lost everything


def test_one_unreadable_shard_of_ten_is_more_than_the_default_allows(ten_shards, tmp_path):
    root = damaged_copy(ten_shards, tmp_path / "bad", "random", [3])
    with pytest.raises(ShardReadError, match=r"more than max_lost=0.01 allows: run `imgshards verify "):
        lost_pass(root, mode="eval", world_size=1)
    with pytest.raises(ConfigError, match=r"max_lost is a share of the samples, from 0 .* got 1.5"):
        ShardDataset(root, max_lost=1.5)


def damage_last_sample(root):
    """Overwrite the header of each shard's last sample: each shard reads as one sample short."""
    lost = set()
    for shard in read_manifest(root).split("train").shards:
        with tarfile.open(root / shard.name) as tar:
            members = tar.getmembers()
        key = members[-1].name.split(".", 1)[0]
        first = next(m for m in members if m.name.split(".", 1)[0] == key)
        with open(root / shard.name, "r+b") as f:
            f.seek(first.offset)
            f.write(random.Random(shard.name).randbytes(512))
        lost.add(key)
    return lost


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_every_shard_damaged_in_one_place_below_the_threshold(packed_copy, lookup_many, mode):
    lost = damage_last_sample(packed_copy)
    whole = lookup_many.keys - lost
    ranks, loaders = lost_pass(packed_copy, mode=mode, max_lost=0.5)
    counted = sum(ld.dataset.lost_samples for ld in loaders)
    if mode == "eval":
        assert counted == len(lost)
    else:  # a train epoch leaves N mod W samples out, which may be lost ones: never planned, never counted
        assert len(lost) - len(lookup_many.keys) % 2 <= counted <= len(lost)
    keys = [[lookup_many.batch_keys(b) for b in r] for r in ranks]
    if mode == "eval":  # every sample of the undamaged parts exactly once, over the ranks; none made up
        assert Counter(k for r in keys for b in r for k in b) == Counter(whole)
        assert all(len(r) <= len(ld) for r, ld in zip(ranks, loaders, strict=True))
    else:  # len(loader) full batches on every rank, made up from its own samples; N mod W left out at most
        assert [len(r) for r in ranks] == [len(ld) for ld in loaders] == [15, 15]
        assert all(len(b) == 4 for r in keys for b in r[:-1])
        seen = {k for r in keys for b in r for k in b}
        assert seen <= whole and len(whole - seen) <= len(lookup_many.keys) % 2


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_resume_past_a_damaged_shard_keeps_the_batch_count(packed_copy, lookup_many):
    # The resume replays the order with the runs' planned lengths, the pass it resumes had the
    # damaged run cut short (docs/loader-pass.md): the tail may differ from that pass's, but the
    # rank still gets its len() batches, each of its size.
    for shard in sorted(packed_copy.glob("train-*.tar"))[:2]:
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])

    def loader():
        ds = ShardDataset(packed_copy, batch_size=8, transform=torch.nn.Identity(), max_lost=0.5)
        return make_loader(ds, num_workers=2)

    sizes = [len(b.labels) for b in loader()]  # an uninterrupted pass: what was lost is made up
    first = loader()
    head = [b.labels.tolist() for b in itertools.islice(first, 5)]
    resumed = loader()
    resumed.load_state_dict(first.state_dict())
    tail = lookup_many.run_keys(resumed)
    assert len(head) == 5 and [len(keys) for keys in tail] == sizes[5:] and len(tail) > 0


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_the_epochs_loss_warning_points_at_the_training_loop(packed_copy, mode):
    # The pass's losses are told by the dataset's epoch (state/progress.py), three calls below the
    # loop: the warning must still name the loop's line, as a user's warning filter sees it.
    damage_last_sample(packed_copy)
    ds = ShardDataset(packed_copy, batch_size=4, mode=mode, max_lost=0.5, transform=IDENTITY)
    loader = make_loader(ds, num_workers=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in loader:  # the line the warning names
            pass
    line = test_the_epochs_loss_warning_points_at_the_training_loop.__code__.co_firstlineno + 9
    lost = [w for w in caught if "were lost to truncated or unreadable shards" in str(w.message)]
    assert len(lost) == 1 and loader.dataset.lost_samples > 0
    assert (lost[0].filename, lost[0].lineno) == (__file__, line)
