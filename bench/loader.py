#!/usr/bin/env python3
"""Loader throughput: imgshards vs the usual ways to feed ImageNet-like JPEGs to PyTorch (issue 3).

Run by hand (not in CI), on an ImageFolder tree from shared/tools/make_imagefolder.py:

    python ../shared/tools/make_imagefolder.py --out /tmp/inet10k --classes 100 --per-class 100
    python bench/loader.py --tree /tmp/inet10k --packed /tmp/inet10k-packed

The tree is packed first if ``--packed`` has no index. For each preset (``train``, ``resnet``) it
measures images/s, all with ``--workers`` DataLoader workers and batches of ``--batch-size``:

- imgshards: ``ShardDataset`` + ``make_loader`` (uint8 batches made in the workers);
- (a) ``ImageFolder`` + ``DataLoader`` with torchvision's reference transforms on PIL images,
  ``ToTensor`` and ``Normalize`` (float batches, collated in the workers);
- (b) plain webdataset over the same shards: ``decode("pil")``, the same transforms, ``batched``
  in the workers, ``DataLoader(batch_size=None)``;
- (c) the CPU limit: one process decoding and augmenting the same images from memory in a loop
  (imgshards' decode and preset, one thread), times the worker count.

Throughput is counted from the first batch on (worker start-up excluded) over one pass. The files are
read once before timing so every pipeline reads from the page cache. The machine may be shared:
compare the ratios within one run, not numbers across runs.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
import webdataset as wds
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

from imgshards.converter import PackConfig, pack, read_manifest
from imgshards.loader import IMAGENET_MEAN, IMAGENET_STD, ShardDataset, decode, make_loader, preset

TARGETS = {"a": 1.9, "b": 2.2, "c": 0.85}


def reference_transform(name: str) -> Callable:
    """torchvision's reference pipeline on PIL images, ending in a normalized float tensor."""
    if name == "train":
        return T.Compose(
            [
                T.RandomResizedCrop(224),
                T.RandomHorizontalFlip(),
                T.ToTensor(),
                T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ]
        )
    return v2.Compose(
        [
            v2.RandomShortestSize(list(range(256, 481))),
            v2.RandomCrop(224),
            v2.RandomHorizontalFlip(),
            v2.ColorJitter(0.4, 0.4, 0.4),
            v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def timed(batches: Iterable, limit: int) -> float:
    """Images per second from the first batch on, over at most ``limit`` images."""
    it = iter(batches)
    first = next(it)
    start, seen = time.perf_counter(), 0
    for images, _ in it:
        seen += len(images)
        if seen + len(first[0]) >= limit:
            break
    return seen / (time.perf_counter() - start)


def run_imgshards(packed: Path, name: str, args: argparse.Namespace) -> float:
    ds = ShardDataset(packed, batch_size=args.batch_size, transform=name)
    return timed(make_loader(ds, num_workers=args.workers), args.images)


def run_imagefolder(tree: Path, name: str, args: argparse.Namespace) -> float:
    ds = ImageFolder(str(tree), transform=reference_transform(name))
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    return timed(loader, args.images)


def run_webdataset(packed: Path, name: str, args: argparse.Namespace) -> float:
    urls = [str(packed / s.name) for s in read_manifest(packed).split("train").shards]
    pipeline = (
        wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.single_node_only, empty_check=False)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(reference_transform(name), lambda x: x)
        .batched(args.batch_size)
    )
    return timed(DataLoader(pipeline, batch_size=None, num_workers=args.workers), args.images)


def run_cpu_limit(images: list[bytes], name: str, args: argparse.Namespace) -> float:
    transform = preset(name)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker
    try:
        start = time.perf_counter()
        for data in images:
            transform(decode(data, "jpg"))
        rate = len(images) / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return rate * args.workers


def load_images(packed: Path, count: int) -> list[bytes]:
    out: list[bytes] = []
    for shard in read_manifest(packed).split("train").shards:
        with tarfile.open(packed / shard.name) as tar:
            for member in tar:
                if member.name.endswith(".jpg"):
                    f = tar.extractfile(member)
                    assert f is not None
                    out.append(f.read())
                    if len(out) == count:
                        return out
    return out


def warm_cache(*roots: Path) -> None:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                with open(path, "rb") as f:
                    while f.read(1 << 22):
                        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, required=True, help="ImageFolder tree (make_imagefolder.py)")
    p.add_argument("--packed", type=Path, required=True, help="packed copy of the tree (made if absent)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--images", type=int, default=10_000, help="images per measurement (one pass at most)")
    p.add_argument("--cpu-images", type=int, default=2000, help="images for the CPU limit (c)")
    p.add_argument("--shard-size", type=int, default=64 * 10**6, help="bytes per shard when packing")
    p.add_argument("--presets", nargs="+", default=["train", "resnet"], choices=["train", "resnet"])
    args = p.parse_args()

    if not (args.packed / "index.json").exists():
        print(f"packing {args.tree} -> {args.packed} ...", file=sys.stderr)
        pack(
            args.tree,
            args.packed,
            PackConfig(split="train", shard_size=args.shard_size, workers=args.workers),
        )
    manifest = read_manifest(args.packed).split("train")
    warm_cache(args.tree, args.packed)
    images = load_images(args.packed, args.cpu_images)

    print(
        f"{manifest.samples} images in {len(manifest.shards)} shards, {args.workers} workers, batch "
        f"{args.batch_size}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    )
    rows = []
    for name in args.presets:
        rates = {
            "imgshards": run_imgshards(args.packed, name, args),
            "a": run_imagefolder(args.tree, name, args),
            "b": run_webdataset(args.packed, name, args),
            "c": run_cpu_limit(images, name, args),
        }
        rows.append((name, rates))
        print(f"  measured {name}: " + ", ".join(f"{k} {v:.0f}" for k, v in rates.items()), file=sys.stderr)

    labels = {
        "imgshards": "imgshards ShardDataset + make_loader",
        "a": "(a) ImageFolder + DataLoader, PIL transforms",
        "b": "(b) webdataset decode('pil') + batched",
        "c": f"(c) CPU limit: 1 process x {args.workers}",
    }
    print()
    print(f"| preset | pipeline | images/s | imgshards / this | target |")
    print("|---|---|---:|---:|---:|")
    for name, rates in rows:
        for key, label in labels.items():
            ratio = rates["imgshards"] / rates[key]
            target = f">= {TARGETS[key]:.2f}" if key in TARGETS and name == "train" else ""
            met = "" if not target else (" ok" if ratio >= TARGETS[key] else " MISSED")
            print(f"| {name} | {label} | {rates[key]:.0f} | {ratio:.2f} | {target}{met} |")


if __name__ == "__main__":
    main()
