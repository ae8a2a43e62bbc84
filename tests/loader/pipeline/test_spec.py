"""Every setting of a dataset is held once: as given in its spec's ``settings``, what follows in the spec.

One builder (:func:`make_spec`) makes every dataset's :class:`Spec` from a
:class:`~imgshards.loader.Settings`; the spec and its parts hold each thing in one field, and
everything else (a part's order layout, the batch size of a mix, the classes of a mix) is computed
from them. The tables here name each field's owner: a new field, or one name held in two places,
fails until a person says where it belongs.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from imgshards.loader import MixedDataset, Settings, ShardDataset
from imgshards.loader.pipeline.spec import Part, Spec, make_spec

IDENTITY = torch.nn.Identity()

# Every field of the spec and of its parts, and what it holds.
FIELDS = {
    Spec: {
        "parts": "the packed splits read (one a source)",
        "settings": "every setting as given (mode, shuffle_buffer, on_error... read from here)",
        "shuffle": "whether shard order and samples are shuffled (settings.shuffle, or the mode's)",
        "transform": "the transform each image goes through (a preset made at image_size, or the caller's)",
        "decode_on": "where the training process decodes (None: the workers do)",
        "raw_stages": "the user's stages on raw samples, checked",
        "image_stages": "the user's stages on decoded images, checked",
        "weights": "a mix's weights, as given",
    },
    Part: {
        "root": "the source's directory or URL",
        "manifest": "its index",
        "split": "the split's shards, as its index lists them (its name is the split read)",
        "source": "where its shards are read from, with the remote options",
        "reader": "how its samples are read: its tables, the index's file its shards are checked against",
        "seed": "the seed of its order (a mix's part i: the seed plus i)",
        "share": "its samples in a batch (one part: the batch size)",
        "relabel": "its labels mapped onto the spec's classes",
    },
}

# Each argument of ShardDataset, and the one place its value is held.
OWNERS = {
    "source": "Part.root, Part.source",
    "split": "Part.split",
    "batch_size": "Part.share (Spec.batch_size: the parts' shares)",
    "mode": "Spec.settings",
    "transform": "Spec.transform",
    "image_size": "Spec.transform (the preset's size)",
    "shuffle": "Spec.settings (as given), Spec.shuffle (what follows)",
    "shuffle_buffer": "Spec.settings",
    "shuffle_initial": "Spec.settings",
    "drop_last": "Spec.settings",
    "seed": "Part.seed (Spec.seed: the first part's)",
    "rank": "EpochProgress (settled as each pass starts)",
    "world_size": "EpochProgress (settled as each pass starts)",
    "on_error": "Spec.settings",
    "max_lost": "Spec.settings",
    "storage_options": "Part.source",
    "cache_dir": "Part.source",
    "cache_limit": "Part.source",
    "prefetch": "Part.source",
    "timeout": "Part.source",
    "decode_on": "Spec.decode_on",
    "raw_stages": "Spec.raw_stages",
    "image_stages": "Spec.image_stages",
}


def test_the_tables_name_every_field_of_the_spec_and_its_parts():
    for cls, table in FIELDS.items():
        assert [f.name for f in dataclasses.fields(cls)] == list(table), cls.__name__


def test_no_name_is_held_in_two_places():
    held = [f.name for cls in FIELDS for f in dataclasses.fields(cls)]
    assert len(held) == len(set(held)), sorted(n for n in held if held.count(n) > 1)
    # What follows from the fields is computed, not held: no property shadows a field of the other.
    spec_views = {n for n, v in vars(Spec).items() if isinstance(v, property)}
    assert "seed" in spec_views and "batch_size" in spec_views and "split" in spec_views
    assert not spec_views & {f.name for f in dataclasses.fields(Spec)}


def test_every_argument_has_one_owner():
    arguments = list(inspect.signature(ShardDataset).parameters)
    assert sorted(arguments) == sorted(OWNERS)
    # The same builder makes a mix, from the same settings: ShardDataset's arguments but its source.
    assert list(inspect.signature(make_spec).parameters) == ["sources", "settings", "weights"]
    assert [f.name for f in dataclasses.fields(Settings)] == arguments[1:]


@pytest.fixture(params=["one", "mix"])
def dataset(request, packed_many, packed_few):
    if request.param == "one":
        return ShardDataset(packed_many, batch_size=8, seed=3, shuffle_buffer=40, transform=IDENTITY)
    return MixedDataset(
        [packed_many, packed_few], weights=[3, 1], batch_size=8, seed=3, shuffle_buffer=40, transform=IDENTITY
    )


def test_a_dataset_reads_its_settings_from_its_spec_and_holds_none(dataset):
    spec = dataset.spec
    assert dataset.__dict__.keys() == {"spec", "progress", "step_times"}
    assert dataset.settings is spec.settings
    for name in ("seed", "batch_size", "mode", "shuffle", "decode_on", "transform", "split", "num_samples"):
        assert getattr(dataset, name) == getattr(spec, name), name
    assert dataset.classes == list(spec.classes)
    assert (spec.seed, spec.batch_size, spec.shuffle_buffer) == (3, 8, 40)
    assert spec.batch_size == sum(p.share for p in spec.parts)
    assert [p.seed for p in spec.parts] == [3 + i for i in range(len(spec.parts))]
    # A part's order is computed from the part and the spec's settings, each held once.
    layout = spec.layout(spec.parts[-1])
    assert (layout.seed, layout.batch_size, layout.shuffle_buffer) == (
        spec.parts[-1].seed,
        spec.parts[-1].share,
        40,
    )
    assert spec.resume_settings()["seed"] == 3 and spec.resume_settings()["batch_size"] == 8
