"""The loader's guarantees where users run it: torchdata's StatefulDataLoader, Lightning, Accelerate.

Real packages, CPU, real DataLoader workers; the multi-process runs use gloo process groups of 2
ranks on localhost, started as separate processes (``framework_worker.py``).
"""

from __future__ import annotations

import json
import logging
from itertools import islice
from pathlib import Path

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from imgshards.loader import ResumeError, ShardDataset, make_loader

IDENTITY = torch.nn.Identity()
WORKER = Path(__file__).with_name("framework_worker.py")


def stateful_loader(root, num_workers):
    ds = ShardDataset(root, batch_size=8, transform=IDENTITY)
    return ds, StatefulDataLoader(ds, batch_size=None, num_workers=num_workers)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
def test_stateful_dataloader_resumes_without_fast_forwarding(packed_many, lookup_many, num_workers, caplog):
    ds, loader = stateful_loader(packed_many, num_workers)
    ds.set_epoch(1)
    full = lookup_many.run_keys(loader)
    assert len(full) == len(loader) == len(ds)

    ds, loader = stateful_loader(packed_many, num_workers)
    ds.set_epoch(1)
    head = lookup_many.run_keys(islice(iter(loader), 5))
    state = loader.state_dict()

    ds, resumed = stateful_loader(packed_many, num_workers)
    ds.set_epoch(1)
    resumed.load_state_dict(state)
    with caplog.at_level(logging.WARNING):
        tail = lookup_many.run_keys(resumed)
    assert head + tail == full
    assert "fast-forwarding" not in caplog.text, "torchdata decoded what it skips"
    # The next epoch, as a training loop sets it, is the same as a fresh loader's.
    ds.set_epoch(2)
    fresh_ds, fresh = stateful_loader(packed_many, num_workers)
    fresh_ds.set_epoch(2)
    assert lookup_many.run_keys(resumed) == lookup_many.run_keys(fresh) != full


def test_dataset_state_refuses_other_settings(packed_many):
    ds = ShardDataset(packed_many, batch_size=8, transform=IDENTITY)
    state = ds.state_dict()
    with pytest.raises(ResumeError, match="batch_size: saved 8, now 4"):
        ShardDataset(packed_many, batch_size=4, transform=IDENTITY).load_state_dict(state)
    with pytest.raises(ResumeError, match=r"goes to loader\.load_state_dict"):
        ds.load_state_dict(make_loader(ds, num_workers=0).state_dict())


def phase(torchrun, mode: str, cfg: dict, tmp_path: Path, name: str) -> list[dict]:
    """Run one phase under torchrun; each rank's result."""
    cfg = {**cfg, "out": str(tmp_path / name)}
    torchrun(WORKER, mode, json.dumps(cfg))
    return [json.loads((tmp_path / f"{name}.{rank}").read_text()) for rank in range(2)]


def epochs_of(result: dict) -> list[list[list[str]]]:
    return [result["seen"][k] for k in sorted(result["seen"], key=int)]


@pytest.fixture(scope="module")
def base_cfg(packed_many):
    return {"root": str(packed_many), "batch_size": 8, "num_workers": 2, "epochs": 3}


def test_lightning_fit_epochs_differ_ranks_match_and_a_killed_run_resumes_exactly(
    base_cfg, tmp_path, torchrun
):
    full = phase(torchrun, "lightning", base_cfg, tmp_path, "full")
    for r in full:
        epochs = epochs_of(r)
        assert len(epochs) == 3 and all(len(e) == r["len"] for e in epochs), "equal batches per rank"
        assert epochs[0] != epochs[1] != epochs[2] != epochs[0], "every epoch has its own order"
    assert full[0]["len"] == full[1]["len"]
    # The loader is built before fit() joins the process group: its rank is settled as a pass starts.
    seen = [h for r in full for batch in epochs_of(r)[0] for h in batch]
    assert len(seen) == len(set(seen)), "the ranks split the epoch"
    ckpt = str(tmp_path / "mid.ckpt")
    killed = phase(
        torchrun, "lightning", {**base_cfg, "kill_at": [1, 3], "ckpt_out": ckpt}, tmp_path, "killed"
    )
    resumed = phase(torchrun, "lightning", {**base_cfg, "ckpt": ckpt}, tmp_path, "resumed")
    for rank in range(2):
        before, after, want = epochs_of(killed[rank]), resumed[rank]["seen"], epochs_of(full[rank])
        assert before[0] == want[0]
        # The batch being trained on when the checkpoint was saved counts as done (as Lightning counts it).
        assert before[1][:4] + after["1"] == want[1], "the rest of the killed epoch is exact"
        assert after["2"] == want[2]


def test_accelerate_prepare_under_torchrun(base_cfg, tmp_path, torchrun):
    results = phase(torchrun, "accelerate", {**base_cfg, "epochs": 2}, tmp_path, "accelerate")
    for r in results:
        assert r["same_loader"] and r["world"] == 2  # prepare() leaves the ShardLoader as it is
        epochs = epochs_of(r)
        assert all(len(e) == r["len"] for e in epochs) and epochs[0] != epochs[1]
    seen = [h for r in results for batch in epochs_of(r)[0] for h in batch]
    assert len(seen) == len(set(seen)), "the ranks split the epoch"
