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
    python bench/imagefolder.py tables /tmp/tiny100k /tmp/tiny100k-shards --times 10
    python bench/imagefolder.py throughput /tmp/inet5k /tmp/inet5k-shards --against bc91b27

- ``tables``: ``targets`` and ``samples`` of a split of a million samples (the packed split's shards
  listed ``--times`` times in an index, as hard links), each run in a fresh process: their time, the
  memory they hold, and the shards they open (an audit hook counts every ``.tar`` opened).
- ``--against REF`` (throughput): imgshards at git ref REF as a third side, alternated with the
  others on the same shards (``git archive`` of REF on ``PYTHONPATH``, as ``bench/loader.py`` does);
  a release before index format 2 (0.1) reads them under its own index: ``--packed-against DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
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
    """Images per second of one run of ``side``, and the CPU milliseconds an image (workers included).

    Run in a fresh process (``one``): imgshards at ``--against REF`` imports another copy of it.
    """
    import torch
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    from imgshards.loader import ImageFolder

    try:
        from imgshards.loader import imagefolder
    except ImportError:  # a release before ImageFolder sat beside the other datasets (--against)
        from imgshards.loader.pipeline import imagefolder  # type: ignore[no-redef]

    trans = transforms.Compose(
        [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
    )
    imagefolder.FADVISE_RANDOM = side == FADV_SIDE  # the module's switch, read as a shard opens
    ds = datasets.ImageFolder(str(tree), trans) if side == "torchvision" else ImageFolder(str(shards), trans)
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


def run_side(side: str, a: argparse.Namespace, images: int, seed: int, python: str) -> tuple[float, float]:
    """``throughput_run`` of ``side`` in a fresh process of ``python`` (the one importing its imgshards)."""
    name = "imgshards" if side.startswith("imgshards@") else side
    # A release before index format 2 reads its own copy of the shards (--packed-against).
    shards = a.packed_against if side.startswith("imgshards@") and a.packed_against else a.shards
    cmd = [python, str(Path(__file__).resolve()), "one", str(a.tree), str(shards), "--side", name]
    cmd += ["--images", str(images), "--workers", str(a.workers), "--seed", str(seed)]
    # Out of the repo: a checkout on sys.path would shadow the imgshards under test.
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tempfile.gettempdir()).stdout
    rate, ms = json.loads(out.strip().splitlines()[-1])
    return rate, ms


def one(a: argparse.Namespace) -> None:
    print(json.dumps(throughput_run(a.side, a.tree, a.shards, a.images, a.workers, a.seed)))


def throughput(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="imgshards-against-") as tmp:
        pythons = {side: sys.executable for side in (*SIDES, FADV_SIDE)}
        if a.against:
            sys.path.insert(0, str(Path(__file__).parent))
            from loader import install_ref  # bench/loader.py's: git archive of REF, on PYTHONPATH

            pythons[f"imgshards@{a.against}"] = str(install_ref(a.against, Path(tmp)))
        _throughput(a, pythons)


def _throughput(a: argparse.Namespace, pythons: dict[str, str]) -> None:
    sides = [*SIDES, FADV_SIDE] if a.fadvise else list(SIDES)
    sides += [side for side in pythons if side.startswith("imgshards@")]
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
            rate, ms = run_side(side, a, images, r, pythons[side])
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
    for ref in (side for side in sides if side.startswith("imgshards@")):
        ratios = [i / t for i, t in zip(rates["imgshards"], rates[ref], strict=True)]
        cpus = [t / i for i, t in zip(cpu["imgshards"], cpu[ref], strict=True)]
        print(f"imgshards / {ref}: median {statistics.median(ratios):.2f}x images/s (rounds: "
              f"{' '.join(f'{x:.2f}' for x in ratios)}); CPU an image, {ref} / this: "
              f"{statistics.median(cpus):.3f}")  # fmt: skip


def reads_run(side: str, tree: Path, shards: Path, images: int, seed: int) -> float:
    """Samples per second read (bytes only, no decode) in a shuffled order, in this one process."""
    import random

    from torchvision import datasets

    from imgshards.loader import ImageFolder

    try:
        from imgshards.loader import imagefolder
    except ImportError:  # a release before ImageFolder sat beside the other datasets (--against)
        from imgshards.loader.pipeline import imagefolder  # type: ignore[no-redef]

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


