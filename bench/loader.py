#!/usr/bin/env python3
"""Loader throughput: imgshards vs the usual ways to feed ImageNet-like JPEGs to PyTorch (issue 3).

Run by hand (not in CI), on an ImageFolder tree from shared/tools/make_imagefolder.py:

    python ../shared/tools/make_imagefolder.py --out /tmp/inet10k --classes 100 --per-class 100
    python bench/loader.py --tree /tmp/inet10k --packed /tmp/inet10k-packed

The tree is packed first if ``--packed`` has no index. For each preset (``train``, ``resnet``) it
measures, with ``--workers`` DataLoader workers and batches of ``--batch-size``:

- imgshards: ``ShardDataset`` + ``make_loader`` (uint8 batches made in the workers);
- (a) ``ImageFolder`` + ``DataLoader`` with torchvision's reference transforms on PIL images,
  ``ToTensor`` and ``Normalize`` (float batches, collated in the workers);
- (b) plain webdataset over the same shards: ``decode("pil")``, the same transforms, ``batched``
  in the workers, ``DataLoader(batch_size=None)``;
- (c) the CPU limit as the issue defines it: one process decoding and augmenting the same images
  from memory in a loop (imgshards' decode and preset, one thread), times the worker count;
- (c2) the same loop run by ``--workers`` processes at once, which is what that many workers can
  get from a machine other jobs also use;
- (d) with ``--decode-on cuda`` (or ``cpu``): ``ShardDataset(decode_on=...)``, the workers only
  read and batch raw bytes, the training process decodes (nvjpeg) and augments; its batches end
  as normalized floats on the device (imgshards' as uint8 in shared memory: ``to_device`` on a GPU
  costs little). Timing ends with a CUDA synchronize, so queued GPU work is counted.

With ``--against REF`` (a git ref, e.g. ``e8eb196``, the last release) it instead puts REF in a
temporary folder (``git archive`` of REF, imported through ``PYTHONPATH`` by this interpreter, so
both versions run on the same torch), then alternates, round
by round: this checkout's loader, REF's loader, each in a fresh process on the same shards, and the
``limit`` row (one process decoding and augmenting the same images from memory with this checkout's
decode and preset, times the worker count). It prints the median of each and two ratios:
imgshards / REF and imgshards / limit, per preset (``train``, ``resnet``, ``eval``)::

    python bench/loader.py --tree /tmp/inet10k --packed /tmp/inet10k-packed --against e8eb196

Each figure is images/s from the first batch on (worker start-up excluded). The pipelines run in
turn, ``--rounds`` times over, ``--images`` images each time, and each keeps its best round: on a
shared machine a burst of load from elsewhere then spoils one round of each, not one pipeline.
``CPU ms/img`` is the CPU time of all the pipeline's processes (main, workers; start-up included)
per image: it moves much less with the load than images/s does. ``--against`` also prints the CPU
time per image over the timed batches only (``/proc`` of the live processes, Linux): no start-up,
and time a shared host takes the CPUs away is not in it, though its cache contention still is.
The files are read once before timing, so every pipeline reads from the page cache.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import random
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import NamedTuple

import torch
import torchvision.transforms as T
import torchvision.transforms.v2 as v2
import webdataset as wds
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from webdataset.tariterators import group_by_keys, tar_file_expander

from imgshards.converter import PackConfig, pack, read_manifest
from imgshards.loader import IMAGENET_MEAN, IMAGENET_STD, ShardDataset, make_loader, preset
from imgshards.loader import decode_image as decode  # public in both layouts: `--one` runs under REF

TARGETS = {"a": 1.9, "b": 2.2, "c": 0.85}
AGAINST_TARGETS = {"ref": 1.0, "limit": 0.95}  # imgshards / REF, imgshards / limit (issue 22)
REPO = Path(__file__).resolve().parents[1]
LABELS = {
    "imgshards": "imgshards ShardDataset + make_loader",
    "a": "(a) ImageFolder + DataLoader, PIL transforms",
    "b": "(b) webdataset decode('pil') + batched",
    "c": "(c) CPU limit: 1 process x {workers}",
    "c2": "(c2) CPU limit: {workers} processes at once",
    "d": "(d) imgshards decode_on={decode_on}, {workers} workers reading",
}


def reference_transform(name: str) -> Callable:
    """torchvision's reference pipeline on PIL images, ending in a normalized float tensor."""
    if name == "eval":
        return T.Compose(
            [T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        )
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


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have exited."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class Measure(NamedTuple):
    """One measurement of a pipeline."""

    rate: float  # images/s from the second batch on
    cpu: float  # CPU ms per image of all its processes over the whole run, start-up included
    window_cpu: float | None  # CPU ms per image of its live processes over the timed batches only
    first_s: float | None = None  # seconds from building the pipeline to its first batch (worker start)


def live_cpu_seconds() -> float | None:
    """CPU time so far of this process and of its live descendants (workers, a forkserver's too).

    Read from ``/proc`` (Linux; None elsewhere). A process that ends while it is read is left out.
    """
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(stat[11]) + int(stat[12])) / tick  # utime, stime
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(child) for child in (task / "children").read_text().split()]
        except FileNotFoundError:
            if pid == os.getpid():
                return None  # no /proc here
        except (OSError, ValueError, IndexError):
            return None
    return total


