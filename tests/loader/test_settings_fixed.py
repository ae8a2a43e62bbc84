"""A dataset's settings are fixed when it is made (issue 39): setting one afterwards is refused.

Before, ``ds.shuffle_buffer = 5`` after construction changed what a resume checked but not the order
(the frozen settings a pass reads were made in ``__init__``). Now every setting is a read-only view of
the dataset's spec (loader/pipeline/spec.py): setting one raises a one-line :class:`SettingFixedError`
(a ``ConfigError`` and an ``AttributeError``) naming the way to make a new
dataset, and the order, the batches and the resume state are those of the settings it was made with.
``ImageFolder`` keeps torchvision's contract instead: ``ds.transform = ...`` is honoured there.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torchvision.transforms import v2

from imgshards.loader import ImageFolder, MixedDataset, SettingFixedError, ShardDataset, make_loader
from imgshards.loader.pipeline.steps import StepTimes

IDENTITY = torch.nn.Identity()

# A value to try for each argument (any other gets 5): each differs from what the dataset was made with.
TRIED = {
    "source": "elsewhere",
    "sources": ["a", "b"],
    "weights": [1.0, 3.0],
    "split": "val",
    "mode": "eval",
    "transform": v2.Compose([v2.RandomHorizontalFlip(), v2.Resize(8)]),
    "shuffle": False,
    "drop_last": True,
    "on_error": "raise",
    "max_lost": 0.5,
    "storage_options": {"anon": True},
    "cache_dir": "/tmp/cache",
    "decode_on": "cpu",
    "raw_stages": [],
    "image_stages": [],
}
# What follows from the data and the settings: read-only too.
DERIVED = (
    "num_samples",
    "classes",
    "class_to_idx",
    "dropped_per_epoch",
    "spec",
    "progress",
    "settings",
    "lost_samples",
    "corrupt_skipped",
    "filtered_samples",
)


def arguments(cls: type) -> list[str]:
    return list(inspect.signature(cls).parameters)


def shard_dataset(root):
    return ShardDataset(root, batch_size=8, transform=IDENTITY, seed=3, shuffle_buffer=40)


def mixed_dataset(a, b):
    return MixedDataset([a, b], weights=[3, 1], batch_size=8, transform=IDENTITY, seed=3, shuffle_buffer=40)


@pytest.fixture(params=["ShardDataset", "MixedDataset"])
def make(request, packed_many, packed_few):
    if request.param == "ShardDataset":
        return lambda: shard_dataset(packed_many)
    return lambda: mixed_dataset(packed_many, packed_few)


def refused(ds, name, value) -> str:
    with pytest.raises(SettingFixedError) as e:  # a ConfigError, and an AttributeError as in Python
        setattr(ds, name, value)
    message = str(e.value)
    assert "\n" not in message, message
    return message


def test_every_setting_is_refused_in_one_line_naming_the_way_to_change_it(make):
    ds = make()
    kind = type(ds).__name__
    names = arguments(type(ds))
    assert "shuffle_buffer" in names and "seed" in names and "transform" in names
    for name in names:
        before = getattr(ds, name, None)
        value = TRIED.get(name, 5)
        message = refused(ds, name, value)
        assert "fixed when the dataset is made" in message and f"{kind}(..., {name}=" in message, message
        assert getattr(ds, name, None) is before or getattr(ds, name, None) == before, name
    # A value whose repr spans lines (a torchvision Compose) is not printed.
    assert refused(ds, "transform", TRIED["transform"]).endswith(f"{kind}(..., transform=...)")
    assert refused(ds, "shuffle_buffer", 5).endswith(f"{kind}(..., shuffle_buffer=5)")
    # Nothing secret in the line: storage options are not shown, a URL's password is hidden.
    assert refused(ds, "storage_options", {"secret": "hunter2"}).endswith("storage_options=...)")
    assert "hunter2" not in refused(ds, "cache_dir", "s3://me:hunter2@bucket/c")
    for name in DERIVED:
        assert "read-only" in refused(ds, name, 5), name
    assert "set_epoch(2)" in refused(ds, "epoch", 2)
    with pytest.raises(SettingFixedError, match="fixed when the dataset is made"):
        del ds.seed


def test_a_refused_setting_changes_neither_the_order_nor_the_resume_check(make, lookup_many):
    ds, fresh = make(), make()
    for name, value in {"shuffle_buffer": 5, "seed": 11, "batch_size": 3, "shuffle_initial": 1}.items():
        with pytest.raises(SettingFixedError):
            setattr(ds, name, value)
    assert ds.spec.resume_settings() == fresh.spec.resume_settings()
    assert ds.spec.resume_settings()["shuffle_buffer"] == 40 and ds.spec.resume_settings()["seed"] == 3
    loader, other = make_loader(ds, num_workers=0), make_loader(fresh, num_workers=0)
    # packed_few holds the images of packed_many: one lookup names the keys of both sources.
    keys = lookup_many.run_keys(loader)
    assert keys == lookup_many.run_keys(other) and len(keys) == len(fresh)
    # A state saved from one resumes the other: the settings checked are the ones it was made with.
    loader.set_epoch(1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    other.load_state_dict(state)
    assert other.epoch == 1


def test_what_is_not_a_setting_stays_settable(make):
    ds = make()
    ds.step_times = StepTimes(1)  # a profiler's (imgshards.loader.profiling)
    assert ds.step_times is not None
    ds.step_times = None
    ds.note = "a user's own attribute"  # not a setting of the dataset: left alone
    assert ds.note == "a user's own attribute"


def test_image_folder_honours_a_transform_set_after_it_is_made(packed_many):
    # torchvision's contract: ImageFolder reads self.transform for every sample.
    ds = ImageFolder(packed_many)
    image, _ = ds[0]
    assert not isinstance(image, torch.Tensor)  # a PIL image, no transform yet
    ds.transform = v2.Compose([v2.PILToTensor(), v2.Resize((8, 6))])
    image, _ = ds[0]
    assert isinstance(image, torch.Tensor) and image.shape == (3, 8, 6)
    ds.target_transform = lambda t: t + 100
    assert ds[0][1] >= 100


def test_a_refused_setting_is_an_attribute_error_as_python_has_it(packed_many):
    # Code that probes a dataset with setattr and falls back on AttributeError (as on any read-only
    # property) goes on as it would; hasattr and getattr are untouched.
    ds = shard_dataset(packed_many)
    with pytest.raises(AttributeError):
        ds.shuffle_buffer = 5
    assert ds.settings.shuffle_buffer == 40 and hasattr(ds, "seed")


# ---- a name one slip from a setting (issue 50, point 14) -------------------------------------------

SLIPS = {
    "shufle": "shuffle",
    "batchsize": "batch_size",
    "sed": "seed",
    "transforms": "transform",
    "epoh": "epoch",
}


def test_a_name_one_slip_from_a_setting_is_refused_naming_the_setting(make):
    # Before, ds.shufle = True was a new attribute nothing read: the dataset shuffled as made.
    ds = make()
    kind = type(ds).__name__
    for name, meant in SLIPS.items():
        message = refused(ds, name, 7)
        assert message.startswith(f"{kind} has no setting {name!r} (did you mean {meant!r}?): "), message
        assert not hasattr(ds, name), name
    assert refused(ds, "shufle", True).endswith(f"{kind}(..., shuffle=True)")
    assert "call set_epoch(7)" in refused(ds, "epoh", 7)
    ds.note = "a user's own attribute"  # like no setting: set, as before
    ds.batch_note = 1
    assert ds.note and ds.batch_note == 1


class Subclassed(ShardDataset):
    """A user's subclass: its __init__ sets attributes of its own, some named like settings."""

    label_names: list[str] | None = None  # declared on the class: settable later, whatever its name

    def __init__(self, root, **kwargs):
        self.sed = "set before the dataset is made"
        super().__init__(root, **kwargs)
        self.transforms = "a subclass's own"  # one slip from "transform": its __init__ may
        self.extra = 1


