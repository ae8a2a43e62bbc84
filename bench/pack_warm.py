"""Packing a warm tree: `imgshards pack` (auto read order, and forced disk order) against a
single-process webdataset ShardWriter loop, on a tree already in the page cache. Run by hand.

    python ../shared/tools/make_imagefolder.py --out /tmp/warm10k --profile imagenet \
        --classes 100 --per-class 100
    python bench/pack_warm.py /tmp/warm10k --work /tmp/pack-warm

Before each command every file of the tree is read once, so it is in the page cache; the commands
run interleaved, `--repeat` times, and the median wall time is compared. `auto` should probe the
cache, find the tree warm and read in plan order (no gather); `disk` forces the gather.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pack_scale import SHARDWRITER_BASELINE, measure


def warm(tree: Path) -> int:
    total = 0
    for folder, _, files in os.walk(tree):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                total += len(f.read())
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", type=Path)
    p.add_argument("--work", type=Path, default=Path("/tmp/pack-warm"))
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    pack = [
        sys.executable,
        "-m",
        "imgshards.cli",
        "pack",
        str(a.src),
        str(a.work / "imgshards"),
        "--no-progress",
    ]
    pack += ["--workers", str(a.workers), "-q"]
    runs = {
        "imgshards pack --read-order auto": [*pack, "--read-order", "auto"],
        "imgshards pack --read-order disk": [*pack, "--read-order", "disk"],
        "webdataset.ShardWriter (1 process)": [
            sys.executable,
            "-c",
            SHARDWRITER_BASELINE,
            str(a.src),
            str(a.work / "shardwriter"),
        ],
    }
    size = warm(a.src)
    files = sum(len(f) for _, _, f in os.walk(a.src))
    print(
        f"tree: {a.src}, {files:,} files, {size / 1e6:,.0f} MB (mean {size / files / 1e3:.0f} kB); "
        f"{os.cpu_count()} cores; workers {a.workers}; warm; {a.repeat}x interleaved, median shown"
    )
    walls: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(a.repeat):
        for name, cmd in runs.items():
            shutil.rmtree(a.work, ignore_errors=True)
            for sub in ("imgshards", "shardwriter"):
                (a.work / sub).mkdir(parents=True)
            warm(a.src)
            wall, main_mb, other_mb, procs = measure(cmd)
            walls[name].append(wall)
            print(
                f"  {name:<36} {wall:6.2f} s  {files / wall:>8,.0f} files/s  peak RSS main {main_mb:>4} MB, "
                f"other {other_mb:>4} MB ({procs} processes)",
                flush=True,
            )
    med = {name: statistics.median(w) for name, w in walls.items()}
    writer = med["webdataset.ShardWriter (1 process)"]
    print("medians and ratios (wall time):")
    for name in runs:
        print(f"  {name:<36} {med[name]:6.2f} s")
    auto = med["imgshards pack --read-order auto"] / writer
    print(f"  pack auto / ShardWriter            {auto:.2f}x  (target <= 1x)")
    print(f"  pack disk / ShardWriter            {med['imgshards pack --read-order disk'] / writer:.2f}x")
    shutil.rmtree(a.work, ignore_errors=True)


if __name__ == "__main__":
    main()