def _ms_per_image(before: float | None, after: float | None, images: int) -> float | None:
    """CPU ms per image between two :func:`live_cpu_seconds` readings; None if either had no ``/proc``."""
    return None if before is None or after is None else (after - before) / images * 1e3


def timed(make_batches: Callable[[], Iterable], limit: int) -> Measure:
    """Time a pipeline's batches from the second on, until ``limit`` images have come."""
    cpu0, begin = cpu_seconds(), time.perf_counter()
    it = iter(make_batches())
    first = len(next(it)[0])
    first_s = time.perf_counter() - begin
    live0 = live_cpu_seconds()
    start, seen = time.perf_counter(), 0
    for images, _ in it:
        seen += len(images)
        if seen + first >= limit:
            break
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # (d) on a GPU: its last batches are decoded, not only queued
    rate = seen / (time.perf_counter() - start)
    # The workers' prefetched batches in flight at both ends: about as many at the start as at the end.
    window = _ms_per_image(live0, live_cpu_seconds(), seen)
    del it  # stops and joins the workers, so their CPU time is counted
    gc.collect()
    return Measure(rate, (cpu_seconds() - cpu0) / (seen + first) * 1e3, window, first_s)


def run_imgshards(name: str, args: argparse.Namespace) -> Measure:
    def batches() -> Iterable:
        ds = ShardDataset(args.packed, batch_size=args.batch_size, transform=name)
        return make_loader(ds, num_workers=args.workers, persistent_workers=False)

    return timed(batches, args.images)


def run_decode_on(name: str, args: argparse.Namespace) -> Measure:
    def batches() -> Iterable:
        ds = ShardDataset(args.packed, batch_size=args.batch_size, transform=name, decode_on=args.decode_on)
        return make_loader(ds, num_workers=args.workers, persistent_workers=False)

    return timed(batches, args.images)


def run_imagefolder(name: str, args: argparse.Namespace) -> Measure:
    def batches() -> Iterable:
        ds = ImageFolder(str(args.tree), transform=reference_transform(name))
        return DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)

    return timed(batches, args.images)


def local_samples(shards: Iterable[dict]) -> Iterator[dict]:
    """WebDataset samples of local shards, each opened here as a file.

    webdataset is handed open files, never a path string: its own opener runs a name starting with
    ``pipe:`` as a shell command (and expands braces), and a shard name is the dataset's to choose.
    """
    for shard in shards:
        with open(shard["path"], "rb") as stream:
            yield from group_by_keys(tar_file_expander([{"url": shard["path"].name, "stream": stream}]))


