#!/usr/bin/env python3
"""Mixing across ranks and workers: distinct classes in the first batches, one-class vs packed shards.

Run by hand (not in CI):

    python bench/mixing.py --tree /tmp/mix/tree --work /tmp/mix

Packs ``--tree`` (made with ``make_imagefolder.py`` if absent: 10 classes) twice: with ``imgshards
pack`` (globally shuffled shards) and one class per shard (webdataset's ``ShardWriter``, as foreign
shards often are). For each layout ``ranks x workers`` it plays every rank's DataLoader order
(batch ``j`` from worker ``j % workers``) from the raw samples, labels only, without decoding, and
prints, over epochs ``--epochs``: the mean number of distinct classes in a batch over each rank's
first 5 batches,
the same for an ideal uniform shuffle of the split (drawn with the same batch size), and the fewest
classes any rank sees in a whole epoch.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import webdataset as wds

from imgshards.converter import PackConfig, pack, read_manifest
from imgshards.converter.format.manifest import INDEX_NAME, Manifest, ShardInfo, SplitInfo
from imgshards.loader import ShardDataset
from imgshards.loader.epoch.position import PassPosition
from imgshards.loader.pipeline import passes
from imgshards.loader.pipeline.runs import batched

LAYOUTS = [(1, 1), (1, 4), (2, 2), (4, 2)]
FIRST = 5


def one_class_shards(packed: Path, out: Path) -> Path:
    """Re-write a packed split one class per shard (what pack never writes), with a matching index."""
    import hashlib

    out.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(packed)
    samples: dict[int, list[tuple[str, bytes]]] = {}
    for shard in manifest.split("train").shards:
        with tarfile.open(packed / shard.name) as tar:
            parts: dict[str, dict[str, bytes]] = {}
            for m in tar:
                key, ext = m.name.split(".", 1)
                f = tar.extractfile(m)
                assert f is not None
                parts.setdefault(key, {})[ext] = f.read()
        for key, p in parts.items():
            samples.setdefault(int(p["cls"]), []).append((key, p["jpg"]))
    infos = []
    for label in sorted(samples):
        name = f"train-{label:06d}.tar"
        with wds.TarWriter(str(out / name)) as w:
            for key, jpg in sorted(samples[label]):
                w.write({"__key__": key, "jpg": jpg, "cls": str(label).encode()})
        data = (out / name).read_bytes()
        infos.append(ShardInfo(name, len(samples[label]), len(data), hashlib.sha256(data).hexdigest()))
    split = SplitInfo(
        name="train", shards=tuple(infos), class_counts=tuple(len(samples[c]) for c in sorted(samples))
    )
    (out / INDEX_NAME).write_text(Manifest(classes=manifest.classes, splits={"train": split}).dumps())
    return out


def rank_labels(
    root: Path, *, rank: int, world: int, workers: int, batch: int, epoch: int
) -> list[list[int]]:
    """A rank's batches of labels in DataLoader order, from the raw samples (nothing decoded)."""
    ds = ShardDataset(root, batch_size=batch, rank=rank, world_size=world)
    per_worker = []
    for w in range(workers):
        at = PassPosition(epoch, (), 0, w, workers)
        plan, raw = (
            passes.plan(ds.spec, ds.part, at),
            passes.raw_samples(ds.spec, ds.part, at, ds.progress.counters(w)),
        )
        per_worker.append([[s.label for s in b] for _, b in batched(raw, sizes=plan.sizes, make_up=None)])
    return [per_worker[j % workers][j // workers] for j in range(sum(map(len, per_worker)))]


def ideal(labels: np.ndarray, batch: int, epochs: int) -> float:
    rng = np.random.default_rng(0)
    draws = [rng.permutation(labels)[: FIRST * batch].reshape(FIRST, batch) for _ in range(200 * epochs)]
    return float(np.mean([len(set(b.tolist())) for d in draws for b in d]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, required=True)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--per-class", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    if not args.tree.exists():
        tool = Path(__file__).resolve().parents[2] / "shared" / "tools" / "make_imagefolder.py"
        cmd = [sys.executable, str(tool), "--out", str(args.tree), "--classes", str(args.classes),
               "--per-class", str(args.per_class), "--profile", "tiny"]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True)
    packed = args.work / "packed"
    if not (packed / INDEX_NAME).exists():
        pack(args.tree, packed, PackConfig(split="train", shard_size=200_000, workers=2))
    roots = {"packed": packed, "one-class": one_class_shards(packed, args.work / "one-class")}
    labels = np.array(
        [c for c, n in enumerate(read_manifest(packed).split("train").class_counts) for _ in range(n)]
    )
    best = ideal(labels, args.batch_size, args.epochs)
    classes = len(set(labels.tolist()))
    print(
        f"{len(labels)} samples, {classes} classes, batch {args.batch_size}; distinct classes in a "
        f"batch, mean over each rank's first {FIRST} batches and {args.epochs} epochs; "
        f"ideal (uniform shuffle) {best:.1f}"
    )
    print()
    print("| shards | ranks x workers | first 5 batches | / ideal | fewest classes a rank sees in an epoch |")
    print("|---|---|---:|---:|---:|")
    for kind, root in roots.items():
        for world, workers in LAYOUTS:
            firsts, whole = [], []
            for epoch in range(args.epochs):
                for rank in range(world):
                    b = rank_labels(
                        root, rank=rank, world=world, workers=workers, batch=args.batch_size, epoch=epoch
                    )
                    firsts += [len(set(batch)) for batch in b[:FIRST]]
                    whole.append(len({x for batch in b for x in batch}))
            mean = float(np.mean(firsts))
            print(f"| {kind} | {world} x {workers} | {mean:.1f} | {mean / best:.2f} | {min(whole)} |")


if __name__ == "__main__":
    main()