def test_a_subclass_sets_its_own_attributes_and_keeps_pickling_and_workers(packed_many):
    import copy
    import pickle

    ds = Subclassed(packed_many, batch_size=8, transform=IDENTITY, seed=3)
    assert ds.transforms == "a subclass's own" and ds.sed and ds.seed == 3
    # Their signatures are their own __init__'s (documentation and introspection read them).
    assert list(inspect.signature(Subclassed).parameters) == ["root", "kwargs"]
    assert list(inspect.signature(ShardDataset).parameters)[:2] == ["source", "split"]
    ds.transforms = "set again"  # an attribute it has: set
    ds.label_names = ["a"]  # declared by the subclass
    with pytest.raises(SettingFixedError, match="did you mean 'batch_size'"):
        ds.batchsize = 32  # made: a slip is refused
    for twin in (pickle.loads(pickle.dumps(ds)), copy.copy(ds), copy.deepcopy(ds)):
        assert twin.transforms == "set again" and twin.seed == 3
        with pytest.raises(SettingFixedError):
            twin.shufle = False
    batches = list(make_loader(ds, num_workers=2))  # the workers get the dataset pickled or forked
    assert len(batches) == len(ds)
    with pytest.raises(SettingFixedError, match="did you mean 'transform'"):
        ShardDataset(packed_many, batch_size=8).transforms = IDENTITY  # not a subclass: refused
