"""`pack --engine ray` against the local pool, on 1, 2 and 3 simulated nodes. Run by hand.

    python bench/pack_cluster.py --per-class 60 --nodes 1 2 3

One tree (synthetic, or ``--tree``); for each node count a local Ray cluster (a head with no CPU and
N nodes of one CPU each, ``ray.cluster_utils.Cluster``) is started, timed apart (cluster start-up,
``ray.init``, and a first task on every node, which starts its worker process), then the tree is
packed with ``--engine ray``. The pool packs the same tree with as many workers as the cluster has
nodes just before each Ray run (alternating, so both see the same machine load), and every Ray
output is compared with the pool's, byte for byte. Simulated nodes share this machine's cores and
disk, so Ray cannot beat the pool here: the table gives Ray's fixed costs and its per-shard cost,
from which a real cluster's time can be estimated (see docs).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from imgshards.converter import PackConfig, make_synthetic_tree, pack


def files(root: Path) -> dict[str, bytes]:
    locks = {"lock", "index.lock"}
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and p.name not in locks
    }


@ray.remote(num_cpus=1)
def _hello() -> int:
    return 0


def start(nodes: int) -> tuple[Cluster, dict[str, float]]:
    took = {}
    t = time.perf_counter()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(nodes):
        c.add_node(num_cpus=1)
    c.wait_for_nodes()
    took["cluster"] = time.perf_counter() - t
    t = time.perf_counter()
    ray.init(address=c.address, logging_level=logging.WARNING, log_to_driver=False)
    took["init"] = time.perf_counter() - t
    t = time.perf_counter()
    ids = [n.node_id for n in c.worker_nodes]
    ray.get(
        [
            _hello.options(scheduling_strategy=NodeAffinitySchedulingStrategy(i, soft=False)).remote()
            for i in ids
        ]
    )
    took["first task"] = time.perf_counter() - t
    return c, took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, default=None, help="An ImageFolder tree [default: a synthetic one].")
    p.add_argument("--per-class", type=int, default=60, help="Synthetic tree: images per class (8 classes).")
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--resize", type=int, default=64)
    p.add_argument("--shard-size", type=int, default=200_000)
    p.add_argument("--work", type=Path, default=Path("/tmp/pack-cluster"))
    a = p.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    src = a.tree or make_synthetic_tree(a.work / "tree", classes=8, per_class=a.per_class, size=(320, 240))
    options = {"resize": a.resize, "shard_size": a.shard_size}
    rows = []
    for n in a.nodes:
        pool_dst = a.work / f"pool{n}"
        t = time.perf_counter()
        pooled = pack(src, pool_dst, PackConfig(workers=n, **options))
        pool_s = time.perf_counter() - t
        c, took = start(n)
        try:
            t = time.perf_counter()
            result = pack(src, a.work / f"ray{n}", PackConfig(engine="ray", **options))
            ray_s = time.perf_counter() - t
        finally:
            ray.shutdown()
            c.shutdown()
        same = files(pool_dst) == files(a.work / f"ray{n}")
        shards = result.shards_written
        rows.append((n, pool_s, took, ray_s, shards, pooled.info.samples, same))
        shutil.rmtree(pool_dst)
        shutil.rmtree(a.work / f"ray{n}")
    print(
        f"tree: {rows[0][5]} images packed, --resize {a.resize}, {rows[0][4]} shards; this machine: "
        f"{len(os.sched_getaffinity(0))} cores"
    )
    head = "| nodes | pool s | Ray start-up s (cluster + init + first task) | Ray pack s | Ray / pool "
    head += "| Ray node-s per shard | identical |"
    print(head)
    print("|---:|---:|---|---:|---:|---:|---|")
    for n, pool_s, took, ray_s, shards, _, same in rows:
        up = sum(took.values())
        parts = " + ".join(f"{v:.1f}" for v in took.values())
        print(
            f"| {n} | {pool_s:.2f} | {up:.1f} ({parts}) | {ray_s:.2f} | {ray_s / pool_s:.1f}x "
            f"| {ray_s * n / shards * 1000:.0f} ms | {'yes' if same else 'NO'} |"
        )
    per_shard = statistics.median(r[3] * r[0] / r[4] for r in rows)
    per_image = statistics.median(r[3] * r[0] / r[5] for r in rows)
    print(
        f"median Ray cost: {per_shard * 1000:.0f} ms per shard, {per_image * 1000:.1f} ms per image "
        f"({1 / per_image:.0f} images/s per 1-CPU node)"
    )
    shutil.rmtree(a.work, ignore_errors=True)
    sys.exit(0 if all(r[6] for r in rows) else 1)


if __name__ == "__main__":
    main()
