"""User stages and a weighted mix under real ``torch.distributed``: gloo, world size 2, 2 workers a rank.

The ranks run ``stages_worker.py`` over shards that webdataset's ShardWriter wrote and ``imgshards
index`` indexed, with a filter and a map that takes the label from the ``.json`` (class names given
in reverse order). Every training batch is all-reduced, so unequal batch counts would hang.
"""

from __future__ import annotations

import json
import pickle
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

from imgshards.converter import IndexConfig, index
from imgshards.loader.image.decode import decode

WORKER = Path(__file__).with_name("stages_worker.py")
NAMES = ["n00000000", "n00000001", "n00000002", "n00000003"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_filter_and_json_labels_across_ranks_and_a_mix(
    foreign_factory, tiny_tree, packed_many, hash_image, tmp_path
):
    root, samples = foreign_factory(tiny_tree, per_shard=7, shuffle=True)
    index(root, IndexConfig(workers=1))
    cfg = {
        "port": free_port(),
        "world_size": 2,
        "num_workers": 2,
        "batch_size": 4,
        "root": str(root),
        "other": str(packed_many),
        "weights": [1, 3],
        "classes": NAMES[::-1],
        "out": str(tmp_path / "result"),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), json.dumps(cfg), str(rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        logs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} failed:\n{logs[rank][-3000:]}"
    results = [pickle.loads(Path(f"{cfg['out']}.{rank}").read_bytes()) for rank in range(2)]

    kept = {}
    for s in samples:  # the filter drops file numbers divisible by 3; the map relabels by name
        if int(s["key"].rsplit("_", 1)[-1]) % 3:
            kept[hash_image(decode(s["jpg"], "jpg"))] = 3 - s["id"]
    dropped = len(samples) - len(kept)
    # Train: len() batches on both ranks, full, of kept samples with their .json labels.
    assert results[0]["len"] == results[1]["len"] == 5
    for r in results:
        for epoch in ("epoch0", "epoch1"):
            assert len(r[epoch]) == 5 and all(len(batch) == 4 for batch in r[epoch])
            assert all(kept[h] == y for batch in r[epoch] for h, y in batch)
    assert results[0]["epoch0"] != results[0]["epoch1"]  # a new order each epoch
    # Eval: every kept sample exactly once over the ranks; the ranks' counts add up to what was dropped.
    delivered = Counter(p for r in results for batch in r["eval"] for p in batch)
    assert delivered == Counter(kept.items())
    assert sum(r["eval_filtered"] for r in results) == dropped > 0
    # The mix (1:3 of a 4-sample batch): equal batches per rank, one filtered sample a batch each.
    assert results[0]["mix_len"] == results[1]["mix_len"] == len(results[0]["mix"]) == len(results[1]["mix"])
    for r in results:
        for batch in r["mix"][:-1]:
            assert sum(h in kept for h, _ in batch) == 1 and len(batch) == 4
