"""Issue 49's scale benchmark: one real shard hard-linked into splits of up to 100 M samples. Run by hand.

    python bench/scale.py --work /tmp/scale --sizes 1000000 10000000 100000000
    python bench/scale.py --work /tmp/scale --sizes 1000000 10000000 100000000 --against 39ce913
    python bench/scale.py --work /tmp/scale --sizes 1000000 10000000 --against 39ce913 --only-against

Builds once, kept in ``--work``: one shard of 10,000 tiny JPEGs (``key.jpg`` + ``key.cls``, 100
classes, written with bench/resume_scale.py's helpers) and, for each version and size, a directory
of hard links to it, ``train-000000.tar``... (each a regular file; ext4 allows 65,000 links to one
file: two versions at 1 M + 10 M + 100 M take 22,200). Then, for each size and version, each step
in a fresh process of the python under test (this checkout's ``sys.executable``, or a launcher of
``--against REF`` made by bench/loader.py's ``install_ref``), so both are measured the same way:

- ``imgshards index DIR --classes FILE`` (wall time, whole process); ``index.json`` bytes; table
  bytes (the per-sample tables: the index's shard fields, plus any file beside it but the shards);
- ``imgshards info DIR`` (wall time, whole process);
- ``ShardDataset`` construction; its state as a 2-worker loader on 1 rank saves it ``LEFT`` batches
  before the end of the epoch (built as bench/resume_scale.py builds it, no pass run); the first
  batch with 2 workers; the main process's USS added by the construction, each worker's USS;
- that state resumed by a new loader (after its construction: ``load_state_dict`` to the first
  batch), with 2 workers (same topology) and with 3 (elastic), each worker's USS;
- ``ImageFolder``: construction, ``np.asarray(ds.targets)``, 1,000 random ``ds[i]`` (each label
  checked: sample i is of class i % 100), the USS they added.

A step that fails prints "refused [n]" in its cell, footnote n being its one-line error (the last
release cannot index or read beyond about 12 M samples); the steps that need its output are skipped.
``--out FILE`` also writes every figure as JSON. The script itself imports bench/resume_scale.py and
bench/loader.py, so the python running it must import imgshards (``pip install -e .``); the steps
import only the version under test. On a shared machine, compare the load averages printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

BENCH = Path(__file__).resolve().parent
SHARD_SAMPLES, CLASSES = 10_000, 100
BATCH, IMAGE_SIZE, LEFT, READS = 256, 16, 10, 1_000
TABLE_FIELDS = ("offsets", "labels", "keys", "sources")  # the release's per-sample tables in index.json
NOT_TABLES = ("index.json", "_info.json")


# ---- what is measured -----------------------------------------------------------------------------
# Rows of the table: (step, key of its result, what it is, the goal at 100 M samples on 2 cores, format).
ROWS: list[tuple[str, str, str, str, Callable[[Any], str]]] = []


def _seconds(x: float) -> str:
    return f"{x:.2f} s" if x < 100 else f"{x:,.0f} s"


def _mb(x: float) -> str:
    return f"{x / 1e6:,.1f} MB" if x >= 1e5 else f"{x / 1e3:,.1f} KB"


def _each_mb(xs: list[float]) -> str:
    return " / ".join(f"{x / 1e6:,.0f}" for x in xs) + " MB"


ROWS += [
    ("index", "wall", "`imgshards index`, whole process", "", _seconds),
    ("index", "index_bytes", "index.json bytes", "<= 1 KB a shard", _mb),
    ("index", "per_shard", "index.json bytes a shard", "<= 1 KB", lambda x: f"{x / 1e3:,.1f} KB"),
    ("index", "table_bytes", "table bytes", "", _mb),
    ("info", "wall", "`imgshards info`, whole process", "<= 1 s", _seconds),
    ("stream", "construct", "ShardDataset construction", "<= 1 s", _seconds),
    ("stream", "first_batch", "first batch, 2 workers", "<= 3 s", _seconds),
    ("stream", "uss_main", "USS added by the construction", "<= 50 MB", _mb),
    ("stream", "uss_workers", "USS of each worker", "<= 50 MB added", _each_mb),
    ("resume2", "construct", "resume (state of 2 workers, 1 rank): construction", "<= 1 s", _seconds),
    ("resume2", "first_batch", f"same topology: state loaded to 1st batch ({LEFT} left)", "<= 5 s", _seconds),
    ("resume2", "uss_workers", "USS of each worker", "<= 50 MB added", _each_mb),
    ("resume3", "first_batch", "elastic, 3 workers: state loaded to 1st batch", "<= 10 s", _seconds),
    ("resume3", "uss_workers", "USS of each worker", "<= 50 MB added", _each_mb),
    ("imagefolder", "construct", "ImageFolder construction", "<= 1 s", _seconds),
    ("imagefolder", "targets", "np.asarray(ds.targets)", "", _seconds),
    ("imagefolder", "reads", f"{READS:,} random ds[i], labels checked", "", _seconds),
    ("imagefolder", "uss", "USS added (construction, targets, reads)", "<= 50 MB", _mb),
]


# ---- the steps, each in a fresh process of the python under test (`--step`) ----------------------


def _uss(p: psutil.Process) -> int:
    return p.memory_full_info().uss


def _workers_uss(me: psutil.Process) -> list[int]:
    """USS of each DataLoader worker: the children forked from this process (same command line)."""
    return [_uss(c) for c in me.children() if c.cmdline() == me.cmdline()]


def _dataset(root: str) -> Any:
    from imgshards.loader import ShardDataset

    return ShardDataset(root, batch_size=BATCH, image_size=IMAGE_SIZE, transform="eval")


def step_stream(root: str, state_file: str) -> dict[str, Any]:
    """Construction, the state saved ``LEFT`` batches before the end, first batch with 2 workers."""
    from imgshards.loader import make_loader

    me = psutil.Process()
    before, start = _uss(me), time.perf_counter()
    ds = _dataset(root)
    construct, uss_main = time.perf_counter() - start, _uss(me) - before
    start = time.perf_counter()
    loader = make_loader(ds, num_workers=2)
    made = time.perf_counter() - start
    # As resume_scale builds it: what the loader saves after len - LEFT batches delivered (not timed).
    state = loader.state_dict()
    state["batches"] = len(loader) - LEFT
    Path(state_file).write_text(json.dumps(state))
    start = time.perf_counter()
    batches = iter(loader)
    next(batches)
    first = made + time.perf_counter() - start
    return {"construct": construct, "first_batch": first, "uss_main": uss_main,
            "uss_workers": _workers_uss(me), "batches": len(loader)}  # fmt: skip


def step_resume(root: str, state_file: str, workers: int) -> dict[str, Any]:
    """The saved state loaded by a new loader of ``workers`` workers: ``load_state_dict`` to first batch."""
    from imgshards.loader import make_loader

    state = json.loads(Path(state_file).read_text())
    me, start = psutil.Process(), time.perf_counter()
    loader = make_loader(_dataset(root), num_workers=workers)
    construct, start = time.perf_counter() - start, time.perf_counter()
    loader.load_state_dict(state)
    batches = iter(loader)
    next(batches)
    first = time.perf_counter() - start
    return {"construct": construct, "first_batch": first, "uss_workers": _workers_uss(me)}


def step_imagefolder(root: str) -> dict[str, Any]:
    """Construction, ``np.asarray(ds.targets)`` (all checked), ``READS`` random ``ds[i]`` (each checked)."""
    from imgshards.loader import ImageFolder

    me = psutil.Process()
    before, start = _uss(me), time.perf_counter()
    ds = ImageFolder(root)
    construct, start = time.perf_counter() - start, time.perf_counter()
    targets = np.asarray(ds.targets)
    took = time.perf_counter() - start
    expected = np.arange(len(ds)) % CLASSES  # sample i is the shard's sample i % 10,000: class i % 100
    if not np.array_equal(targets, expected):
        raise AssertionError(f"targets: {np.flatnonzero(targets != expected).size:,} wrong labels")
    start = time.perf_counter()
    for i in random.Random(0).sample(range(len(ds)), READS):
        image, label = ds[i]
        if label != i % CLASSES or image.size != (IMAGE_SIZE, IMAGE_SIZE):
            raise AssertionError(f"ds[{i}]: label {label} (expected {i % CLASSES}), size {image.size}")
    reads = time.perf_counter() - start
    return {"construct": construct, "targets": took, "reads": reads, "uss": _uss(me) - before}


# ---- running a version's steps ------------------------------------------------------------------


def run_step(python: str, args: list[str], timeout: float) -> dict[str, Any]:
    """A step (or an ``imgshards`` command) in a fresh process: its figures, or why it failed."""
    start = time.perf_counter()
    try:
        # Out of the repo: a checkout on sys.path would shadow the version under test.
        done = subprocess.run([python, *args], capture_output=True, text=True, timeout=timeout,
                              cwd=tempfile.gettempdir())  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"refused": f"timed out after {timeout:,.0f} s"}
    wall = time.perf_counter() - start
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        return {"refused": (lines or [f"exit status {done.returncode}"])[-1][:300]}
    if args[0] == "-m":  # an imgshards command: its wall time
        return {"wall": wall}
    return json.loads(done.stdout.strip().splitlines()[-1])


def table_bytes(root: Path) -> int:
    """Bytes of the per-sample tables: the shard entries' table fields, and files beside the index."""
    beside = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()
                 and p.suffix != ".tar" and p.name not in NOT_TABLES)  # fmt: skip
    doc = json.loads((root / "index.json").read_text())
    fields = sum(len(v) for split in doc.get("splits", {}).values() for shard in split.get("shards", [])
                 for v in (shard.get(k) for k in TABLE_FIELDS) if isinstance(v, str))  # fmt: skip
    return beside + fields


