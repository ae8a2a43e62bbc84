"""``imgshards.loader.ImageFolder`` against torchvision's ``ImageFolder`` on the same tree. Run by hand.

Three measures, each in alternated rounds (the machine may be shared: the ratio of each round is
printed, and the median of each side):

- ``throughput``: the same per-sample work on both sides (PIL decode, ``RandomResizedCrop(224)``,
  ``RandomHorizontalFlip()``, ``PILToTensor()``), ``DataLoader(batch_size=32, shuffle=True,
  num_workers=2)``, ``--images`` images a run (default: an epoch). ``--cold`` drops the page cache
  before every run (``echo 3 > /proc/sys/vm/drop_caches``: root only); ``--fadvise`` adds a third
  side, imgshards with ``POSIX_FADV_RANDOM`` on its shards (no read-ahead).
- ``reads``: the reads alone (no decode), in one process, in a shuffled order: torchvision's side
  opens and reads each file, imgshards' does all of ``ds[i]`` but the decode (``pread``, tar
  parse, label). With ``--cold`` and ``--fadvise``: what read-ahead costs a random read.
- ``build``: the time and memory to build each dataset (imgshards: read the index; torchvision:
  list and sort the tree), each in a fresh process: wall time, the RSS it added, and the Python
  memory it holds after (tracemalloc, in a second process: tracing slows the listing down).

    python ../shared/tools/make_imagefolder.py --out /tmp/inet5k --classes 50 --per-class 100
    imgshards pack /tmp/inet5k /tmp/inet5k-shards
    python bench/imagefolder.py throughput /tmp/inet5k /tmp/inet5k-shards
    python bench/imagefolder.py throughput /tmp/inet5k /tmp/inet5k-shards --cold --fadvise
    python bench/imagefolder.py reads /tmp/inet5k /tmp/inet5k-shards --cold --fadvise
    python ../shared/tools/make_imagefolder.py --out /tmp/tiny100k --profile tiny \
        --classes 100 --per-class 1000
    imgshards pack /tmp/tiny100k /tmp/tiny100k-shards
    python bench/imagefolder.py build /tmp/tiny100k /tmp/tiny100k-shards
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIDES = ("torchvision", "imgshards")
FADV_SIDE = "imgshards-fadv-random"  # imgshards with POSIX_FADV_RANDOM on its shards


def drop_caches() -> None:
    """Empty the page cache (and dentries, inodes): the next read comes from the disk."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def warm(tree: Path, shards: Path) -> None:
    """Every file of both sides read once: in the page cache."""
    for path in [*tree.rglob("*"), *shards.glob("*.tar")]:
        if path.is_file():
            path.read_bytes()


def cpu_seconds() -> float:
    """CPU time of this process and of its waited-for children (the DataLoader workers, once joined)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def throughput_run(
    side: str, tree: Path, shards: Path, images: int, workers: int, seed: int
) -> tuple[float, float]:
    """Images per second of one run of ``side``, and the CPU milliseconds an image (workers included)."""
    import torch
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    from imgshards.loader import ImageFolder
    from imgshards.loader.pipeline import imagefolder

    trans = transforms.Compose(
        [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
    )
    imagefolder.FADVISE_RANDOM = side == FADV_SIDE  # the module's switch, read as a shard opens
    ds = datasets.ImageFolder(str(tree), trans) if side == "torchvision" else ImageFolder(shards, trans)
    torch.manual_seed(seed)
    loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=workers)
    cpu, start, seen = cpu_seconds(), time.perf_counter(), 0
    batches = iter(loader)
    for batch, _ in batches:
        seen += len(batch)
        if seen >= images:
            break
    elapsed = time.perf_counter() - start
    batches._shutdown_workers()  # type: ignore[attr-defined]  # joined: their CPU time is counted
    return seen / elapsed, (cpu_seconds() - cpu) * 1e3 / seen


def throughput(a: argparse.Namespace) -> None:
    sides = [*SIDES, FADV_SIDE] if a.fadvise else list(SIDES)
    images = a.images or sum(1 for p in a.tree.rglob("*") if p.is_file())
    print(
        f"throughput: {images} images a run, {a.workers} workers, page cache {'cold' if a.cold else 'warm'}"
    )
    rates: dict[str, list[float]] = {s: [] for s in sides}
    cpu: dict[str, list[float]] = {s: [] for s in sides}
    if not a.cold:
        warm(a.tree, a.shards)
    for r in range(a.rounds):
        order = sides if r % 2 == 0 else sides[::-1]  # alternated: neither side always goes first
        for side in order:
            if a.cold:
                drop_caches()
            rate, ms = throughput_run(side, a.tree, a.shards, images, a.workers, seed=r)
            rates[side].append(rate)
            cpu[side].append(ms)
        line = "  ".join(f"{s} {rates[s][-1]:7.1f}/s {cpu[s][-1]:5.2f} CPU ms" for s in sides)
        print(f"round {r + 1}: {line}  ratio {rates['imgshards'][-1] / rates['torchvision'][-1]:.2f}x")
    print()
    print("| side | images/s (median) | rounds | CPU ms an image (median) |")
    print("|---|---:|---|---:|")
    for s in sides:
        rounds = " ".join(f"{x:.1f}" for x in rates[s])
        print(f"| {s} | {statistics.median(rates[s]):.1f} | {rounds} | {statistics.median(cpu[s]):.2f} |")
    ratios = [i / t for i, t in zip(rates["imgshards"], rates["torchvision"], strict=True)]
    print(f"\nimgshards / torchvision: median {statistics.median(ratios):.2f}x (rounds: "
          f"{' '.join(f'{x:.2f}' for x in ratios)})")  # fmt: skip


def reads_run(side: str, tree: Path, shards: Path, images: int, seed: int) -> float:
    """Samples per second read (bytes only, no decode) in a shuffled order, in this one process."""
    import random

    from torchvision import datasets

    from imgshards.loader import ImageFolder
    from imgshards.loader.pipeline import imagefolder

    imagefolder.FADVISE_RANDOM = side == FADV_SIDE
    if side == "torchvision":
        paths = [p for p, _ in datasets.ImageFolder(str(tree)).samples]
        order = random.Random(seed).sample(range(len(paths)), min(images, len(paths)))
        start = time.perf_counter()
        for i in order:
            with open(paths[i], "rb") as f:  # what its pil_loader opens, read whole
                f.read()
    else:
        ds = ImageFolder(shards)
        order = random.Random(seed).sample(range(len(ds)), min(images, len(ds)))
        start = time.perf_counter()
        for i in order:
            ds._read(i)  # pread, tar parse, label: all of ds[i] but the decode
    return len(order) / (time.perf_counter() - start)


def reads(a: argparse.Namespace) -> None:
    sides = [*SIDES, FADV_SIDE] if a.fadvise else list(SIDES)
    images = a.images or sum(1 for p in a.tree.rglob("*") if p.is_file())
    print(f"reads (no decode, 1 process): {images} samples a run, page cache {'cold' if a.cold else 'warm'}")
    rates: dict[str, list[float]] = {s: [] for s in sides}
    if not a.cold:
        warm(a.tree, a.shards)
    for r in range(a.rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            if a.cold:
                drop_caches()
            rates[side].append(reads_run(side, a.tree, a.shards, images, seed=r))
        line = "  ".join(f"{s} {rates[s][-1]:8.0f}/s" for s in sides)
        print(f"round {r + 1}: {line}  ratio {rates['imgshards'][-1] / rates['torchvision'][-1]:.2f}x")
    print()
    print("| side | samples read/s (median) | rounds |")
    print("|---|---:|---|")
    for s in sides:
        print(f"| {s} | {statistics.median(rates[s]):.0f} | {' '.join(f'{x:.0f}' for x in rates[s])} |")


_BUILD = """
import gc, json, os, sys, time, tracemalloc
side, root, traced = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
from torchvision import datasets
from imgshards.loader import ImageFolder
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
gc.collect()
before = rss()
if traced:
    tracemalloc.start()
