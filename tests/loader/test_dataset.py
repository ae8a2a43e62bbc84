"""ShardDataset and make_loader on real packed shards with real DataLoader workers (one process group).

Ranks are emulated here with explicit ``rank=`` / ``world_size=``; test_distributed.py runs the same
checks under real ``torch.distributed``. Images are left untransformed (``torch.nn.Identity``) so
every image maps back to its sample key by its pixels.
"""

from __future__ import annotations

import gc
import json
import time
import warnings
from collections import Counter
from itertools import islice

import pytest
import torch
from torch.utils.data import get_worker_info

from imgshards.converter import PackConfig, pack
from imgshards.converter.format.errors import ManifestError
from imgshards.converter.format.manifest import read_manifest
from imgshards.loader import ConfigError, CorruptImageError, ResumeError, ShardDataset, make_loader
from imgshards.loader.epoch.position import PassPosition
from imgshards.loader.state.buffers import pool_token

IDENTITY = torch.nn.Identity()


def dataset(root, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("transform", IDENTITY)
    return ShardDataset(root, **kw)


def run(root, lookup, *, num_workers=0, epoch=None, **kw):
    ds = dataset(root, **kw)
    loader = make_loader(ds, num_workers=num_workers)
    if epoch is not None:
        loader.set_epoch(epoch)
    batches = lookup.run_keys(loader)
    assert len(batches) == len(loader) == len(ds)
    return batches


def flat(batches):
    return [k for b in batches for k in b]


# ---- partitioning ------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("which", ["many", "few"])
def test_train_ranks_yield_equal_batches_without_duplicates(which, num_workers, request):
    root, lookup = request.getfixturevalue(f"packed_{which}"), request.getfixturevalue(f"lookup_{which}")
    world = 3
    ranks = [run(root, lookup, num_workers=num_workers, rank=r, world_size=world) for r in range(world)]
    assert len({len(r) for r in ranks}) == 1
    keys = [k for r in ranks for k in flat(r)]
    assert len(keys) == len(set(keys)), "a sample came twice in one epoch"
    assert len(lookup.keys) - len(keys) == len(lookup.keys) % world  # N mod world_size dropped
    for r in ranks:  # only each rank's last batch may be short
        assert all(len(b) == 8 for b in r[:-1])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_eval_covers_every_sample_exactly_once(packed_few, lookup_few, num_workers):
    ranks = [
        run(packed_few, lookup_few, num_workers=num_workers, mode="eval", rank=r, world_size=3)
        for r in range(3)
    ]
    assert Counter(k for r in ranks for k in flat(r)) == Counter(lookup_few.keys)
    assert max(map(len, ranks)) - min(map(len, ranks)) <= 1
    sizes = [len(b) for r in ranks for b in r]
    assert sizes.count(8) >= len(sizes) - 1


def test_eval_reads_in_index_order_by_default(packed_many, lookup_many):
    keys = flat(run(packed_many, lookup_many, mode="eval"))
    assert keys == list(lookup_many.label_of)  # the lookup read the shards in index order
    assert keys == flat(run(packed_many, lookup_many, mode="eval", epoch=3))


def test_drop_last_drops_the_partial_batch_and_says_how_many(packed_many, lookup_many):
    ds = dataset(packed_many, drop_last=True, rank=0, world_size=2)
    n = ds.num_samples
    assert ds.dropped_per_epoch == n - 2 * ((n // 2) // 8 * 8)
    batches = run(packed_many, lookup_many, drop_last=True, rank=0, world_size=2)
    assert all(len(b) == 8 for b in batches)
    assert len(batches) == (n // 2) // 8


# ---- epochs and seeds --------------------------------------------------------------------------


def test_epochs_differ_and_the_same_seed_repeats(packed_many, lookup_many):
    e0 = run(packed_many, lookup_many, num_workers=2)
    e1 = run(packed_many, lookup_many, num_workers=2, epoch=1)
    assert flat(e0) != flat(e1)
    assert sorted(flat(e0)) == sorted(flat(e1))  # one rank: nothing dropped
    assert e0 == run(packed_many, lookup_many, num_workers=2)
    assert e0 != run(packed_many, lookup_many, num_workers=2, seed=1)


def test_persistent_workers_see_set_epoch_and_epochs_advance_by_themselves(packed_many, lookup_many):
    loader = make_loader(dataset(packed_many), num_workers=2, persistent_workers=True)
    first = lookup_many.run_keys(loader)  # epoch 0, then the loader moves on to epoch 1
    second = lookup_many.run_keys(loader)
    loader.set_epoch(0)
    again = lookup_many.run_keys(loader)
    assert first == again != second
    assert second == run(packed_many, lookup_many, num_workers=2, epoch=1)
    assert loader.epoch == 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_pass_of_len_batches_completes_the_epoch_without_exhausting_it(
    packed_many, lookup_many, num_workers
):
    """What Lightning does, and ``islice(loader, len(loader))``: stop at the last batch, never past it."""
    loader = make_loader(dataset(packed_many), num_workers=num_workers)
    epochs = [lookup_many.run_keys(islice(loader, len(loader))) for _ in range(3)]
    assert epochs[0] == run(packed_many, lookup_many, num_workers=num_workers)
    assert epochs[1] == run(packed_many, lookup_many, num_workers=num_workers, epoch=1) != epochs[0]
    assert epochs[2] == run(packed_many, lookup_many, num_workers=num_workers, epoch=2)
    assert loader.epoch == 3 and loader.state_dict()["batches"] == 0


def test_set_epoch_on_the_dataset_is_set_epoch_on_the_loader(packed_many, lookup_many):
    ds = dataset(packed_many)
    loader = make_loader(ds, num_workers=2)
    ds.set_epoch(3)
    assert loader.epoch == 3
    assert lookup_many.run_keys(loader) == run(packed_many, lookup_many, num_workers=2, epoch=3)
    assert ds.epoch == loader.epoch == 4
    # A pass stopped early used its epoch: setting it again reads it whole, from its start.
    head = lookup_many.run_keys(islice(loader, 4))
    ds.set_epoch(4)
    whole = lookup_many.run_keys(loader)
    assert head == whole[:4] and whole == run(packed_many, lookup_many, num_workers=2, epoch=4)


def test_augmentation_is_seeded_per_batch(packed_many):
    def images(num_workers):
        ds = ShardDataset(packed_many, batch_size=8, transform="train", image_size=32)
        return [b.images for b in make_loader(ds, num_workers=num_workers)]

    a, b = images(2), images(2)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    torch.manual_seed(0)
    before = torch.rand(3)
    torch.manual_seed(0)
    images(0)
    assert torch.equal(torch.rand(3), before), "num_workers=0 must leave the caller's RNG alone"


def test_recycled_batch_buffers_never_change_a_batch_still_held(packed_many, lookup_many):
    ds = dataset(packed_many, batch_size=4)
    loader = make_loader(ds, num_workers=2, persistent_workers=True)
    expected = run(packed_many, lookup_many, num_workers=2, batch_size=4)
    for _ in range(2):  # two passes: the persistent workers keep their buffers between them
        kept, views, tokens, by_name = {}, {}, [], 0
        for i, batch in enumerate(loader):
            token = pool_token(batch.images)
            tokens.append(token)
            # Sent by name: the batch is in a buffer this process kept mapped (no file descriptor).
            by_name += (
                token is not None and ds.progress.control.kept_buffer(token) is batch.images.untyped_storage()
            )
            if i % 3 == 0:
                kept[i] = batch  # held while later batches are made: its buffer must not come back
            elif i % 3 == 1:  # a numpy view of two images holds the buffer as well
                views[i] = (batch.images[1:3].numpy(), batch.images[1:3].clone())
        loader.set_epoch(0)
        assert {i: lookup_many.batch_keys(b) for i, b in kept.items()} == {i: expected[i] for i in kept}
        assert all((torch.from_numpy(view) == copy).all() for view, copy in views.values())
        pooled = [t for t in tokens if t is not None]  # None: a one-off buffer while the pool was all lent
        assert len(pooled) > len(tokens) // 2 and len(set(pooled)) <= 16, "buffers are recycled"
        assert by_name >= len(tokens) // 6, "recycled buffers travel by name"  # most are held here
    assert len(loader._lent) < 40


# ---- shuffling quality ---------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_first_batches_of_class_sorted_shards_are_mixed(class_sorted, num_workers):
    """One class per shard, in class order: the first batches must still hold most classes."""
    ds = ShardDataset(class_sorted, batch_size=16, transform=IDENTITY)
    classes = len(ds.classes)
    for epoch in range(3):
        loader = make_loader(ds, num_workers=num_workers)
        loader.set_epoch(epoch)
        first = list(islice(loader, 2))
        # Each worker reads a contiguous part of the shard sequence (about half of the classes with
        # 2 workers) and interleaves its shards, so its first batch already mixes them all.
        groups = [b.labels.tolist() for b in first] if num_workers == 0 else [flat_labels(first)]
        for labels in groups:
            counts = Counter(labels)
            assert len(counts) >= 4, counts
            assert max(counts.values()) <= len(labels) // 2, counts
    # Without shuffling the same input comes out in blocks of one class: the check above has teeth.
    plain = ShardDataset(class_sorted, batch_size=16, transform=IDENTITY, shuffle=False)
    assert len(set(next(iter(make_loader(plain, num_workers=0))).labels.tolist())) == 1
    assert classes == 5


def flat_labels(batches):
    return [label for b in batches for label in b.labels.tolist()]


# ---- resume ------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize(
    "num_workers, rank, world_size, stops",
    [(0, 0, 1, [1, 7]), (2, 0, 1, [1, 4, 5, 14]), (3, 1, 2, [2, 4, 7]), (2, 2, 3, [3])],
)
def test_resume_mid_epoch_continues_exactly(packed_many, lookup_many, num_workers, rank, world_size, stops):
    kw = dict(rank=rank, world_size=world_size)
    full = run(packed_many, lookup_many, num_workers=num_workers, epoch=2, **kw)
    for stop in stops:
        loader = make_loader(dataset(packed_many, **kw), num_workers=num_workers)
        loader.set_epoch(2)
        head = lookup_many.run_keys(islice(loader, stop))
        state = json.loads(json.dumps(loader.state_dict()))  # survives a checkpoint round trip
        assert state["epoch"] == 2 and state["batches"] == stop

        resumed = make_loader(dataset(packed_many, **kw), num_workers=num_workers)
        resumed.load_state_dict(state)
        resumed.set_epoch(2)  # what a training loop calling set_epoch every epoch does
        tail = lookup_many.run_keys(resumed)
        assert head + tail == full, f"resume after {stop} batches"
        assert resumed.epoch == 3 and resumed.state_dict()["batches"] == 0


def start_after_the_epoch_ends(worker_id: int) -> None:
    """worker_init_fn: worker 2 starts only once the main process has moved on to the next epoch."""
    info = get_worker_info()
    assert info is not None
    deadline = time.monotonic() + 30
    while worker_id == 2 and info.dataset.epoch == 2 and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_a_worker_starting_after_the_last_batch_reads_the_pass_epoch(packed_many, lookup_many):
    """A busy machine: the main process gets the pass's last batch before a worker with none left starts.

    After 7 of 8 batches only worker 1's last batch is left (DataLoader process 0 makes it); the epoch
    is over as it arrives, and the late process 2 must still read epoch 2 (nothing left), not epoch 3.
    """
    kw = dict(rank=1, world_size=2)
    full = run(packed_many, lookup_many, num_workers=3, epoch=2, **kw)
    loader = make_loader(dataset(packed_many, **kw), num_workers=3)
    loader.set_epoch(2)
    head = lookup_many.run_keys(islice(loader, 7))
    resumed = make_loader(dataset(packed_many, **kw), num_workers=3)
    resumed.dataloader.worker_init_fn = start_after_the_epoch_ends
    resumed.load_state_dict(loader.state_dict())
    assert head + lookup_many.run_keys(resumed) == full
    assert resumed.epoch == 3 and resumed.state_dict()["batches"] == 0


def test_resume_gives_the_same_augmented_images(packed_many):
    def loader():
        return make_loader(ShardDataset(packed_many, batch_size=8, image_size=32), num_workers=2)

    full = [b.images for b in loader()]
    first = loader()
    head = [b.images for b in islice(first, 5)]
    second = loader()
    second.load_state_dict(first.state_dict())
    tail = [b.images for b in second]
    assert all(torch.equal(x, y) for x, y in zip(head + tail, full, strict=True))


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_dataloader_round_robin_matches_the_per_worker_model(packed_many, lookup_many):
    """Workers with unequal batch counts: DataLoader's order is batch j from worker j % num_workers."""
    ds = dataset(packed_many, batch_size=5)  # 115 samples: 23 batches over 3 workers = 8, 8, 7
    per_worker = [lookup_many.run_keys(ds.worker_batches(PassPosition(0, (), 0, w, 3))) for w in range(3)]
    assert [len(b) for b in per_worker] == [8, 8, 7]
    expected = [per_worker[j % 3][j // 3] for j in range(23)]
    assert lookup_many.run_keys(make_loader(ds, num_workers=3)) == expected


def test_resume_refuses_other_settings(packed_many):
    state = make_loader(dataset(packed_many), num_workers=2).state_dict()
    with pytest.raises(ResumeError, match=r"batch_size: saved 8, now 4"):
        make_loader(dataset(packed_many, batch_size=4), num_workers=2).load_state_dict(state)
    with pytest.raises(ResumeError, match="not a ShardLoader state"):
        make_loader(dataset(packed_many), num_workers=2).load_state_dict({"epoch": 1})
    ev = make_loader(dataset(packed_many, mode="eval"), num_workers=2)
    next(iter(ev))
    with pytest.raises(ResumeError, match=r"eval pass resumes only at the saved topology"):
        make_loader(dataset(packed_many, mode="eval"), num_workers=0).load_state_dict(ev.state_dict())


@pytest.fixture(scope="module")
def two_splits(loader_tree, tmp_path_factory):
    """``loader_tree`` packed twice into one dataset, as splits ``train`` and ``val`` of the same size."""
    root = tmp_path_factory.mktemp("two_splits")
    for split in ("train", "val"):
        pack(loader_tree, root, PackConfig(split=split, shard_size=20_000, workers=2))
    return root


def test_resume_refuses_a_state_of_another_split_or_dataset(two_splits, packed_many, packed_few):
    """Same sample count, batch size and seed: only the data differs, and resuming would skip samples."""
    train = make_loader(dataset(two_splits, split="train"), num_workers=0)
    next(iter(train))
    state = train.state_dict()
    with pytest.raises(ResumeError, match=r"split: saved 'train', now 'val'"):
        make_loader(dataset(two_splits, split="val"), num_workers=0).load_state_dict(state)
    with pytest.raises(ResumeError, match=r"split: saved 'train', now 'val'"):
        dataset(two_splits, split="val").load_state_dict(train.dataset.state_dict())
    many = make_loader(dataset(packed_many), num_workers=0)
    next(iter(many))
    with pytest.raises(
        ResumeError, match=r"cannot resume: the ShardLoader differs .*shards: saved '\w+', now '\w+'"
    ):
        make_loader(dataset(packed_few), num_workers=0).load_state_dict(many.state_dict())
    # The same data elsewhere (a copy, a mirror) resumes; a state saved before these were recorded too.
    make_loader(dataset(two_splits, split="train"), num_workers=0).load_state_dict(state)
    older = {k: v for k, v in state.items() if k not in ("split", "shards")} | {"version": 2, "batches": 0}
    make_loader(dataset(two_splits, split="val"), num_workers=0).load_state_dict(older)


def test_a_state_saved_mid_epoch_by_an_older_order_is_refused_naming_the_way_out(two_splits):
    """Versions 4 and 5 changed the order's draws (issues 37, 49): an older mid-epoch state, another order."""
    ld = make_loader(dataset(two_splits), num_workers=0)
    next(iter(ld))
    state = ld.state_dict()
    assert state["version"] == 5 and state["batches"] > 0
    fresh = make_loader(dataset(two_splits), num_workers=0)
    for older in (3, 4):
        with pytest.raises(
            ResumeError, match=rf"version {older}\) was saved mid-epoch .* loader\.set_epoch\(0\)"
        ):
            fresh.load_state_dict(state | {"version": older})
    assert fresh.epoch == 0
    fresh.load_state_dict(state | {"version": 4, "batches": 0})  # where an epoch starts: the same
    assert len(list(fresh)) == len(fresh)


def test_a_path_to_the_index_reads_the_shards_beside_it(packed_few, lookup_few):
    """``ShardDataset("shards/index.json")`` is the dataset in ``shards``, as the CLI takes it (issue 30)."""
    assert run(packed_few / "index.json", lookup_few, mode="eval") == run(packed_few, lookup_few, mode="eval")
    assert dataset(packed_few / "index.json").root == packed_few


# ---- bad data ----------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_corrupt_image_is_skipped_counted_and_warned(packed_corrupt, num_workers):
    ds = ShardDataset(packed_corrupt, batch_size=4, mode="eval", transform=IDENTITY)
    loader = make_loader(ds, num_workers=num_workers)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(loader)
    assert len(batches) == len(loader) == 5
    assert sum(len(b.labels) for b in batches) == 19
    assert ds.corrupt_skipped == 1
    assert any("skipped 1 image(s) that do not decode" in str(w.message) for w in caught)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_corrupt_image_raises_when_asked(packed_corrupt, num_workers):
    ds = ShardDataset(packed_corrupt, batch_size=4, mode="eval", transform=IDENTITY, on_error="raise")
    with pytest.raises(CorruptImageError, match="does not decode"):
        list(make_loader(ds, num_workers=num_workers))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_truncated_shard_warns_and_the_epoch_goes_on(packed_copy, lookup_many, num_workers, mode):
    shard = read_manifest(packed_copy).split("train").shards[2]
    path = packed_copy / shard.name
    path.write_bytes(path.read_bytes()[: shard.bytes // 2])
    with pytest.warns(RuntimeWarning, match=f"shard .*{shard.name} is .* bytes, the index says"):
        ds = dataset(packed_copy, mode=mode, max_lost=1)  # skipped and counted, whatever it loses
    loader = make_loader(ds, num_workers=num_workers)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = lookup_many.run_keys(loader)
    keys = flat(batches)
    assert 0 < ds.lost_samples < shard.samples
    if mode == "train":  # lost samples are made up: the batch count and sizes hold
        assert len(batches) == len(loader) and len(keys) == ds.num_samples
        assert len(set(keys)) == ds.num_samples - ds.lost_samples
    else:  # eval makes nothing up, and says what the pass lacked
        assert len(keys) == len(set(keys)) == ds.num_samples - ds.lost_samples
    how = "made up by repeating others" if mode == "train" else "missing from this pass"
    lost = [str(w.message) for w in caught if "were lost to truncated" in str(w.message)]
    assert len(lost) == 1 and f"epoch 0: {ds.lost_samples} planned sample(s)" in lost[0] and how in lost[0]
    if num_workers == 0:  # a worker's own warnings print in the worker
        assert any(f"shard {shard.name} holds only" in str(w.message) for w in caught)
    assert loader.epoch == 1


def test_missing_shard_fails_at_construction_naming_it(packed_copy):
    name = read_manifest(packed_copy).split("train").shards[4].name
    (packed_copy / name).unlink()
    with pytest.raises(ManifestError, match=f"shard {name} of split 'train' is missing"):
        dataset(packed_copy)


def test_bad_index_or_split_fails_at_construction(packed_copy, tmp_path):
    with pytest.raises(ManifestError, match=r"no split 'val'.*'train'"):
        dataset(packed_copy, split="val")
    (packed_copy / "index.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        dataset(packed_copy)
    with pytest.raises(ManifestError, match=r"nowhere does not exist: check the path"):
        dataset(tmp_path / "nowhere")
    with pytest.raises(ManifestError, match=r"no index\.json in"):
        dataset(tmp_path)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"mode": "training"}, r"unknown mode 'training'; expected one of \['train', 'eval'\]"),
        ({"on_error": "ignore"}, r"unknown on_error 'ignore'; expected one of \['skip', 'raise'\]"),
        ({"transform": "resnet50"}, r"unknown transform preset 'resnet50'; expected one of"),
        ({"transform": 3}, "transform must be one of"),
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({"mode": "eval", "drop_last": True}, "drop_last applies to mode='train' only"),
        ({"rank": 2, "world_size": 2}, "need 0 <= rank < world_size"),
        ({"seed": -1}, "seed must be a non-negative"),
    ],
)
def test_bad_arguments_fail_at_construction_naming_the_choices(packed_many, kw, match):
    with pytest.raises(ConfigError, match=match):
        dataset(packed_many, **kw)


def test_spawned_workers_give_the_same_batches(packed_many, lookup_many):
    """With the spawn start method the dataset is pickled into each worker; nothing changes."""
    ds = dataset(packed_many)
    loader = make_loader(ds, num_workers=2, multiprocessing_context="spawn")
    assert lookup_many.run_keys(loader) == run(packed_many, lookup_many, num_workers=2)
    assert lookup_many.run_keys(loader) == run(packed_many, lookup_many, num_workers=2, epoch=1)


def test_a_dropped_dataset_unmaps_the_buffers_kept_for_its_workers(packed_many):
    from imgshards.loader.state import buffers

    ds = dataset(packed_many, batch_size=4)
    loader = make_loader(ds, num_workers=2, persistent_workers=True)
    before = set(buffers._KEPT)
    for _ in loader:  # the buffers handed back stay mapped here, for the batches sent by name
        pass
    (name,) = set(buffers._KEPT) - before  # this dataset's buffers, under the name of its pool
    assert buffers._KEPT.get(name), "buffers are kept while the dataset lives"
    del loader, ds
    gc.collect()
    assert name not in buffers._KEPT