def measure(python: str, root: Path, classes: Path, timeout: float) -> dict[str, dict[str, Any]]:
    """Every step of one version on one split; a step whose input is missing is skipped."""
    for path in root.iterdir():  # an index (and its tables) of an earlier run: only the shards stay
        if path.is_dir():
            shutil.rmtree(path)
        elif path.suffix != ".tar":
            path.unlink()
    cli, me = ["-m", "imgshards.cli"], [str(Path(__file__).resolve()), "--step"]
    state = root.with_name(f"{root.name}-state.json")  # beside the split: no file in it but its own
    state.unlink(missing_ok=True)
    got: dict[str, dict[str, Any]] = {}
    got["index"] = run_step(python, [*cli, "index", str(root), "--classes", str(classes), "-q"], timeout)
    if "refused" not in got["index"]:
        size = (root / "index.json").stat().st_size
        shards = sum(1 for _ in root.glob("*.tar"))
        got["index"].update(index_bytes=size, per_shard=size / shards, table_bytes=table_bytes(root))
    print(f"  index: {json.dumps(got['index'])[:200]}", file=sys.stderr, flush=True)
    steps = {
        "info": [*cli, "info", str(root)],
        "stream": [*me, "stream", str(root), str(state)],
        "resume2": [*me, "resume", str(root), str(state), "2"],
        "resume3": [*me, "resume", str(root), str(state), "3"],
        "imagefolder": [*me, "imagefolder", str(root)],
    }
    for step, args in steps.items():
        if not (root / "index.json").exists():
            got[step] = {"skipped": "no index.json"}
        elif step.startswith("resume") and not state.exists():
            got[step] = {"skipped": "no saved state"}
        else:
            got[step] = run_step(python, args, timeout)
        print(f"  {step}: {json.dumps(got[step])[:200]}", file=sys.stderr, flush=True)
    return got


