"""The loader under real ``torch.distributed``: gloo process groups of 2 and 3 ranks on localhost.

Each configuration starts its ranks as separate processes (``ddp_worker.py``), each rank with 0 or
2 DataLoader workers, over two packings of the same tree: ~20 shards (more than the 6 global
workers at most) and 2 shards (fewer). Every rank all-reduces once per training batch, as DDP does,
so unequal batch counts would hang (and time out) rather than pass.
"""

from __future__ import annotations

import json
import pickle
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("ddp_worker.py")
BATCH_SIZE = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(
    scope="module", params=[(2, 0), (2, 2), (3, 0), (3, 2)], ids=lambda p: f"world{p[0]}-workers{p[1]}"
)
def ddp(request, packed_many, packed_few, lookup_many, lookup_few, tmp_path_factory):
    world_size, num_workers = request.param
    out = tmp_path_factory.mktemp("ddp") / "result"
    cfg = {
        "port": free_port(),
        "world_size": world_size,
        "num_workers": num_workers,
        "batch_size": BATCH_SIZE,
        "stop": 3,
        "out": str(out),
        "datasets": {"many": str(packed_many), "few": str(packed_few)},
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(cfg), str(rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world_size)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            p.kill()
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} failed:\n{logs[rank][-3000:]}"
    results = [pickle.loads(Path(f"{out}.{rank}").read_bytes()) for rank in range(world_size)]
    lookups = {"many": lookup_many, "few": lookup_few}

    def keys(batches, which):
        return [[lookups[which].key_of[h] for h in batch] for batch in batches]

    return world_size, results, lookups, keys


@pytest.mark.parametrize("which", ["many", "few"])
def test_ranks_come_from_torch_distributed_and_yield_equal_batches(ddp, which):
    world_size, results, _, _ = ddp
    assert [r[which]["rank"] for r in results] == list(range(world_size))
    assert all(r[which]["world_size"] == world_size for r in results)
    lens = {r[which]["len"] for r in results}
    assert len(lens) == 1
    for r in results:
        assert all(
            len(r[which][run]) == r[which]["len"] for run in ("epoch0", "epoch1", "repeat0", "resumed1")
        )


@pytest.mark.parametrize("which", ["many", "few"])
def test_train_epoch_has_no_duplicates_beyond_the_remainder(ddp, which):
    world_size, results, lookups, keys = ddp
    n = len(lookups[which].keys)
    for run in ("epoch0", "epoch1"):
        seen = [k for r in results for batch in keys(r[which][run], which) for k in batch]
        assert len(seen) == len(set(seen)), "a sample came twice in one epoch"
        assert n - len(seen) == n % world_size
        for r in results:
            assert all(len(b) == BATCH_SIZE for b in r[which][run][:-1])


@pytest.mark.parametrize("which", ["many", "few"])
def test_epochs_differ_and_the_same_seed_repeats(ddp, which):
    _, results, _, _ = ddp
    assert [r[which]["epoch0"] for r in results] != [r[which]["epoch1"] for r in results]
    assert all(r[which]["epoch0"] == r[which]["repeat0"] for r in results)


@pytest.mark.parametrize("which", ["many", "few"])
def test_resume_mid_epoch_continues_exactly(ddp, which):
    _, results, _, _ = ddp
    assert all(r[which]["resumed1"] == r[which]["epoch1"] for r in results)


@pytest.mark.parametrize("which", ["many", "few"])
def test_eval_covers_every_sample_exactly_once(ddp, which):
    _, results, lookups, keys = ddp
    seen = Counter(k for r in results for batch in keys(r[which]["eval"], which) for k in batch)
    assert seen == Counter(lookups[which].keys)
    counts = [len(r[which]["eval"]) for r in results]
    assert counts == [r[which]["eval_len"] for r in results]
    assert max(counts) - min(counts) <= 1
