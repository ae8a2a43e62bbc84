"""PyTorch users' habits on real packed shards with real DataLoader workers.

Every ``iter()`` is a whole pass (a peek or a ``break`` never shortens the next one), a plain
``DataLoader(ds, batch_size=None)`` gets a new order each pass with or without ``set_epoch``,
``DataLoader(ds, batch_size=N)`` fails at the first batch in one line naming the fix, and
transforms written for ``ImageFolder`` (PIL in, ``ToTensor``/``Normalize``: loader/image/pil_input.py)
or torchvision v2 (``ToDtype(torch.float32)``) work.
"""

from __future__ import annotations

from itertools import islice

import pytest
import torch
from torch.utils.data import DataLoader

from imgshards.loader import ConfigError, ShardDataset, make_loader
from imgshards.loader.state.cursor import SharedControl

IDENTITY = torch.nn.Identity()


def dataset(root, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("transform", IDENTITY)
    return ShardDataset(root, **kw)


def epoch_keys(root, lookup, epoch, num_workers=2):
    loader = make_loader(dataset(root), num_workers=num_workers)
    loader.set_epoch(epoch)
    return lookup.run_keys(loader)


def flat(batches):
    return [k for b in batches for k in b]


# ---- every iter() is a whole pass ------------------------------------------------------------------


@pytest.mark.parametrize("persistent", [True, False])
def test_a_peek_then_a_full_pass_gives_len_batches(packed_many, lookup_many, persistent):
    loader = make_loader(dataset(packed_many), num_workers=2, persistent_workers=persistent)
    peek = next(iter(loader))
    assert peek.images.shape[1:] == (3, 48, 64)
    full = lookup_many.run_keys(loader)
    assert len(full) == len(loader) == 15
    assert sorted(flat(full)) == sorted(lookup_many.keys)  # the whole epoch, each sample once
    assert full == epoch_keys(packed_many, lookup_many, 1)  # the peek used epoch 0


@pytest.mark.parametrize("persistent", [True, False])
def test_broken_off_passes_advance_the_epoch_and_never_shorten_the_next(packed_many, lookup_many, persistent):
    loader = make_loader(dataset(packed_many), num_workers=2, persistent_workers=persistent)
    heads = []
    for _ in range(3):  # a debug loop: three "epochs" of 3 steps
        heads.append(lookup_many.run_keys(islice(loader, 3)))
    assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["batches"] == 3
    full = lookup_many.run_keys(loader)
    assert len(full) == len(loader)
    for epoch, head in enumerate(heads):
        assert head == epoch_keys(packed_many, lookup_many, epoch)[:3]
    assert full == epoch_keys(packed_many, lookup_many, 3)
    assert loader.epoch == 4


def test_set_epoch_after_a_broken_off_pass_reads_that_epoch_whole(packed_many, lookup_many):
    loader = make_loader(dataset(packed_many), num_workers=2)
    for epoch in range(2):
        loader.set_epoch(epoch)
        head = lookup_many.run_keys(islice(loader, 2))
        loader.set_epoch(epoch)
        whole = lookup_many.run_keys(loader)
        assert head == whole[:2] and whole == epoch_keys(packed_many, lookup_many, epoch)


def test_a_saved_state_of_a_broken_off_pass_resumes_it(packed_many, lookup_many):
    """Only load_state_dict continues a pass: a break, a checkpoint, a new process."""
    loader = make_loader(dataset(packed_many), num_workers=2)
    head = lookup_many.run_keys(islice(loader, 4))
    resumed = make_loader(dataset(packed_many), num_workers=2)
    resumed.load_state_dict(loader.state_dict())
    assert head + lookup_many.run_keys(resumed) == epoch_keys(packed_many, lookup_many, 0)


# ---- a plain DataLoader ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "num_workers, persistent", [(0, False), (2, False), (2, True)], ids=["main", "workers", "persistent"]
)
def test_a_plain_dataloader_reads_a_new_epoch_each_pass(packed_many, lookup_many, num_workers, persistent):
    ds = dataset(packed_many)
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers, persistent_workers=persistent)
    passes = [lookup_many.run_keys(loader) for _ in range(3)]
    orders = [flat(p) for p in passes]
    assert all(sorted(o) == sorted(lookup_many.keys) for o in orders), "each pass a permutation"
    assert orders[0] != orders[1] != orders[2] != orders[0]
    assert passes == [epoch_keys(packed_many, lookup_many, e, num_workers) for e in range(3)]
    assert ds.epoch == 2
    # set_epoch still chooses the epoch, as with DistributedSampler
    ds.set_epoch(1)
    assert lookup_many.run_keys(loader) == passes[1]
    assert lookup_many.run_keys(loader) == passes[2]


def test_set_epoch_takes_a_whole_number_and_refuses_a_fraction_in_one_line(packed_many):
    # Issue 50, point 15: set_epoch(1.5) was read as epoch 1, silently.
    import numpy as np

    ds = dataset(packed_many)
    loader = make_loader(ds, num_workers=0)
    for bad in (1.5, float("nan"), float("inf"), -1, True, "2", 2**63):
        for target in (ds, loader):
            with pytest.raises(ConfigError) as e:
                target.set_epoch(bad)
            message = str(e.value)
            assert message.startswith("epoch must be a whole number from 0 to ") and f"got {bad!r}" in message
            assert "\n" not in message and ds.epoch == 0
    for good, epoch in ((3, 3), (np.int64(4), 4), (torch.tensor(5), 5), (6.0, 6)):
        ds.set_epoch(good)
        assert ds.epoch == epoch and type(ds.epoch) is int


