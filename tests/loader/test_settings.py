"""Every setting is declared once (``Settings``), spelled out in the datasets' signatures, and reads back.

The names and defaults are written in three places a user reads: the signature of
``ShardDataset`` (what an IDE shows), the ``Settings`` dataclass (what ``ds.settings`` holds), and the
docs (the dataset's docstring, ``Settings``' one line each, docs/loading.md's table). A default that
differs in one of them fails here.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import torch

from imgshards.loader import MixedDataset, SettingFixedError, Settings, ShardDataset, make_loader

IDENTITY = torch.nn.Identity()
LOADING_MD = Path(__file__).resolve().parents[2] / "docs" / "loading.md"
FIELDS = [f for f in dataclasses.fields(Settings)]


def _documented(docstring: str, section: str) -> list[str]:
    """The names a Google-style ``section`` ("Args", "Attributes") of ``docstring`` documents, in order."""
    body = docstring.split(f"{section}:\n", 1)[1]
    lines = body.split("\n\n", 1)[0].splitlines()
    return [m.group(1) for line in lines if (m := re.match(r"\s{4,8}(\w+):", line))]


def test_the_signature_and_the_dataclass_hold_the_same_names_types_and_defaults():
    parameters = list(inspect.signature(ShardDataset.__init__).parameters.values())[2:]  # self, source
    assert [p.name for p in parameters] == [f.name for f in FIELDS]
    for p, f in zip(parameters, FIELDS, strict=True):
        assert p.kind is p.KEYWORD_ONLY, p.name
        assert p.default == f.default, f"{f.name}: signature {p.default!r}, Settings {f.default!r}"
        assert p.annotation == f.type, f"{f.name}: signature {p.annotation}, Settings {f.type}"


def test_a_mix_spells_out_the_same_settings_with_the_same_defaults_but_drop_last():
    parameters = list(inspect.signature(MixedDataset.__init__).parameters.values())[
        3:
    ]  # self, sources, weights
    assert [p.name for p in parameters] == [f.name for f in FIELDS]
    for p, f in zip(parameters, FIELDS, strict=True):
        assert p.kind is p.KEYWORD_ONLY and p.annotation == f.type, p.name
        assert p.default == (True if f.name == "drop_last" else f.default), p.name


def test_the_docs_name_every_setting_with_its_default():
    names = [f.name for f in FIELDS]
    assert _documented(Settings.__doc__ or "", "Attributes") == names
    assert _documented(ShardDataset.__doc__ or "", "Args") == ["source", *names]
    # docs/loading.md's section Settings, a table: | `name` | `default` | what it does |
    table = LOADING_MD.read_text().split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", table, flags=re.M))
    assert list(rows) == names, "docs/loading.md's settings table lists other settings"
    for f in FIELDS:
        assert rows[f.name] == repr(f.default), (
            f"docs/loading.md: {f.name} = {rows[f.name]}, not {f.default!r}"
        )


def test_every_argument_reads_back_as_given(packed_many, tmp_path):
    stage = lambda samples: samples  # noqa: E731
    given = {
        "split": "train",
        "batch_size": 8,
        "mode": "train",
        "transform": IDENTITY,
        "image_size": 96,
        "shuffle": False,
        "shuffle_buffer": 40,
        "shuffle_initial": 3,
        "drop_last": True,
        "seed": 7,
        "rank": 0,
        "world_size": 1,
        "on_error": "raise",
        "max_lost": 0.5,
        "storage_options": {"anon": True},
        "cache_dir": str(tmp_path / "cache"),
        "cache_limit": 1 << 20,
        "prefetch": 1,
        "timeout": 12.0,
        "decode_on": None,
        "raw_stages": [stage],
        "image_stages": [stage],
    }
    assert set(given) == {f.name for f in FIELDS}
    assert all(given[f.name] != f.default for f in FIELDS if f.name not in ("split", "mode", "decode_on"))
    ds = ShardDataset(packed_many, **given)
    assert vars(ds.settings) == given
    # The typed properties: the settings, or what follows from them.
    assert (ds.batch_size, ds.seed, ds.split, ds.mode, ds.shuffle, ds.drop_last) == (
        8,
        7,
        "train",
        "train",
        False,
        True,
    )
    assert ds.transform is IDENTITY and ds.decode_on is None and ds.num_samples == 115
    # A dataset like another: the settings as keywords.
    other = ShardDataset(ds.root, **vars(dataclasses.replace(ds.settings, batch_size=4, raw_stages=None)))
    assert other.batch_size == 4 and other.settings.seed == 7 and len(other) == 115 // 4
    assert other.settings == dataclasses.replace(ds.settings, batch_size=4, raw_stages=None)
    loader = make_loader(other, num_workers=0)
    assert sum(1 for _ in loader) == len(loader)


def test_a_mix_reads_back_its_settings(packed_many, packed_few):
    mix = MixedDataset([packed_many, packed_few], weights=[3, 1], batch_size=8, seed=3, transform=IDENTITY)
    assert mix.settings.drop_last is True and mix.settings.seed == 3 and mix.settings.batch_size == 8
    assert mix.weights == (3.0, 1.0) and mix.shares == [6, 2] and mix.batch_size == 8
    with pytest.raises(TypeError, match="unexpected keyword argument 'bacth_size'"):
        MixedDataset([packed_many, packed_few], bacth_size=8)


def test_settings_are_frozen_and_a_typo_is_no_attribute(packed_many):
    ds = ShardDataset(packed_many, batch_size=8, transform=IDENTITY)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ds.settings.batch_size = 16  # type: ignore[misc]
    with pytest.raises(AttributeError, match="bacth_size"):
        ds.bacth_size  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(SettingFixedError, match=r"did you mean 'batch_size'\?"):
        ds.bacth_size = 16
    # What used to leak from the spec is the spec's, not the dataset's.
    for name in ("train", "views", "shares", "shards_digest", "on_error", "shuffle_buffer"):
        assert not hasattr(ds, name), name
    assert "batch_size" in dir(ds) and "settings" in dir(ds)


def test_their_repr_shows_no_secret():
    settings = Settings(storage_options={"secret": "hunter2"}, cache_dir="s3://me:hunter2@bucket/cache")
    shown = repr(settings)
    assert "hunter2" not in shown and "storage_options={...}" in shown and "batch_size=64" in shown
    assert repr(Settings()).startswith("Settings(split='train', batch_size=64, mode='train', ")
