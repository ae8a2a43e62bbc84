#!/usr/bin/env python3
"""The loader's shape, counted the same way on any version of the repository (issue 32).

Run by hand, on the imgshards that ``PYTHONPATH`` (or ``--ref``) gives::

    PYTHONPATH=.site python bench/shape.py             # this checkout (.site links its folders)
    python bench/shape.py --ref 255c059                # a git ref, put in a temporary folder

It uses only the standard library, webdataset and imgshards' public API (``converter.pack``,
``converter.make_synthetic_tree``, ``loader.ShardDataset``), so it runs on the old layout and the
new one alike. It prints:

- **loader/ lines**: the newlines of every ``.py`` file under ``loader/`` (``wc -l`` of them all);
  **.py files**: how many; **top-level entries**: ``ls loader | wc -l``, ``__pycache__`` left out.
- **generator frames per sample**: it packs a synthetic tree (4 classes of 60 small JPEGs, one
  shard), iterates ``ShardDataset(dst, batch_size=8)`` in this process (``iter(dataset)``, no
  DataLoader, no workers), lets the first batch go (it fills the shuffle buffer) and watches the
  second with ``sys.setprofile``. At every yield of an imgshards or webdataset generator it walks
  the stack from that frame out to the consumer, and counts the frames whose code is a generator
  (``co_flags & inspect.CO_GENERATOR``) and whose file is in imgshards or webdataset. The figure is
  the largest such count in the batch: the yield of the innermost tar reader (the tar member
  parser, below the sample grouper), when the whole chain from the consumer down to the shard's
  bytes is on the stack. The chain is printed, consumer first. (On 255c059 that is 16: the 14 the
  issue counts, from ``SampleReader`` to the pass's outermost generator, plus the tar member parser
  below it and webdataset's pipeline iterator above it.)
- **modules a sample crosses**: the distinct imgshards and webdataset files (modules) with a frame
  on that deepest stack (generators or not), together with those whose Python functions are entered
  (profile ``call`` events, resumed generators included) while that one batch is made: the sample's
  way out through decoding, augmenting and collating, and whatever the loader calls per batch
  (counters, state). Both parts and the list are printed. Functions in C (torch, PIL) do not count.

``--ref`` puts REF in a temporary folder the way ``bench/loader.py --against`` does (``git archive``,
its folders linked as ``site/imgshards``) and runs this script there with this interpreter.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def layout(loader: Path) -> tuple[int, int, int]:
    """(lines, .py files, top-level entries) of the loader folder."""
    files = [p for p in loader.rglob("*.py") if "__pycache__" not in p.parts]
    lines = sum(p.read_bytes().count(b"\n") for p in files)
    entries = [e for e in os.listdir(loader) if e != "__pycache__"]
    return lines, len(files), len(entries)


class Modules:
    """A frame's file as ``loader/pipeline/runs.py`` or ``webdataset/filters.py``; None if not ours.

    Ours: imgshards' three folders (each a link under ``site/imgshards`` in a checkout, so compared
    by real path) and webdataset.
    """

    def __init__(self, loader: Path) -> None:
        import webdataset

        folders = {loader.parent / folder: f"{folder}/" for folder in ("converter", "loader", "cli")}
        folders[Path(webdataset.__file__).parent] = "webdataset/"
        self.roots = {os.path.realpath(folder) + os.sep: shown for folder, shown in folders.items()}
        self.known: dict[str, str | None] = {}

    def __call__(self, filename: str) -> str | None:
        if filename not in self.known:
            real = os.path.realpath(filename)
            found = [shown + real[len(root) :] for root, shown in self.roots.items() if real.startswith(root)]
            self.known[filename] = found[0] if found else None
        return self.known[filename]


class Watch:
    """The profile hook: modules entered, and the deepest generator chain at a yield."""

    def __init__(self, module_of: Modules) -> None:
        self.module_of = module_of
        self.entered: set[str] = set()
        self.chain: list[tuple[str, str, bool]] = []  # (module, function, is a generator), consumer first
        self.depth = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        module = self.module_of(frame.f_code.co_filename)
        if module is None:
            return
        if event == "call":
            self.entered.add(module)
        elif event == "return" and frame.f_code.co_flags & inspect.CO_GENERATOR and arg is not None:
            chain = list(self.stack(frame))
            depth = sum(generator for _, _, generator in chain)
            if depth > self.depth:
                self.depth, self.chain = depth, chain[::-1]

    def stack(self, frame: FrameType | None) -> Iterator[tuple[str, str, bool]]:
        """Our frames from ``frame`` out to the outermost."""
        while frame is not None:
            if (module := self.module_of(frame.f_code.co_filename)) is not None:
                yield module, frame.f_code.co_name, bool(frame.f_code.co_flags & inspect.CO_GENERATOR)
            frame = frame.f_back


def measure(work: Path, watch: Watch) -> None:
    from imgshards.converter import make_synthetic_tree, pack
    from imgshards.loader import ShardDataset

    tree = make_synthetic_tree(work / "tree", classes=4, per_class=60, size=(48, 40))
    pack(tree, work / "packed")
    batches = iter(ShardDataset(work / "packed", batch_size=8))
    next(batches)  # the first batch fills the shuffle buffer and opens the shard
    sys.setprofile(watch)
    try:
        next(batches)
    finally:
        sys.setprofile(None)


def report() -> None:
    import imgshards.loader

    loader = Path(imgshards.loader.__file__).parent
    lines, files, entries = layout(loader)
    watch = Watch(Modules(loader))
    with tempfile.TemporaryDirectory() as work:
        measure(Path(work), watch)
    on_chain = {module for module, _, _ in watch.chain}
    crossed = on_chain | watch.entered
    print(f"imgshards loader: {os.path.realpath(loader)}")
    print(f"loader/ lines: {lines}")
    print(f"loader/ .py files: {files}")
    print(f"loader/ top-level entries: {entries}")
    print(
        f"modules a sample crosses: {len(crossed)} "
        f"({len(on_chain)} on the deepest stack + {len(crossed - on_chain)} more entered in one batch)"
    )
    print(f"generator frames per sample: {watch.depth}")
    print("deepest stack at a yield, consumer first (* = generator):")
    for module, function, generator in watch.chain:
        print(f"  {'*' if generator else ' '} {module}:{function}")
    print("modules entered in one batch, besides those on the stack:")
    for module in sorted(crossed - on_chain):
        print(f"    {module}")


def run_at(ref: str) -> int:
    """Run this script on git ref ``ref`` (``bench/loader.py``'s ``install_ref``), return its status."""
    spec = importlib.util.spec_from_file_location("bench_loader", REPO / "bench" / "loader.py")
    assert spec and spec.loader
    bench_loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_loader)
    with tempfile.TemporaryDirectory() as where:
        python = bench_loader.install_ref(ref, Path(where))
        return subprocess.run([str(python), __file__]).returncode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref", help="a git ref of this repository to count instead of the imgshards imported")
    args = p.parse_args()
    if args.ref:
        sys.exit(run_at(args.ref))
    report()


if __name__ == "__main__":
    main()