@pytest.mark.parametrize("persistent", [True, False])
def test_a_plain_dataloader_peek_or_break_does_not_shorten_the_next_pass(
    packed_many, lookup_many, persistent
):
    ds = dataset(packed_many)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=persistent)
    next(iter(loader))
    for i, _ in enumerate(loader):
        if i == 2:
            break
    full = lookup_many.run_keys(loader)
    assert len(full) == len(ds) and sorted(flat(full)) == sorted(lookup_many.keys)
    assert full == epoch_keys(packed_many, lookup_many, 2) and ds.epoch == 2


# ---- DataLoader(ds, batch_size=N) --------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_batch_size_fails_in_one_line_naming_the_fix(packed_many, num_workers):
    loader = DataLoader(dataset(packed_many), batch_size=32, num_workers=num_workers)
    default = DataLoader(dataset(packed_many), num_workers=num_workers)  # batch_size=1, its default
    with pytest.raises(ConfigError, match=r"^DataLoader\(batch_size=\.\.\.\) batches again"):
        next(iter(default))
    with pytest.raises(ConfigError) as caught:
        next(iter(loader))
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    assert "batch_size=None" in message and "make_loader" in message
    assert "ShardDataset(..., batch_size=N)" in message


# ---- transforms written for ImageFolder, and float ones ----------------------------------------------

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def test_a_v1_imagefolder_transform_gets_pil_images_and_its_floats_are_stacked(packed_many):
    from PIL import Image
    from torchvision import transforms as T

    v1 = T.Compose([T.Resize((24, 32)), T.ToTensor(), T.Normalize(MEAN, STD)])
    plain = [b.images for b in make_loader(dataset(packed_many), num_workers=2)]
    batches = list(make_loader(dataset(packed_many, transform=v1), num_workers=2))
    assert len(batches) == len(plain) == 15
    for batch, raw in zip(batches, plain, strict=True):
        assert batch.images.dtype == torch.float32 and batch.images.shape == (len(raw), 3, 24, 32)
        expected = torch.stack(
            [v1(Image.fromarray(img.permute(1, 2, 0).contiguous().numpy())) for img in raw]
        )
        torch.testing.assert_close(batch.images, expected)
    # a plain DataLoader, and a random v1 pipeline (seeded per batch: the same on a rerun)
    augment = T.Compose(
        [T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
    )
    runs = [
        [
            b.images
            for b in DataLoader(dataset(packed_many, transform=augment), batch_size=None, num_workers=2)
        ]
        for _ in range(2)
    ]
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
    assert runs[0][0].shape == (8, 3, 16, 16) and runs[0][0].min() < 0  # normalized


@pytest.mark.filterwarnings("ignore:The transform `ToTensor\\(\\)` is deprecated")
def test_a_v2_transform_returning_floats_is_stacked(packed_many):
    from torchvision.transforms import v2

    tf = v2.Compose(
        [v2.RandomResizedCrop(16), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    )
    loader = make_loader(dataset(packed_many, transform=tf), num_workers=2)
    batches = list(loader)
    assert len(batches) == len(loader)
    assert all(b.images.dtype == torch.float32 and b.images.shape[1:] == (3, 16, 16) for b in batches)
    # v2's deprecated ToTensor passes a tensor on unscaled: such a pipeline gets PIL images too
    legacy = v2.Compose([v2.Resize((16, 16)), v2.ToTensor(), v2.Normalize(MEAN, STD)])
    first = next(iter(make_loader(dataset(packed_many, transform=legacy), num_workers=0)))
    assert first.images.dtype == torch.float32 and -3 < float(first.images.min()) < 0


def test_a_transform_of_varying_sizes_is_named_as_such_and_a_non_tensor_too(packed_many):
    sizes = iter(range(10, 10_000))

    def varying(img):
        n = next(sizes)
        return img[:, : n % 5 + 10, :12]

    with pytest.raises(ConfigError, match=r"one size, got \(3, 10, 12\) and \(3, 11, 12\)"):
        next(iter(make_loader(dataset(packed_many, transform=varying), num_workers=0)))
    with pytest.raises(ConfigError, match=r"image tensors \[C, H, W\], but the transform returned a list"):
        next(iter(make_loader(dataset(packed_many, transform=lambda img: [img]), num_workers=0)))


def test_a_persistent_worker_late_for_a_pass_joins_it_though_another_began_the_next():
    """A peek, then at once another pass: worker 0 begins both before worker 1 begins the first."""
    cursor = SharedControl().cursor
    first = cursor.plain_pass(token=101, slot=0)
    second = cursor.plain_pass(token=202, slot=0)
    assert (first[0], second[0]) == (0, 1)
    assert cursor.plain_pass(token=101, slot=1) == first  # late for pass 0: it joins pass 0
    assert cursor.plain_pass(token=202, slot=1) == second
    assert cursor.plain_pass(token=303, slot=1)[0] == 2  # and the next pass is epoch 2 for both
    assert cursor.plain_pass(token=303, slot=0)[0] == 2