_TABLES = """
import json, os, sys, time, tracemalloc
root = sys.argv[1]
opened = []
def hook(event, args):
    if event == "open" and str(args[0]).endswith(".tar"):
        opened.append(args[0])
from imgshards.loader import ImageFolder
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
ds = ImageFolder(root)
counting = sys.argv[2] == "count"  # the audit hook and tracemalloc slow it: timed in another run
if counting:
    sys.addaudithook(hook)
    tracemalloc.start()
before = rss()
start = time.perf_counter()
targets = ds.targets
t_targets = time.perf_counter() - start
samples = ds.samples
first, last = samples[0], samples[len(samples) - 1]
t_samples = time.perf_counter() - start - t_targets
n = sum(1 for _ in samples)  # every item made once
t_walk = time.perf_counter() - start - t_targets - t_samples
held = tracemalloc.get_traced_memory()[0] if counting else 0
print(json.dumps({"n": len(ds), "walked": n, "targets": t_targets, "samples": t_samples, "walk": t_walk,
                  "held": held, "rss": rss() - before, "opened": len(opened), "count0": targets.count(0)}))
"""


def tables(a: argparse.Namespace) -> None:
    """``targets`` and ``samples`` of a split of ``--times`` x the packed one (its shards listed again)."""
    import tempfile as tmpfiles

    from imgshards.converter.format.manifest import INDEX_NAME

    with tmpfiles.TemporaryDirectory(prefix="imgshards-tables-", dir=a.shards.parent) as tmp:
        doc = json.loads((a.shards / INDEX_NAME).read_text())
        split = doc["splits"]["train"]
        shards, repeated = split["shards"], []
        for k in range(a.times):  # the same shards under new names, as hard links: no bytes copied
            for shard in shards:
                name = f"r{k:03d}-{shard['name']}"
                os.link(a.shards / shard["name"], Path(tmp) / name)
                repeated.append({**shard, "name": name})
        split.update(shards=repeated, samples=split["samples"] * a.times, bytes=split["bytes"] * a.times)
        split["class_counts"] = [c * a.times for c in split["class_counts"]]
        split.pop("image_sizes", None)
        (Path(tmp) / INDEX_NAME).write_text(json.dumps(doc))
        print(f"tables: {split['samples']:,} samples ({a.times} x {a.shards}), each run a fresh process")
        print("| round | targets | samples (len, first, last) | every sample walked | held (tracemalloc) "
              "| RSS added | shards opened |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in range(a.rounds):
            runs = []
            for mode in ("time", "count"):  # timed in one process; memory and shards opened in another
                cmd = [sys.executable, "-c", _TABLES, tmp, mode]
                done = subprocess.run(cmd, check=True, capture_output=True)
                runs.append(json.loads(done.stdout))
            m, c = runs
            print(f"| {r + 1} | {m['targets'] * 1e3:.0f} ms | {m['samples'] * 1e3:.0f} ms | "
                  f"{m['walk'] * 1e3:.0f} ms | {c['held'] / 2**20:.1f} MiB | {m['rss'] / 2**20:.1f} MiB | "
                  f"{c['opened']} |")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["throughput", "reads", "build", "tables", "one"])
    p.add_argument("tree", type=Path, help="the ImageFolder tree")
    p.add_argument("shards", type=Path, help="the same tree packed (imgshards pack TREE SHARDS)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--images", type=int, default=0, help="images a throughput run (default: an epoch)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cold", action="store_true", help="drop the page cache before every run (root)")
    p.add_argument("--fadvise", action="store_true", help="also imgshards with POSIX_FADV_RANDOM")
    p.add_argument("--against", metavar="REF", help="throughput: also imgshards at git ref REF, alternated")
    p.add_argument(
        "--packed-against",
        type=Path,
        help="throughput: REF's copy of SHARDS, the same shards under an index REF reads (a release "
        "before index format 2: hard links to the shards and the index its `imgshards index` wrote)",
    )
    p.add_argument("--times", type=int, default=10, help="tables: the split listed this many times")
    p.add_argument("--side", default="imgshards", help=argparse.SUPPRESS)  # one: the side to run
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    {"throughput": throughput, "reads": reads, "build": build, "tables": tables, "one": one}[a.what](a)


if __name__ == "__main__":
    main()
