#!/usr/bin/env python3
"""The loader's tar reader against the last release's (issue 22: the read path must not be slower).

Run by hand (not in CI), on shards ``imgshards pack`` wrote:

    python ../shared/tools/make_imagefolder.py --out /tmp/inet --classes 10 --per-class 128
    imgshards pack /tmp/inet /tmp/inet-packed --shard-size 32MB
    python bench/tar_reader.py /tmp/inet-packed [--against e8eb196] [--rounds 9]

``--against REF``'s tar reader (``loader/pipeline/tar.py``;
``loader/pipeline/reader.py`` before issue 39, ``loader/reader.py`` before issue 32)
is taken from git (``git show``) and imported beside this tree's reader, which reads through the
converter's one tar parser (``converter/format/tarstream.py``).
Both read the same shards, the files read once before timing so both read from the page cache,
in alternated rounds; each keeps its best round. Rows:

- ``whole shards``: ``read_run(shard, 0, n)`` over every shard, every sample delivered;
- ``second halves``: ``read_run(shard, n // 2, n)``, stepping over the first half's members;
- ``headers only``: every member's header parsed, all data stepped over (the old reader's
  ``_headers`` against :class:`~imgshards.converter.format.tarstream.TarStream`).

``new/old`` is this tree's time over the old one's: at most 1.00x means at least as fast.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from imgshards.converter import read_manifest
from imgshards.converter.format.tarstream import TarStream
from imgshards.loader.pipeline import tar as new_reader

ROOT = Path(__file__).resolve().parents[1]


def old_reader(ref: str, where: Path) -> ModuleType:
    # Where the tar reader was (since issue 39, before it, before issue 32), named inside the package
    # it was in, so that its relative imports (``from ..errors import``) resolve.
    for at, package in (  # noqa: B007 (the pair found is used after the loop)
        ("loader/pipeline/tar.py", "imgshards.loader.pipeline"),
        ("loader/pipeline/reader.py", "imgshards.loader.pipeline"),
        ("loader/reader.py", "imgshards.loader"),
    ):
        shown = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{ref}:{at}"], capture_output=True, text=True
        )
        if shown.returncode == 0:
            break
    shown.check_returncode()
    path = where / "old_reader.py"
    path.write_text(shown.stdout)
    name = f"{package}._bench_old_reader"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def runs(module: ModuleType, shards: list[tuple[Path, int]], half: bool) -> Callable[[], int]:
    def run() -> int:
        count = 0
        for path, n in shards:
            for _ in module.read_run(path, n // 2 if half else 0, n):
                count += 1
        return count

    return run


def old_headers(module: ModuleType, shards: list[tuple[Path, int]]) -> Callable[[], int]:
    def run() -> int:
        count = 0
        for path, _ in shards:
            with open(path, "rb", buffering=1 << 20) as f:
                takes_end = len(inspect.signature(module._headers).parameters) > 1  # since e8eb196
                headers = module._headers(f, path.stat().st_size) if takes_end else module._headers(f)
                for _, size in headers:
                    module._skip(f, size)
                    count += 1
        return count

    return run


def new_headers(shards: list[tuple[Path, int]]) -> Callable[[], int]:
    def run() -> int:
        count = 0
        for path, _ in shards:
            with open(path, "rb", buffering=1 << 20) as f:
                for _ in TarStream(f, end=path.stat().st_size):
                    count += 1
        return count

    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("packed", type=Path, help="a directory imgshards pack wrote")
    parser.add_argument("--split", default="train")
    parser.add_argument("--against", default="e8eb196", help="git ref of the reader to compare with")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()

    infos = read_manifest(args.packed).split(args.split).shards
    shards = [(args.packed / s.name, s.samples) for s in infos]
    for path, _ in shards:  # into the page cache
        path.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        old = old_reader(args.against, Path(tmp))
        rows = {
            "whole shards": (runs(old, shards, False), runs(new_reader, shards, False)),
            "second halves": (runs(old, shards, True), runs(new_reader, shards, True)),
            "headers only": (old_headers(old, shards), new_headers(shards)),
        }
        times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in rows}
        for name, (a, b) in rows.items():
            assert a() == b(), f"{name}: the two readers disagree on the count"
        for _ in range(args.rounds):
            for name, pair in rows.items():
                for fn, out in zip(pair, times[name], strict=True):
                    start = time.perf_counter()
                    fn()
                    out.append(time.perf_counter() - start)
    samples = sum(n for _, n in shards)
    size = sum(p.stat().st_size for p, _ in shards)
    print(
        f"tar_reader: {len(shards)} shards, {samples:,} samples, {size / 1e6:.1f} MB ({args.split} of "
        f"{args.packed}); {args.rounds} rounds alternated, best and median of each"
    )
    print(
        f"{'':16} {args.against + ' best':>14} {'this best':>12} {'new/old':>8}   "
        f"{'old median':>11} {'new median':>11}"
    )
    for name, (old_t, new_t) in times.items():
        print(
            f"{name:16} {min(old_t) * 1e3:11.1f} ms {min(new_t) * 1e3:9.1f} ms "
            f"{min(new_t) / min(old_t):7.2f}x"
            f"   {statistics.median(old_t) * 1e3:8.1f} ms {statistics.median(new_t) * 1e3:8.1f} ms"
            f"   ({min(new_t) / samples * 1e6:.1f} us/sample new)"
        )


if __name__ == "__main__":
    sys.exit(main())
