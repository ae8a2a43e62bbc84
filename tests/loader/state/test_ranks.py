"""Rank and world size settled when a pass starts, not when the dataset is built (issue 31).

Under real ``torchrun --nproc_per_node 2`` (``ranks_worker.py``): a loader built before
``init_process_group``, and one with no process group at all, each deliver their rank's part, and
the ranks together every eval sample exactly once. In one process: the launcher's variables set
after a dataset is built decide its next pass, and arguments that contradict them are refused.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from imgshards.loader import ConfigError, ShardDataset, make_loader

WORKER = Path(__file__).with_name("ranks_worker.py")
IDENTITY = torch.nn.Identity()


@pytest.fixture(scope="module", params=[0, 2], ids=lambda n: f"workers{n}")
def ranks(request, packed_many, tmp_path_factory, torchrun):
    out = tmp_path_factory.mktemp("ranks") / "result"
    cfg = {"root": str(packed_many), "batch_size": 8, "num_workers": request.param, "out": str(out)}
    torchrun(WORKER, json.dumps(cfg))
    return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(2)]


@pytest.mark.parametrize("run", ["alone", "eval"], ids=["no-process-group", "built-before-the-group"])
def test_each_rank_delivers_its_part_and_the_ranks_every_eval_sample_once(ranks, lookup_many, run):
    parts = [Counter(lookup_many.key_of[h] for batch in r[run]["seen"] for h in batch) for r in ranks]
    assert parts[0] + parts[1] == Counter(lookup_many.keys), "every eval sample exactly once over the ranks"
    assert not parts[0] & parts[1]
    assert [len(r[run]["seen"]) for r in ranks] == [r[run]["len"] for r in ranks]
    assert sum(r[run]["len"] for r in ranks) == -(-len(lookup_many.keys) // 8)


def test_a_train_pass_built_before_the_group_splits_the_epoch(ranks, lookup_many):
    assert [r["ranks"] for r in ranks] == [[0, 2], [1, 2]]
    seen = [lookup_many.key_of[h] for r in ranks for batch in r["train"]["seen"] for h in batch]
    assert len(seen) == len(set(seen)) == len(lookup_many.keys) - len(lookup_many.keys) % 2
    assert [len(r["train"]["seen"]) for r in ranks] == [r["train"]["len"] for r in ranks] == [8, 8]


def test_the_launchers_variables_set_after_the_dataset_decide_its_next_pass(
    packed_many, lookup_many, monkeypatch
):
    ds = ShardDataset(packed_many, batch_size=8, mode="eval", transform=IDENTITY)
    assert (ds.rank, ds.world_size) == (0, 1)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    got = lookup_many.run_keys(make_loader(ds, num_workers=2))
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    told = ShardDataset(packed_many, batch_size=8, mode="eval", transform=IDENTITY, rank=1, world_size=2)
    assert got == lookup_many.run_keys(make_loader(told, num_workers=2))
    assert (ds.rank, ds.world_size) == (1, 2)  # as the pass settled it
    assert len(ds) == len(make_loader(ds, num_workers=0)) == 15  # settled anew: 0 of 1 again


def test_lightnings_launcher_variables_name_the_rank(packed_many, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = ShardDataset(packed_many, batch_size=8, mode="eval", transform=IDENTITY)
    assert (ds.rank, ds.world_size, len(ds)) == (1, 2, 7)


def test_arguments_that_contradict_the_launcher_are_refused_naming_both(packed_many, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(
        ConfigError, match=r"given rank=None, world_size=1, but the environment \(RANK=1, WORLD_SIZE=2\)"
    ):
        ShardDataset(packed_many, world_size=1)
    ShardDataset(packed_many, rank=1, world_size=2)  # the same: fine
    ds = ShardDataset(packed_many, batch_size=8, transform=IDENTITY)
    monkeypatch.setenv("WORLD_SIZE", "x2")
    with pytest.raises(ConfigError, match=r"WORLD_SIZE='x2' is not an integer"):
        len(ds)