def run_webdataset(name: str, args: argparse.Namespace) -> Measure:
    paths = [args.packed / s.name for s in read_manifest(args.packed).split("train").shards]

    def batches() -> Iterable:
        # What wds.WebDataset(urls, shardshuffle=len(urls)) composes, with the shards opened as files.
        pipeline = wds.DataPipeline(
            lambda: ({"path": path} for path in paths),
            wds.single_node_only,
            wds.split_by_worker,
            wds.shuffle(len(paths)),
            local_samples,
            wds.shuffle(1000),
            wds.decode("pil"),
            wds.to_tuple("jpg", "cls"),
            wds.map_tuple(reference_transform(name), lambda x: x),
            wds.batched(args.batch_size),
        )
        return DataLoader(pipeline, batch_size=None, num_workers=args.workers)

    return timed(batches, args.images)


_IMAGES: list[bytes] = []  # the CPU-limit images, inherited by forked processes


def _decode_augment(job: tuple[str, int, int]) -> float:
    """Decode and augment images ``[lo, hi)`` of ``_IMAGES`` in a loop; return the seconds it took."""
    name, lo, hi = job
    torch.set_num_threads(1)  # as in a DataLoader worker
    transform = preset(name)
    scaled = _scaled(transform)
    start = time.perf_counter()
    for data in _IMAGES[lo:hi]:
        if scaled is None or scaled(data, "jpg") is None:  # a large JPEG decoded at its view's scale
            transform(decode(data, "jpg"))
    return time.perf_counter() - start


def _scaled(transform: Callable) -> Callable | None:
    """This checkout's scaled decode for ``transform``, as the loader's workers use it (issue 33)."""
    # Imported here: `--one` imports this file under REF too, which may not have this module.
    from imgshards.loader.image.scaled import scaled_decoder

    return scaled_decoder(transform)


def run_cpu_limit(name: str, args: argparse.Namespace) -> Measure:
    cpu0 = cpu_seconds()
    threads = torch.get_num_threads()
    try:
        seconds = _decode_augment((name, 0, len(_IMAGES)))
    finally:
        torch.set_num_threads(threads)
    cpu = (cpu_seconds() - cpu0) / len(_IMAGES) * 1e3
    return Measure(len(_IMAGES) / seconds * args.workers, cpu, cpu)  # all of it is the loop


def run_cpu_limit_parallel(name: str, args: argparse.Namespace) -> Measure:
    """(c2): the limit's loop in ``--workers`` processes at once, each handed a batch of images at a time.

    Batch-sized jobs keep every process busy to the end (with half the images each, one process sat
    idle while the other finished). ``window_cpu`` counts the timed jobs only (``/proc``).
    """
    n, w, size = len(_IMAGES), args.workers, args.batch_size
    jobs = [(name, lo, min(lo + size, n)) for lo in range(0, n, size)]
    cpu0 = cpu_seconds()
    with multiprocessing.get_context("fork").Pool(w) as pool:
        pool.map(_decode_augment, [(name, 0, 16)] * w, chunksize=1)  # start-up and first calls, not timed
        live0, start = live_cpu_seconds(), time.perf_counter()
        pool.map(_decode_augment, jobs, chunksize=1)
        wall, window = time.perf_counter() - start, _ms_per_image(live0, live_cpu_seconds(), n)
    return Measure(n / wall, (cpu_seconds() - cpu0) / n * 1e3, window)


def load_images(packed: Path, count: int) -> list[bytes]:
    """``count`` JPEGs drawn uniformly (seed 0) from the whole split (``--cpu-images``).

    Not the first ``count`` of the first shards: a tree's classes differ in their images' sizes, and
    the first shards hold the first classes (in the 10,000-image ``--profile imagenet`` tree the first
    1,000 average 97.4 KB against 99.8 KB for the split, a limit 2% too fast).
    """
    members = []
    for shard in read_manifest(packed).split("train").shards:
        with tarfile.open(packed / shard.name) as tar:
            members += [(shard.name, m.offset_data, m.size) for m in tar if m.name.endswith(".jpg")]
    chosen = sorted(random.Random(0).sample(range(len(members)), min(count, len(members))))
    out = []
    for i in chosen:
        name, offset, size = members[i]
        with open(packed / name, "rb") as f:
            f.seek(offset)
            out.append(f.read(size))
    return out


