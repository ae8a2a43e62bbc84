"""Packing at scale: `imgshards pack` against `tar cf`, a single-process webdataset ShardWriter, and
`ImageFolder(SRC)` construction, in one run, on the same tree. Run by hand, not in CI.

    python ../shared/tools/make_imagefolder.py --out /tmp/big --profile tiny --classes 1000 --per-class 1200
    python bench/pack_scale.py /tmp/big --work /tmp/pack-bench

Each command runs in its own process tree with the page cache dropped first (`echo 3 >
/proc/sys/vm/drop_caches` when allowed; otherwise every file of the tree is evicted with
posix_fadvise(DONTNEED), which leaves the dentry and inode caches warm: the table says which).
Python and its libraries are loaded once after the drop, so only the data is read cold.
Peak RSS is sampled from /proc for every process of the tree (VmHWM), so a pool's workers are
measured one by one, not summed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

SHARDWRITER_BASELINE = r"""
import random, sys, webdataset as wds
from torchvision.datasets import ImageFolder
src, out = sys.argv[1], sys.argv[2]
samples = ImageFolder(src, loader=lambda p: p).samples
random.Random(0).shuffle(samples)
with wds.ShardWriter(out + "/train-%06d.tar", maxsize=256e6, verbose=0) as sink:
    for i, (path, label) in enumerate(samples):
        with open(path, "rb") as f:
            sink.write({"__key__": f"{i:09d}", "jpg": f.read(), "cls": label})
"""

IMAGEFOLDER = r"""
import sys
from torchvision.datasets import ImageFolder
print(len(ImageFolder(sys.argv[1], loader=lambda p: p).samples))
"""


WARM_CODE = [sys.executable, "-c", "import torch, torchvision, webdataset, imgshards.cli.main"]


def drop_caches(tree: Path) -> str:
    """Empty the page cache of the tree (data cold), then load the code again (code warm); say how."""
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        subprocess.run(WARM_CODE, check=True)
        return "drop_caches"
    except OSError:
        for dirpath, _, files in os.walk(tree):
            for name in files:
                try:
                    fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                except OSError:
                    continue
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
        return "fadvise (inodes warm)"


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def _hwm_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def measure(cmd: list[str]) -> tuple[float, int, int, int]:
    """Run ``cmd``; return wall seconds, peak RSS (MB) of its first process and of any other, and
    how many processes were seen."""
    peaks: dict[int, int] = {}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            kids = _children()
            todo, seen = [proc.pid], []
            while todo:
                pid = todo.pop()
                seen.append(pid)
                todo.extend(kids.get(pid, []))
            for pid in seen:
                peaks[pid] = max(peaks.get(pid, 0), _hwm_kb(pid))
            stop.wait(0.05)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    code = proc.wait()
    wall = time.perf_counter() - start
    stop.set()
    thread.join()
    if code:
        raise SystemExit(f"{cmd[:3]}... failed with exit code {code}")
    main = peaks.pop(proc.pid, 0)
    return wall, main // 1024, max(peaks.values(), default=0) // 1024, 1 + len(peaks)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", type=Path, help="ImageFolder tree to pack")
    p.add_argument("--work", type=Path, default=Path("/tmp/pack-bench"), help="scratch directory for outputs")
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--repeat", type=int, default=1, help="run pack and tar this many times, interleaved")
    p.add_argument("--skip", nargs="*", default=[], choices=["tar", "shardwriter", "imagefolder"])
    a = p.parse_args()
    files = sum(len(f) for _, _, f in os.walk(a.src))
    runs = {
        "imgshards pack --check header": [
            sys.executable,
            "-m",
            "imgshards.cli",
            "pack",
            str(a.src),
            str(a.work / "imgshards"),
            "--no-progress",
            "--workers",
            str(a.workers),
            "--overwrite",
        ],
        "tar cf": ["tar", "cf", str(a.work / "all.tar"), "-C", str(a.src), "."],
        "webdataset.ShardWriter (1 process)": [
            sys.executable,
            "-c",
            SHARDWRITER_BASELINE,
            str(a.src),
            str(a.work / "shardwriter"),
        ],
        "ImageFolder(SRC) construction": [sys.executable, "-c", IMAGEFOLDER, str(a.src)],
    }
    skip = {
        "tar": "tar cf",
        "shardwriter": "webdataset.ShardWriter (1 process)",
        "imagefolder": "ImageFolder(SRC) construction",
    }
    print(
        f"tree: {a.src}, {files:,} files; {os.cpu_count()} cores; workers {a.workers}; "
        f"each command {a.repeat}x, interleaved, median shown"
    )
    chosen = {name: cmd for name, cmd in runs.items() if name not in {skip[s] for s in a.skip}}
    walls: dict[str, list[float]] = {name: [] for name in chosen}
    for round_ in range(a.repeat):
        for name, cmd in chosen.items():
            if name == "webdataset.ShardWriter (1 process)" and round_:
                continue  # minutes long and far off; once is enough
            shutil.rmtree(a.work, ignore_errors=True)
            for sub in ("imgshards", "shardwriter"):
                (a.work / sub).mkdir(parents=True)
            how = drop_caches(a.src)
            wall, main_mb, other_mb, procs = measure(cmd)
            walls[name].append(wall)
            print(
                f"  {name:<36} {wall:8.1f} s   {files / wall:>9,.0f} files/s  peak RSS main {main_mb:>5} MB, "
                f"other {other_mb:>5} MB ({procs} processes)   cache: {how}",
                flush=True,
            )
    results = {name: statistics.median(w) for name, w in walls.items()}
    pack = results.get("imgshards pack --check header")
    if pack:
        print("ratios (wall time):")
        if "tar cf" in results:
            print(f"  pack / tar cf                      {pack / results['tar cf']:.2f}x  (target <= 1.5x)")
        if "webdataset.ShardWriter (1 process)" in results:
            speedup = results["webdataset.ShardWriter (1 process)"] / pack
            print(f"  ShardWriter / pack                 {speedup:.2f}x  (target >= 4x)")
        if "ImageFolder(SRC) construction" in results:
            print(
                f"  pack / ImageFolder(SRC)            {pack / results['ImageFolder(SRC) construction']:.2f}x"
            )
    shutil.rmtree(a.work, ignore_errors=True)


if __name__ == "__main__":
    main()