# ---- the data -----------------------------------------------------------------------------------


def build_shard(work: Path) -> Path:
    """The one real shard (10,000 tiny JPEGs and their class ids) and the class names file; reused."""
    from resume_scale import member, tiny_jpegs  # bench/resume_scale.py's: the same tiny JPEGs, tar members

    shard = work / "shard" / "train-000000.tar"
    classes = work / "classes.txt"  # zero-padded: ImageFolder's sorted class names keep their ids
    classes.write_text("".join(f"c{c:02d}\n" for c in range(CLASSES)))
    if shard.exists():
        return shard
    shard.parent.mkdir(parents=True, exist_ok=True)
    images = tiny_jpegs(64, IMAGE_SIZE)
    part = shard.with_name(".part")
    with open(part, "wb") as f:
        for i in range(SHARD_SAMPLES):
            f.write(member(f"{i:09d}.jpg", images[i % len(images)]))
            f.write(member(f"{i:09d}.cls", str(i % CLASSES).encode()))
        f.write(b"\0" * 1024)  # the tar's end
    os.replace(part, shard)
    return shard


def link_split(shard: Path, root: Path, samples: int) -> Path:
    """``root``: ``samples`` samples as hard links ``train-000000.tar``... to ``shard`` (kept)."""
    if samples % SHARD_SAMPLES:
        raise SystemExit(f"--sizes: {samples:,} is not a multiple of {SHARD_SAMPLES:,} samples")
    root.mkdir(parents=True, exist_ok=True)
    for k in range(samples // SHARD_SAMPLES):
        path = root / f"train-{k:06d}.tar"
        if not path.exists():
            os.link(shard, path)
    return root


# ---- the report ---------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return {
        "cores": os.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "cpu": model or platform.processor(),
        "python": platform.python_version(),
    }