start = time.perf_counter()
ds = datasets.ImageFolder(root) if side == "torchvision" else ImageFolder(root)
elapsed = time.perf_counter() - start
held = tracemalloc.get_traced_memory()[0] if traced else 0
print(json.dumps({"s": elapsed, "rss": rss() - before, "held": held, "n": len(ds)}))
"""


def build_run(side: str, root: Path, traced: bool, cold: bool) -> dict[str, float]:
    if cold:
        drop_caches()
    cmd = [sys.executable, "-c", _BUILD, side, str(root), "1" if traced else "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def build(a: argparse.Namespace) -> None:
    roots = {"torchvision": a.tree, "imgshards": a.shards}
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in SIDES}
    held: dict[str, list[float]] = {s: [] for s in SIDES}
    print(f"build: page cache {'cold' if a.cold else 'warm'}")
    for r in range(a.rounds):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            runs[side].append(build_run(side, roots[side], traced=False, cold=a.cold))
            held[side].append(build_run(side, roots[side], traced=True, cold=a.cold)["held"])
        t, i = runs["torchvision"][-1], runs["imgshards"][-1]
        print(f"round {r + 1}: torchvision {t['s'] * 1e3:.1f} ms, imgshards {i['s'] * 1e3:.1f} ms: "
              f"{t['s'] / i['s']:.0f}x faster")  # fmt: skip
    print()
    print("| side | samples | build time (median) | RSS added | Python memory held (tracemalloc) |")
    print("|---|---:|---:|---:|---:|")
    for s in SIDES:
        med = statistics.median(x["s"] for x in runs[s])
        rss = statistics.median(x["rss"] for x in runs[s])
        print(f"| {s} | {int(runs[s][0]['n'])} | {med * 1e3:.1f} ms | {rss / 2**20:.1f} MiB | "
              f"{statistics.median(held[s]) / 2**20:.1f} MiB |")  # fmt: skip
    speed = statistics.median(
        t["s"] / i["s"] for t, i in zip(runs["torchvision"], runs["imgshards"], strict=True)
    )
    print(f"\nimgshards builds {speed:.0f}x faster (median of the rounds' ratios)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["throughput", "reads", "build"])
    p.add_argument("tree", type=Path, help="the ImageFolder tree")
    p.add_argument("shards", type=Path, help="the same tree packed (imgshards pack TREE SHARDS)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--images", type=int, default=0, help="images a throughput run (default: an epoch)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cold", action="store_true", help="drop the page cache before every run (root)")
    p.add_argument("--fadvise", action="store_true", help="also imgshards with POSIX_FADV_RANDOM")
    a = p.parse_args()
    {"throughput": throughput, "reads": reads, "build": build}[a.what](a)


if __name__ == "__main__":
    main()