def window_images(packed: Path, args: argparse.Namespace) -> list[bytes]:
    """The JPEGs of the batches :func:`timed` counts for imgshards, in the order they come: the limit's.

    Epoch 0 of ``ShardDataset(packed, batch_size=...)`` with ``--workers`` workers: each worker's
    samples in its pass's order (the dataset's own plan and order, read, never decoded), cut into
    its batches, taken in turn from worker 0, 1, ... as the DataLoader hands them over, from the
    second batch until ``--images`` are in. The ratio then compares the same work: a random draw of
    the split holds other images (on the 10,000-image tree, 1% fewer bytes than epoch 0's window,
    which comes from a few shards, so a few classes).
    """
    # Imported here: `--one` runs this file under REF's imgshards too, which may not have them.
    from imgshards.loader.epoch.position import PassPosition
    from imgshards.loader.pipeline.passes import plan, raw_samples

    ds = ShardDataset(packed, batch_size=args.batch_size)

    def batches(worker: int) -> Iterator[list[bytes]]:
        at = PassPosition(0, (), 0, worker, args.workers)
        samples = raw_samples(ds.spec, ds.part, at, ds.progress.counters(worker))
        for size in plan(ds.spec, ds.part, at).sizes:
            yield [bytes(s[s.ext]) for s in islice(samples, size)]

    streams = [batches(w) for w in range(args.workers)]
    first = len(next(streams[0]))
    out: list[bytes] = []
    for k in range(1, args.images + 1):  # batch k, from worker k % workers
        out += next(streams[k % args.workers], [])
        if len(out) + first >= args.images:
            break
    return out


def warm_cache(*roots: Path) -> None:
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                with open(path, "rb") as f:
                    while f.read(1 << 22):
                        pass


def install_ref(ref: str, where: Path, repo: Path = REPO) -> Path:
    """Put git ref ``ref`` of this repository under ``where``; return a python that imports it.

    The ``git archive`` of REF, its three folders linked under ``site/imgshards`` (the layout its
    wheel installs, a namespace package), and a launcher running this interpreter with
    ``PYTHONPATH`` set to that folder alone: both loaders run on the same torch and libraries, only
    imgshards differs. (A venv made from a venv's python sees the base interpreter's packages, not
    the venv's, and a ``pip install`` there needs the build tools of that base.)
    """
    src, site = where / "src", where / "site" / "imgshards"
    src.mkdir(parents=True)
    site.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    for package in ("converter", "loader", "cli"):
        (site / package).symlink_to(src / package)
    python = where / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site.parent} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def run_in(python: str | Path, name: str, args: argparse.Namespace, packed: Path | None = None) -> Measure:
    """Time the imgshards loader that ``python`` imports, in a fresh process (``--one``), on ``packed``."""
    cmd = [str(python), str(Path(__file__).resolve()), "--one", name, "--tree", str(args.tree)]
    cmd += ["--packed", str(packed or args.packed), "--workers", str(args.workers)]
    cmd += ["--batch-size", str(args.batch_size), "--images", str(args.images)]
    # Out of the repo: a checkout on sys.path would shadow the installed version under test.
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tempfile.gettempdir()).stdout
    return Measure(*json.loads(out.strip().splitlines()[-1]))