def size_name(n: int) -> str:
    return f"{n / 1e6:g} M" if n >= 1_000_000 else f"{n:,}"


def report(results: dict[str, dict[int, dict[str, dict[str, Any]]]], about: dict[str, Any]) -> None:
    m = about["machine"]
    print(f"machine: {m['cores']} cores ({m['cpu']}), {m['ram_gib']} GiB RAM, {m['platform']}, "
          f"Python {m['python']}")  # fmt: skip
    print(f"one shard of {SHARD_SAMPLES:,} samples ({about['shard_bytes'] / 1e6:.1f} MB, {CLASSES} classes, "
          f"{IMAGE_SIZE}x{IMAGE_SIZE} JPEGs) hard-linked; batch {BATCH}; load average "
          f"{about['load_start']:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    columns = [(v, s) for v, by in results.items() for s in by]
    print()
    print("| measurement | goal at 100 M | " + " | ".join(f"{v} {size_name(s)}" for v, s in columns) + " |")
    print("|---|---|" + "---:|" * len(columns))
    notes: list[str] = []
    for step, key, what, goal, fmt in ROWS:
        cells = []
        for v, s in columns:
            got = results[v][s][step]
            why = got.get("refused") or got.get("skipped")
            if why is None:
                cells.append(fmt(got[key]) if key in got else "-")
                continue
            if why not in notes:
                notes.append(why)
            kind = "refused" if "refused" in got else "skipped"
            cells.append(f"{kind} [{notes.index(why) + 1}]")
        print(f"| {what} | {goal} | " + " | ".join(cells) + " |")
    if notes:
        print()
    for n, why in enumerate(notes, 1):
        print(f"[{n}] {why}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, help="where the shard and the splits are built (and kept)")
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000, 100_000_000])
    p.add_argument("--against", metavar="REF", help="also measure imgshards at git ref REF (a release)")
    p.add_argument("--only-against", action="store_true", help="measure REF only, not this checkout")
    p.add_argument("--timeout", type=float, default=3600, help="seconds a step may take")
    p.add_argument("--out", type=Path, help="also write the figures here, as JSON")
    p.add_argument("--step", nargs="+", help=argparse.SUPPRESS)  # one step, in this process
    a = p.parse_args()
    if a.step:
        name, *rest = a.step
        step = {"stream": step_stream, "imagefolder": step_imagefolder,
                "resume": lambda root, state, n: step_resume(root, state, int(n))}[name]  # fmt: skip
        print(json.dumps(step(*rest)))
        return
    if a.work is None or (a.only_against and not a.against):
        p.error("--work is required; --only-against needs --against REF")
    a.work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(BENCH))
    shard = build_shard(a.work)
    about = {"machine": machine(), "shard_bytes": shard.stat().st_size, "load_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="imgshards-scale-") as tmp:
        pythons = {} if a.only_against else {"this": sys.executable}
        if a.against:
            from loader import install_ref  # bench/loader.py's: git archive of REF, on PYTHONPATH

            pythons[a.against] = str(install_ref(a.against, Path(tmp)))
        results: dict[str, dict[int, dict[str, dict[str, Any]]]] = {v: {} for v in pythons}
        for size in sorted(a.sizes):
            for version, python in pythons.items():
                print(f"{version}, {size:,} samples:", file=sys.stderr, flush=True)
                root = link_split(shard, a.work / f"split-{version}" / str(size), size)
                results[version][size] = measure(python, root, a.work / "classes.txt", a.timeout)
                if a.out:  # as it goes: a long run leaves what it measured
                    a.out.write_text(json.dumps({**about, "results": results}, indent=1))
    report(results, about)


if __name__ == "__main__":
    main()
