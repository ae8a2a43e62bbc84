"""Elastic resume under real gloo process groups: a mid-epoch state from W1 ranks x N1 workers, resumed
at W2 x N2, delivers the rest of the epoch exactly once, in equal batch counts on every rank.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from imgshards.loader import ShardDataset
from imgshards.loader.epoch import elastic

WORKER = Path(__file__).with_name("elastic_worker.py")
BATCH = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def phase(root, tmp_path, name, *, world_size, num_workers, stop=None, state=None):
    cfg = {
        "port": free_port(), "root": str(root), "batch_size": BATCH, "world_size": world_size,
        "num_workers": num_workers, "stop": stop, "state_in": state, "out": str(tmp_path / name),
    }  # fmt: skip
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), json.dumps(cfg), str(r)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for r in range(world_size)
    ]  # fmt: skip
    logs = [p.communicate(timeout=120)[0] for p in procs]
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r}:\n{logs[r][-3000:]}"
    return [json.loads((tmp_path / f"{name}.{r}").read_text()) for r in range(world_size)]


@pytest.mark.parametrize(
    "before, after, stop",
    [((3, 2), (2, 1), 3), ((2, 0), (3, 2), 5)],
    ids=["w3n2-to-w2n1", "w2n0-to-w3n2"],
)
def test_elastic_resume_delivers_the_rest_of_the_epoch_exactly_once(
    packed_many, lookup_many, tmp_path, before, after, stop
):
    (w1, n1), (w2, n2) = before, after
    first = phase(packed_many, tmp_path, "first", world_size=w1, num_workers=n1, stop=stop)
    state = first[0]["state"]
    assert state["batches"] == stop and all(r["state"] == state for r in first)
    rest = phase(packed_many, tmp_path, "rest", world_size=w2, num_workers=n2, state=state)
    counts = {len(r["seen"]) for r in rest}
    assert len(counts) == 1, "every rank yields the same number of batches"
    assert {r["epoch"] for r in rest} == {1}, "the epoch completed"
    delivered = [lookup_many.key_of[h] for r in first + rest for b in r["seen"] for h in b]
    assert len(delivered) == len(set(delivered)), "a sample came twice"
    n = len(lookup_many.keys)
    assert len(delivered) == n - n % w1, "every sample of the epoch came"


def test_remaining_is_computed_from_indices_and_same_topology_needs_no_stage(packed_many):
    ds = ShardDataset(packed_many, batch_size=BATCH, world_size=3, rank=0)
    left = elastic.remaining(ds.spec.layout(ds.part), 0, ((3, 2, 4),))
    assert len(left) == ds.num_samples - ds.num_samples % 3 - 3 * 4 * BATCH
    samples, batches = elastic.leg_counts(len(left), 2, BATCH)
    assert sum(samples) == len(left) and max(samples) - min(samples) <= 1
    assert batches == -(-max(samples) // BATCH)