def against(args: argparse.Namespace) -> None:
    """Alternate this checkout's loader, REF's and the limit on the same shards; print medians and ratios."""
    split = read_manifest(args.packed).split("train")
    with tempfile.TemporaryDirectory(prefix="imgshards-against-") as tmp:
        print(f"putting {args.against} in a temporary folder ...", file=sys.stderr)
        ref_python = install_ref(args.against, Path(tmp), args.repo)
        contenders: dict[str, Callable[[str], Measure]] = {
            "imgshards": lambda name: run_in(sys.executable, name, args),
            "ref": lambda name: run_in(ref_python, name, args, args.packed_against),
            "limit": lambda name: run_cpu_limit(name, args),
        }
        rates: dict[str, dict[str, list[float]]] = {}
        cpus: dict[str, dict[str, list[float]]] = {}
        windows: dict[str, dict[str, list[float]]] = {}
        firsts: dict[str, dict[str, list[float]]] = {}
        for r in range(args.rounds):
            for name in args.presets:
                for key, run in contenders.items():
                    rate, cpu, window, first_s = run(name)
                    if first_s is not None:
                        firsts.setdefault(name, {}).setdefault(key, []).append(first_s)
                    rates.setdefault(name, {}).setdefault(key, []).append(rate)
                    cpus.setdefault(name, {}).setdefault(key, []).append(cpu)
                    if window is not None:
                        windows.setdefault(name, {}).setdefault(key, []).append(window)
                    print(f"  {name} round {r}: {key} {rate:.0f}/s, {cpu:.2f} CPU ms/img", file=sys.stderr)
    print(
        f"{split.samples} images in {len(split.shards)} shards, {args.workers} workers, batch "
        f"{args.batch_size}, {os.cpu_count()} CPUs, torch {torch.__version__}; median of {args.rounds} "
        f"alternated rounds of {args.images} images ({args.limit_images} for the limit); "
        f"load average {os.getloadavg()[0]:.1f} at the end"
    )
    print()
    print(
        f"| preset | imgshards (this checkout) | imgshards at {args.against} | limit (1 process x "
        f"{args.workers}) | this / {args.against} | this / limit |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, by in rates.items():
        ours, ref, limit = (statistics.median(by[k]) for k in ("imgshards", "ref", "limit"))
        verdict = {True: "met", False: "MISSED"}
        vs_ref = f"{ours / ref:.3f} ({verdict[ours / ref >= AGAINST_TARGETS['ref']]})"
        vs_limit = f"{ours / limit:.3f} ({verdict[ours / limit >= AGAINST_TARGETS['limit']]})"
        print(f"| {name} | {ours:.0f} | {ref:.0f} | {limit:.0f} | {vs_ref} | {vs_limit} |")
    print()
    print()
    # CPU time per image (all the loader's processes, start-up included) moves much less with the
    # machine's load than images/s does: on a shared machine it is the steadier of the two ratios.
    _cpu_table("CPU ms/img", cpus, args.against)
    if windows and all(len(by) == 3 for by in windows.values()):
        # The same over the timed batches only, from /proc: no start-up, and a host's load that
        # takes the CPUs away (a VM's steal) is not counted.
        _cpu_table("CPU ms/img over the timed batches", windows, args.against)
    # Time to the first batch: the workers' start (fork or otherwise), their first shard, first batch.
    print(f"| preset | first batch (s): this | at {args.against} | {args.against} / this |")
    print("|---|---:|---:|---:|")
    for name, by in firsts.items():
        ours, theirs = (statistics.median(by[k]) for k in ("imgshards", "ref"))
        print(f"| {name} | {ours:.3f} | {theirs:.3f} | {theirs / ours:.3f} |")
    print()
    print(
        "rounds (images/s): "
        + json.dumps({n: {k: [round(x) for x in v] for k, v in by.items()} for n, by in rates.items()})
    )


def _cpu_table(what: str, by_preset: dict[str, dict[str, list[float]]], ref: str) -> None:
    """Print a CPU figure per image (medians: this checkout's, REF's, the limit's) and its ratios."""
    print(f"| preset | {what}: this | at {ref} | limit | {ref} / this | limit / this |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, by in by_preset.items():
        ours, theirs, limit = (statistics.median(by[k]) for k in ("imgshards", "ref", "limit"))
        ratios = f"{theirs / ours:.3f} | {limit / ours:.3f}"
        print(f"| {name} | {ours:.2f} | {theirs:.2f} | {limit:.2f} | {ratios} |")
    print()


RUNS = {
    "imgshards": run_imgshards,
    "a": run_imagefolder,
    "b": run_webdataset,
    "c": run_cpu_limit,
    "c2": run_cpu_limit_parallel,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, required=True, help="ImageFolder tree (make_imagefolder.py)")
    p.add_argument("--packed", type=Path, required=True, help="packed copy of the tree (made if absent)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--images", type=int, default=3200, help="images per measurement of a loader")
    p.add_argument(
        "--cpu-images",
        type=int,
        default=None,
        help="images of (c), (c2), the limit, drawn at random (default: those of imgshards' timed batches)",
    )
    p.add_argument("--rounds", type=int, default=3, help="measurements of each pipeline; the best counts")
    p.add_argument("--shard-size", type=int, default=64 * 10**6, help="bytes per shard when packing")
    p.add_argument("--presets", nargs="+", default=None, choices=["train", "resnet", "eval"])
    p.add_argument("--decode-on", choices=["cpu", "cuda"], default=None, help="also run (d) decode_on=...")
    p.add_argument("--against", metavar="REF", help="alternate with the loader at git ref REF (medians)")
    p.add_argument("--repo", type=Path, default=REPO, help="git repository holding REF (default: this one)")
    p.add_argument(
        "--packed-against",
        type=Path,
        help="REF's copy of --packed: the same shards under an index REF reads (a release before index "
        "format 2: hard links to the shards and the index REF wrote, e.g. by its `imgshards index`)",
    )
    p.add_argument("--one", metavar="PRESET", help=argparse.SUPPRESS)  # one imgshards run, as JSON
    args = p.parse_args()
    if args.one is not None:
        print(json.dumps(run_imgshards(args.one, args)))
        return
    if args.presets is None:
        args.presets = ["train", "resnet", "eval"] if args.against else ["train", "resnet"]
    if args.decode_on is not None:
        RUNS["d"] = run_decode_on

    if not (args.packed / "index.json").exists():
        print(f"packing {args.tree} -> {args.packed} ...", file=sys.stderr)
        config = PackConfig(split="train", shard_size=args.shard_size, workers=args.workers)
        pack(args.tree, args.packed, config)
    split = read_manifest(args.packed).split("train")
    warm_cache(args.tree, args.packed)
    if args.cpu_images is None:  # the images imgshards' timed batches hold
        _IMAGES.extend(window_images(args.packed, args))
        args.limit_images = f"the {len(_IMAGES)} images of imgshards' timed batches"
    else:  # 1,000 images drawn at random average +-6% off the split's pixels
        _IMAGES.extend(load_images(args.packed, args.cpu_images))
        args.limit_images = f"{len(_IMAGES)} images drawn at random"

    if args.against is not None:
        against(args)
        return

    header = (
        f"{split.samples} images in {len(split.shards)} shards, {args.workers} workers, "
        f"batch {args.batch_size}, {os.cpu_count()} CPUs, torch {torch.__version__}; "
        f"best of {args.rounds} rounds of {args.images} images ({args.limit_images} for c, c2); "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )
    results: dict[str, dict[str, tuple[float, float]]] = {}
    for name in args.presets:
        best: dict[str, tuple[float, float]] = {}
        for r in range(args.rounds):
            for key, run in RUNS.items():
                rate, cpu, _ = run(name, args)
                print(f"  {name} round {r}: {key} {rate:.0f}/s, {cpu:.2f} CPU ms/img", file=sys.stderr)
                if rate > best.get(key, (0.0, 0.0))[0]:
                    best[key] = (rate, cpu)
        results[name] = best

    print(header + f", {os.getloadavg()[0]:.1f} at the end")
    print()
    # Two ratios: of images/s (what the targets are stated in), and of CPU time per image
    # (this pipeline's over imgshards'), which a shared machine's load moves much less.
    print("| preset | pipeline | images/s | imgshards / this | CPU ms/img | CPU: this / imgshards | target |")
    print("|---|---|---:|---:|---:|---:|---|")
    for name, best in results.items():
        ours, our_cpu = best["imgshards"]
        for key, (rate, cpu) in best.items():
            target = ""
            if key in TARGETS and name == "train":
                verdict = {True: "met", False: "MISSED"}
                target = (
                    f">= {TARGETS[key]:.2f}: images/s {verdict[ours / rate >= TARGETS[key]]}, "
                    f"CPU {verdict[cpu / our_cpu >= TARGETS[key]]}"
                )
            label = LABELS[key].format(workers=args.workers, decode_on=args.decode_on)
            ratios = f"{ours / rate:.2f}", f"{cpu:.2f}", f"{cpu / our_cpu:.2f}"
            cells = [name, label, f"{rate:.0f}", *ratios, target]
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
